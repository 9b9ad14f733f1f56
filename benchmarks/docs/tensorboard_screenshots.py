"""Screenshots of TensorBoard on a matrix's runs, and a check that it draws their curves the moment it opens.

    cp -r results/norm_placement /tmp/tbcheck/ && blockbench report /tmp/tbcheck/norm_placement --tensorboard
    python -m benchmarks.docs.tensorboard_screenshots /tmp/tbcheck/norm_placement --out docs/img/tensorboard

It counts the runs of every log folder of the matrix (``tb/<task>``, ``tb_tune/<task>``: at most 40
each, the most TensorBoard ticks by default), then starts ``tensorboard --logdir <matrix>/tb/<task>``
(the first task's folder unless ``--logdir`` names another) on a free port, opens its Time Series,
Scalars, Custom Scalars and HParams dashboards in headless Chromium, saves a PNG of each into
``--out`` and checks, in each page's DOM (shadow roots included), what a reader sees before touching
anything:

* **Time Series**: its first two charts are the ``0_main`` group's (the task's headline metric and
  its loss curve), each drawing a line for every run of the folder;
* **Scalars**: every run's box ticked, the first two charts those of ``0_main``, each drawing every run;
* **Custom Scalars**: every run's box ticked, the first two charts drawing every run, and no chart
  matching no tag ("Matches (0)"), except the training-loss chart of rebuilt runs (a record holds no
  training loss);
* **HParams**: a row named after a run of the folder.

Time Series opens with ``?forceSVG=true`` (its charts drawn as SVG rather than WebGL, which a
headless browser without a GPU may lack, and which the DOM can be checked in) and
``runColorGroup=regex:^([^/]+)/`` (one colour per variant, the run name's part before the first
``/``, as docs/tensorboard.md shows a reader to do). Exits 1 and lists what failed.

Chromium is driven through chromedriver's W3C WebDriver protocol, JSON over HTTP, with the standard
library: a handful of calls do not need selenium and its dependencies pinned in constraints.txt.
Needs Chromium and its driver (Debian: ``apt-get install -y chromium chromium-driver``) and Pillow
(installed with matplotlib), which makes the PNGs palette images a fraction of the size.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image
from tensorboard.backend.event_processing import io_wrapper

from blockbench.store.layout import MAX_RUNS_PER_LOGDIR, TB_DIR, TB_TUNE_DIR
from blockbench.tensorboard.rebuild import REBUILT_MARK

#: Chromium's flags: headless, no sandbox (root in a container), no GPU, and nothing that reaches out
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--window-size=1400,1000",
)
#: the dashboards, in the order they are shot: file name, the page's address after the host
VIEWS = {
    "time_series": "?forceSVG=true&runColorGroup=" + urllib.parse.quote("regex:^([^/]+)/", safe="") + "#timeseries",
    "scalars": "#scalars",
    "custom_scalars": "#custom_scalars",
    "hparams": "#hparams",
}
#: the chart of the training loss, which no rebuilt run has (a record holds no training loss)
TRAINING_LOSS_CHART = "train/loss"

#: what each page shows, read from its DOM (TensorBoard's Polymer dashboards keep theirs in shadow roots)
PAGE_STATE = """
const view = arguments[0];
function deep(root) {
  const out = [];
  const walk = (r) => {
    for (const el of r.querySelectorAll('*')) { out.push(el); if (el.shadowRoot) walk(el.shadowRoot); }
  };
  if (root.shadowRoot) walk(root.shadowRoot);
  walk(root);
  return out;
}
const drawn = (el) => deep(el).filter(p => p.tagName === 'path' && (p.getAttribute('d') || '').includes('L')
  && (el.tagName === 'SCALAR-CARD' || p.getAttribute('class') === 'line')).length;
const boxes = (dash) => deep(dash).filter(el => el.tagName === 'TF-MULTI-CHECKBOX')
  .flatMap(m => deep(m).filter(e => e.tagName === 'PAPER-CHECKBOX'));
if (view === 'time_series') {
  const cards = [...document.querySelectorAll('scalar-card')];
  return {charts: cards.map(c => ({title: ((c.querySelector('tb-truncated-path') || {}).textContent || '').trim(),
                                   lines: drawn(c)}))};
}
const tagName = {scalars: 'TF-SCALAR-DASHBOARD', custom_scalars: 'TF-CUSTOM-SCALAR-DASHBOARD',
                 hparams: 'TF-HPARAMS-TABLE-VIEW'}[view];
