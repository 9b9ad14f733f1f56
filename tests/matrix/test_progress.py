"""What a training cell prints: optimizer steps toward max_steps, the loss and the headline
metric, as a redrawn bar on a terminal and as plain lines elsewhere; none of Lightning's notices."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import yaml
from helpers import TINY_LM, blockbench

from blockbench.durations import PLAIN_LINE, format_duration, pace_of_lines, parse_duration

#: six steps, validated at 3 and 6: more steps than one epoch of the tiny LM's data would matter for
#: Lightning's own bar (it counts the epoch's batches), not for this one
CELL = {
    **TINY_LM,
    "trainer": {
        **TINY_LM["trainer"],
        "max_steps": 6,
        "val_every_n_steps": 3,
        "num_threads": 1,
        "checkpoint_every_n_steps": 2,
    },
}

#: what Lightning prints by default and a blockbench cell must not
NOISE = (
    "GPU available",
    "TPU available",
    "litlogger",
    "litmodels",
    "Epoch 0",
    "LeafSpec",
    "max_steps=6` reached",
    "weights_only",
)  # the last: Lightning's notice at each checkpoint


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "cell.yaml"
    path.write_text(yaml.safe_dump(CELL))
    return path


def test_output_that_is_not_a_terminal_gets_one_plain_line_every_n_steps_and_no_lightning_notices(tmp_path):
    done = blockbench(
        "train",
        str(_config(tmp_path)),
        "--out",
        str(tmp_path / "cell"),
        "--tb-dir",
        str(tmp_path / "tb"),
        "--progress-every",
        "2",
        "--quiet",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    steps = [int(m.group(1)) for m in (re.match(r"step (\d+)/6 \(\d+%\)  loss \d", line) for line in lines) if m]
    assert steps == [2, 4, 6], done.stdout  # every 2 steps; the last one after its validation
    assert all(re.match(r"step \d+/6 ", line) for line in lines), f"unexpected output:\n{done.stdout}"
    assert "\r" not in done.stdout
    # the last line carries the final validation's value (the one result.json records)
    final = yaml.safe_load((tmp_path / "cell" / "result.json").read_text())["metrics"]["perplexity"]
    assert f"val/perplexity {final:.4g}" in lines[-1]
    assert "val/perplexity" not in lines[0]  # nothing validated before step 3
    assert [int(PLAIN_LINE.match(line)[1]) for line in lines] == [2, 4, 6]  # as the runner's ETA reads them back
    for noise in NOISE:
        assert noise not in done.stdout + done.stderr, f"{noise!r} in the output:\n{done.stdout}\n{done.stderr}"


def test_a_terminal_gets_a_bar_counted_in_optimizer_steps_with_loss_and_headline_metric(tmp_path):
    """Run in a pseudo-terminal of 120 columns, as a user's shell would."""
    config = _config(tmp_path)
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "blockbench",
            "train",
            str(config),
            "--out",
            str(tmp_path / "cell"),
            "--tb-dir",
            str(tmp_path / "tb"),
            "--quiet",
        ],
        cwd=tmp_path,
        stdout=follower,
        stderr=follower,
        stdin=subprocess.DEVNULL,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    assert process.wait(timeout=300) == 0
    os.close(leader)
    screen = b"".join(chunks).decode(errors="replace")
    frames = [frame for frame in re.split(r"[\r\n]+", screen) if frame.strip()]
    assert any(re.search(r"\b6/6 \[", frame) for frame in frames), screen  # steps toward max_steps, not epoch batches
    assert all("/6 [" in frame for frame in frames), f"unexpected output:\n{screen}"
    final = yaml.safe_load((tmp_path / "cell" / "result.json").read_text())["metrics"]["perplexity"]
    assert re.search(rf"6/6 .*loss \d.*val/perplexity {re.escape(f'{final:.4g}')}", frames[-1]), frames[-1]
    assert "\r" in screen  # redrawn in place
    for noise in NOISE:
        assert noise not in screen


def test_durations_read_like_a_clock():
    assert [format_duration(s) for s in (0, 59.6, 75, 3600, 3725)] == [
        "0:00:00",
        "0:01:00",
        "0:01:15",
        "1:00:00",
        "1:02:05",
    ]


def test_plain_lines_read_back_as_seconds_per_step():
    """What a running --jobs cell's train.log says of its pace, for the matrix's ETA: from its first
    line to its last, whatever else the lines (or the log) hold."""
    assert [parse_duration(format_duration(s)) for s in (0, 75, 3725)] == [0, 75, 3725]
    lines = [
        "Seed set to 0",
        "step 30/300 (10%)  loss 3.27  0:10 elapsed, ETA 1:28",
        "step 60/300 (20%)  loss 2.384  0:15 elapsed, ETA 0:59",
        "a warning",
        "step 180/300 (60%)  loss 1.245  val/bleu 12.02  0:37 elapsed, ETA 0:25",
    ]
    assert pace_of_lines(lines) == (37 - 10) / (180 - 30)
    resumed = [
        "step 210/300 (70%)  loss 2  0:12 elapsed, ETA 0:36",
        "step 240/300 (80%)  loss 2  2:12 elapsed, ETA 1:28",
    ]
    assert pace_of_lines(resumed) == 120 / 30  # a resumed run's log starts past step 0: the pair still holds
    slow = [
        "step 300/3000 (10%)  loss 2  59:50 elapsed, ETA 8:58:30",
        "step 330/3000 (11%)  loss 2  1:01:50 elapsed, ETA 8:20:25",
    ]
    assert pace_of_lines(slow) == 120 / 30
    assert pace_of_lines(lines[:2]) is None and pace_of_lines([]) is None  # one line: no pace yet
    same_second = [
        "step 1/300 (0%)  loss 5  0:03 elapsed, ETA 15:00",
        "step 2/300 (1%)  loss 5  0:03 elapsed, ETA 7:30",
    ]
    assert pace_of_lines(same_second) is None  # whole seconds: no span to measure, not a pace of 0
