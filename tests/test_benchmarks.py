"""The benchmark scripts run and report what they claim (their figures come from full runs, not here)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_script(*args: str, cwd: Path) -> str:
    done = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_throughput_benchmark_times_ours_against_a_reference(tmp_path):
    """One short round of the encoder-decoder shape (torch.nn.Transformer needs no extra package):
    both implementations count the same model FLOPs (their configurations match), and the report
    has the ratio row and the raw JSON."""
    out = tmp_path / "throughput.md"
    run_script(str(REPO / "benchmarks" / "throughput.py"), "--shapes", "seq2seq", "--dtypes", "fp32", "--rounds", "1",
               "--warmup", "0", "--min-steps", "1", "--max-steps", "1", "--min-seconds", "0", "--peak-tflops", "1",
               "--out", str(out), cwd=tmp_path)
    records = {r["impl"]: r for r in json.loads(out.with_suffix(".json").read_text())}
    assert set(records) == {"blockbench_seq2seq", "torch_transformer"}
    assert records["blockbench_seq2seq"]["flops_per_step"] == records["torch_transformer"]["flops_per_step"] > 0
    assert re.search(r"\| seq2seq \| fp32 \| \d+ \| torch_transformer \| \d+ \| \*\*\d+\.\d\d\*\* \|", out.read_text())


def test_lightning_overhead_benchmark_reports_both_loops(tmp_path):
    out = tmp_path / "overhead.md"
    run_script(str(REPO / "benchmarks" / "lightning_overhead.py"), "--tasks", "vit", "--steps", "4", "--warmup", "1",
               "--repeats", "1", "--out", str(out), cwd=tmp_path)
    assert re.search(r"\| vit \| [\d.]+ \| [\d.]+ \| [+-][\d.]+% \| [+-][\d.]+% \|", out.read_text())