const dash = deep(document).find(el => el.tagName === tagName);
if (!dash) return {charts: []};
if (view === 'hparams') {
  return {charts: [], texts: deep(dash).filter(el => el.children.length === 0 && el.tagName !== 'STYLE')
                                      .map(el => el.textContent.trim())
                                      .filter(text => text)};
}
const cardTag = view === 'scalars' ? 'TF-SCALAR-CARD' : 'TF-CUSTOM-SCALAR-MULTI-LINE-CHART-CARD';
const cards = deep(dash).filter(el => el.tagName === cardTag);
const ticks = boxes(dash);
return {
  boxes: ticks.length, ticked: ticks.filter(b => b.checked).length,
  charts: cards.map(c => {
    const matches = deep(c).find(e => e.children.length === 0 && /Matches \\(\\d+\\)/.test(e.textContent));
    return {title: view === 'scalars' ? c.tag : c.title, lines: drawn(c),
            matches: matches ? Number(/\\d+/.exec(matches.textContent)[0]) : null};
  }),
};
"""


@dataclass
class Shot:
    """One dashboard: where its screenshot went and what its DOM showed."""

    view: str
    path: Path
    state: dict[str, Any]
    problems: list[str] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def runs_of(logdir: Path) -> list[str]:
    """The runs TensorBoard lists for ``logdir``: every folder under it holding an event file."""
    return sorted(Path(run).relative_to(logdir).as_posix() for run in io_wrapper.GetLogdirSubdirectories(str(logdir)))


def http_json(method: str, url: str, body: dict[str, Any] | None = None, timeout: float = 120) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def wait_for(what: str, probe, timeout: float) -> Any:
    """Call ``probe`` until it returns something true (an error counts as not yet), at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError, ValueError, urllib.error.URLError):
            if value := probe():
                return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not ready after {timeout:.0f} s")
        time.sleep(0.5)


@contextlib.contextmanager
def process(command: list[str]) -> Iterator[subprocess.Popen]:
    """``command`` running in the background for the block, ended after it."""
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextlib.contextmanager
def tensorboard(logdir: Path, runs: int) -> Iterator[str]:
    """A TensorBoard on ``logdir`` at a free port, once it lists the folder's ``runs``; yields its address."""
    port = free_port()
    command = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--port", str(port)]
    with process([*command, "--host", "127.0.0.1", "--load_fast", "false"]):
        url = f"http://127.0.0.1:{port}/"
        wait_for("tensorboard", lambda: len(http_json("GET", url + "data/runs", timeout=5)) >= runs, 180)
        yield url


