"""The benchmark scripts run and report what they claim (their figures come from full runs, not here)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO


def run_script(*args: str, cwd: Path) -> str:
    done = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow  # minutes of subprocess training; run with -m slow
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


@pytest.mark.slow  # minutes of subprocess training; run with -m slow
def test_lightning_overhead_benchmark_reports_both_loops(tmp_path):
    out = tmp_path / "overhead.md"
    run_script(str(REPO / "benchmarks" / "lightning_overhead.py"), "--tasks", "vit", "--steps", "4", "--warmup", "1",
               "--repeats", "1", "--out", str(out), cwd=tmp_path)
    assert re.search(r"\| vit \| [\d.]+ \| [\d.]+ \| [+-][\d.]+% \| [+-][\d.]+% \|", out.read_text())


def test_init_parity_benchmark_fits_ours_and_torch_transformer(tmp_path):
    """Two steps of the post-LN encoder-decoder case (torch.nn.Transformer needs no extra package):
    ours, the reference and the two ablations fit the same batch from step 0 on, and the parameter
    counts differ by exactly the final LayerNorm that nn.Transformer adds to each of its post-LN
    stacks (2 x 2 x d_model); an ablation changes the init, not the model."""
    out = tmp_path / "init_parity.md"
    run_script(str(REPO / "benchmarks" / "init_parity.py"), "--cases", "seq2seq_post", "--steps", "2",
               "--threads", "1", "--out", str(out), cwd=tmp_path)
    text = out.read_text()
    rows = {m[0]: m[1:] for m in re.findall(r"^\| (\w+) \| ([\d,]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| "
                                            r"([\d.]+) \| ([+-][\d.]+) \|$", text, flags=re.M)}
    assert set(rows) == {"blockbench_seq2seq", "torch_transformer", "torch_transformer_small_embedding",
                         "blockbench_seq2seq_xavier"}, text
    params = {name: int(row[0].replace(",", "")) for name, row in rows.items()}
    assert params["torch_transformer"] - params["blockbench_seq2seq"] == 2 * 2 * 128
    assert params["torch_transformer_small_embedding"] == params["torch_transformer"]
    assert params["blockbench_seq2seq_xavier"] == params["blockbench_seq2seq"]
    for name, (_, at0, at1, at2, ratio, gap) in rows.items():
        assert float(at2) < float(at0), (name, at0, at2)  # a fit, not a constant
    assert float(rows["blockbench_seq2seq"][4]) == 1.0 and float(rows["blockbench_seq2seq"][5]) == 0.0
    assert re.search(r"\| seq2seq_post \| [\d.]+ \| torch_transformer \| [\d.]+ \| \*\*\d+\.\d\d\*\* \|", text)
    assert "get_cpu_capability()" in text and "python benchmarks/init_parity.py --cases seq2seq_post" in text


def test_init_parity_benchmark_vit_references_match_our_parameter_count(tmp_path):
    """One step of the ViT case: timm's and HF's ViT are built at our shape: the same parameter count
    but for the position row they give the CLS token, which blockbench's does not (d_model = 128)."""
    pytest.importorskip("timm", reason='the reference ViTs need the bench extra: pip install -e ".[bench]"')
    pytest.importorskip("transformers", reason='the reference ViTs need the bench extra: pip install -e ".[bench]"')
    out = tmp_path / "init_parity.md"
    run_script(str(REPO / "benchmarks" / "init_parity.py"), "--cases", "vit", "--steps", "1", "--threads", "1",
               "--out", str(out), cwd=tmp_path)
    counts = dict(re.findall(r"^\| (blockbench_vit|timm_vit|hf_vit) \| ([\d,]+) \|", out.read_text(), flags=re.M))
    counts = {name: int(count.replace(",", "")) for name, count in counts.items()}
    assert set(counts) == {"blockbench_vit", "timm_vit", "hf_vit"}, counts
    assert counts["timm_vit"] == counts["hf_vit"] == counts["blockbench_vit"] + 128, counts