class Browser:
    """Headless Chromium through chromedriver's WebDriver protocol (``/session``, ``/url``,
    ``/execute/sync``, ``/screenshot``)."""

    def __init__(self, driver_url: str, chromium: str, profile: Path):
        wait_for("chromedriver", lambda: http_json("GET", driver_url + "/status", timeout=5)["value"]["ready"], 60)
        options = {"binary": chromium, "args": [*CHROMIUM_FLAGS, f"--user-data-dir={profile}"]}
        capabilities = {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": options}}
        session = http_json("POST", driver_url + "/session", {"capabilities": capabilities})["value"]
        self.url = f"{driver_url}/session/{session['sessionId']}"

    def open(self, url: str) -> None:
        http_json("POST", self.url + "/url", {"url": url})

    def run(self, script: str, *args: Any) -> Any:
        return http_json("POST", self.url + "/execute/sync", {"script": script, "args": list(args)})["value"]

    def screenshot(self) -> bytes:
        return base64.b64decode(http_json("GET", self.url + "/screenshot")["value"])

    def close(self) -> None:
        with contextlib.suppress(OSError, urllib.error.URLError):
            http_json("DELETE", self.url)


def settled(browser: Browser, view: str, runs: list[str]) -> dict[str, Any] | None:
    """The page's state once its first two charts draw every run (HParams: once it lists a run), else None."""
    state = browser.run(PAGE_STATE, view)
    if view == "hparams":
        return state if set(runs) & set(state.get("texts", [])) else None
    charts = state["charts"][:2]
    return state if len(charts) == 2 and all(chart["lines"] >= len(runs) for chart in charts) else None


def check(view: str, state: dict[str, Any], runs: list[str], rebuilt: bool) -> list[str]:
    """What the page shows that a reader should not have to fix: see the module docstring."""
    problems = []
    charts = state.get("charts", [])
    if view in ("scalars", "custom_scalars") and not state["boxes"] == state["ticked"] == len(runs):
        problems.append(f"{state['ticked']} of {state['boxes']} run boxes ticked, {len(runs)} runs")
    if view in ("time_series", "scalars"):
        titles = [chart["title"] for chart in charts[:2]]
        if len(titles) < 2 or not all(title.startswith("0_main/") for title in titles):
            problems.append(f"the first charts are {titles}, not the 0_main group's")
    if view != "hparams":
        short = [chart["title"] for chart in charts[:2] if chart["lines"] < len(runs)]
        if len(charts) < 2 or short:
            problems.append(f"fewer lines than runs in {short or 'the first two charts'}")
    if view == "custom_scalars":
        empty = [chart["title"] for chart in charts if chart["matches"] == 0]
        allowed = [TRAINING_LOSS_CHART] if rebuilt else []
        if [title for title in empty if title not in allowed]:
            problems.append(f"charts matching no tag (Matches (0)): {empty}")
    if view == "hparams" and not set(runs) & set(state.get("texts", [])):
        problems.append("no row named after a run")
    return problems


def small_png(png: bytes) -> Image.Image:
    """The screenshot as a palette image (256 colours): a UI's flat colours survive, at a third the size."""
    return Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=256, dither=Image.Dither.NONE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("matrix_dir", type=Path, help="a matrix folder with its runs (blockbench report --tensorboard)")
    parser.add_argument("--logdir", help="the log folder to open, in the matrix folder (default: tb/<first task>)")
    parser.add_argument("--out", type=Path, default=Path("docs/img/tensorboard"), help="where the PNGs go")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    parser.add_argument("--chromedriver", default=shutil.which("chromedriver") or "/usr/bin/chromedriver")
    parser.add_argument("--timeout", type=float, default=120, help="seconds to wait for a page to draw")
    args = parser.parse_args(argv)

    matrix_dir = args.matrix_dir
    folders = sorted(path for root in (TB_DIR, TB_TUNE_DIR) for path in (matrix_dir / root).glob("*/") if runs_of(path))
    if not folders:
        print(f"{matrix_dir}: no runs; write them with: blockbench report {matrix_dir} --tensorboard", file=sys.stderr)
        return 1
    problems = []
    for folder in folders:
        count = len(runs_of(folder))
        print(f"{folder.relative_to(matrix_dir)}: {count} runs")
        if count > MAX_RUNS_PER_LOGDIR:
            problems.append(f"{folder}: {count} runs, more than TensorBoard ticks by default ({MAX_RUNS_PER_LOGDIR})")
    logdir = matrix_dir / args.logdir if args.logdir else next(f for f in folders if f.parent.name == TB_DIR)
    runs = runs_of(logdir)
    rebuilt = all(REBUILT_MARK in event.name for event in logdir.rglob("*tfevents*"))
    args.out.mkdir(parents=True, exist_ok=True)
    shots = []
    driver_port = free_port()
    with (
        tempfile.TemporaryDirectory() as profile,
        tensorboard(logdir, len(runs)) as url,
        process([args.chromedriver, f"--port={driver_port}"]),
    ):
        browser = Browser(f"http://127.0.0.1:{driver_port}", args.chromium, Path(profile))
        try:
            for view, address in VIEWS.items():
                browser.open(url + address)
                try:
                    state = wait_for(view, lambda view=view: settled(browser, view, runs), args.timeout)
                except TimeoutError as error:
                    state = browser.run(PAGE_STATE, view) | {"timeout": str(error)}
                time.sleep(1.0)  # the charts' transitions
                path = args.out / f"{view}.png"
                small_png(browser.screenshot()).save(path, optimize=True)
                shots.append(Shot(view, path, state, check(view, state, runs, rebuilt)))
        finally:
            browser.close()
    print(f"TensorBoard on {logdir} ({len(runs)} runs{', rebuilt from the records' if rebuilt else ''}):")
    for shot in shots:
        titles = [chart["title"] for chart in shot.state.get("charts", [])[:3]]
        verdict = "; ".join(shot.problems) or "ok"
        print(f"  {shot.view}: {shot.path} ({shot.path.stat().st_size / 1e3:.0f} kB), first charts {titles}: {verdict}")
        problems += [f"{shot.view}: {problem}" for problem in shot.problems]
    for problem in problems:
        print(f"FAILED {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
