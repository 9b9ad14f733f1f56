"""The benchmark scripts run and report what they claim (their figures come from full runs, not here)."""

from __future__ import annotations

import importlib
import json
import math
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import REPO

from benchmarks import harness

#: a copy of github.com/karpathy/nanoGPT's model.py to test the loader with (never part of the repo)
NANOGPT = Path("/tmp/nanogpt/model.py")


#: each benchmark script's folder (its genre) under benchmarks/
GENRES = {
    "throughput": "speed",
    "mask_cost": "speed",
    "loss_chunks": "speed",
    "profile_step": "speed",
    "lightning_overhead": "speed",
    "jobs": "speed",
    "implementations": "parity",
    "init_parity": "parity",
    "baseline_allocation": "statistics",
    "run_book": "book",
    "verdict_changes": "book",
}


def benchmark_module(name: str):
    """A script of benchmarks/ imported as the module it runs as (``benchmarks.<genre>.<name>``)."""
    return importlib.import_module(f"benchmarks.{GENRES[name]}.{name}")


def parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())  # a tied matrix counts once


def run_script(module: str, *args: str, cwd: Path) -> str:
    """Run a benchmark as ``python -m benchmarks.<genre>.<module>`` from ``cwd``, the repository importable."""
    command = [sys.executable, "-m", f"benchmarks.{GENRES[module]}.{module}", *args]
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600, env=harness.module_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow  # minutes of subprocess training; run with -m slow
def test_throughput_benchmark_times_ours_against_a_reference(tmp_path):
    """One short round of the encoder-decoder shape (torch.nn.Transformer needs no extra package):
    both implementations count the same model FLOPs (their configurations match), the report has
    the ratio row (one round: no interval, and it says so) and the JSON the machine and the runs."""
    out = tmp_path / "throughput.md"
    run_script(
        "throughput",
        "--shapes",
        "seq2seq",
        "--dtypes",
        "fp32",
        "--rounds",
        "1",
        "--warmup",
        "0",
        "--min-steps",
        "1",
        "--max-steps",
        "1",
        "--min-seconds",
        "0",
        "--peak-tflops",
        "1",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    summary = json.loads(out.with_suffix(".json").read_text())
    records = {r["impl"]: r for r in summary["runs"]}
    assert set(records) == {"blockbench_seq2seq", "torch_transformer"}
    assert records["blockbench_seq2seq"]["flops_per_step"] == records["torch_transformer"]["flops_per_step"] > 0
    assert all(r["cpu_capability"] == summary["machine"]["cpu_capability"] for r in records.values())
    assert re.search(
        r"\| seq2seq \| fp32 \| \d+ \| torch_transformer \| \d+ \| \*\*\d+\.\d\d\*\* \| – \| "
        r"no interval \(1 round\) \|",
        out.read_text(),
    )
    assert [(r["reference"], r["rounds"], r["low"]) for r in summary["ratios"]] == [("torch_transformer", 1, None)]


@pytest.mark.slow  # minutes of subprocess training; run with -m slow
def test_lightning_overhead_benchmark_reports_both_loops(tmp_path):
    out = tmp_path / "overhead.md"
    run_script(
        "lightning_overhead",
        "--tasks",
        "vit",
        "--steps",
        "4",
        "--warmup",
        "1",
        "--min-repeats",
        "2",
        "--max-repeats",
        "2",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    # two paired repeats: the overhead, its 95% interval over them, and the verdict against the 2% target
    assert re.search(
        r"\| vit \| [\d.]+ \| [\d.]+ \| [+-][\d.]+% \| [+-][\d.]+% to [+-][\d.]+% \| 2 \| "
        r"(within|above|undecided)",
        out.read_text(),
    )


def test_overhead_verdict_follows_the_interval():
    from benchmarks.harness import Ratio
    from benchmarks.speed.lightning_overhead import overhead_verdict

    assert overhead_verdict(Ratio(1.01, 0.99, 1.019, 5), 0.02) == "within 2%"
    assert overhead_verdict(Ratio(1.05, 1.03, 1.07, 5), 0.02) == "above 2%"
    assert overhead_verdict(Ratio(1.01, 0.98, 1.04, 5), 0.02).startswith("undecided")
    assert overhead_verdict(Ratio(1.01, None, None, 1), 0.02).startswith("no interval")


def test_lightning_overhead_runs_both_loops_on_the_device_lightning_picks(monkeypatch, tmp_path):
    """Where there is a GPU, Lightning's accelerator auto trains on it: the plain loop must go there
    too (it ran on the CPU before), and the Lightning run must be told the same device; --device cpu
    puts both on the CPU. The GPU is faked: only the device each loop is given is checked."""
    import argparse

    import torch

    overhead = benchmark_module("lightning_overhead")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert overhead.loop_device(None) == overhead.loop_device("auto") == cuda
    assert overhead.loop_device("cpu") == cpu
    assert overhead.run_config("vit", 4, cuda).trainer.accelerator == "gpu"
    assert overhead.run_config("vit", 4, cpu).trainer.accelerator == "cpu"
    assert overhead.run_config("vit", 4, cuda).trainer.resolved_precision("gpu") == "bf16-mixed"

    def measured(device: str) -> list[tuple[str, torch.device]]:
        calls = []
        monkeypatch.setattr(
            overhead, "plain_loop", lambda task, steps, warmup, device: calls.append(("plain", device)) or [0.01] * 3
        )
        monkeypatch.setattr(
            overhead,
            "lightning_loop",
            lambda task, steps, warmup, workdir, device: calls.append(("lightning", device)) or [0.011] * 3,
        )
        args = argparse.Namespace(device=device, steps=4, warmup=1, min_repeats=2, max_repeats=2, target_width=0.05)
        overhead.measure_task("vit", args, tmp_path)
        return calls

    assert sorted(measured("auto")) == [("lightning", cuda)] * 2 + [("plain", cuda)] * 2
    assert sorted(measured("cpu")) == [("lightning", cpu)] * 2 + [("plain", cpu)] * 2


def test_lightning_overhead_plain_loop_mirrors_lightnings_precision():
    import torch

    overhead = benchmark_module("lightning_overhead")
    cpu = torch.device("cpu")
    with overhead.precision_context("bf16-mixed", cpu):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    with overhead.precision_context("32-true", cpu):
        assert not torch.is_autocast_enabled("cpu")
    with pytest.raises(ValueError, match="16-mixed"):
        overhead.precision_context("16-mixed", cpu)
    assert overhead.accelerator(torch.device("cuda")) == "gpu" and overhead.accelerator(cpu) == "cpu"


def test_init_parity_benchmark_fits_ours_and_torch_transformer(tmp_path):
    """Two steps of the post-LN encoder-decoder case (torch.nn.Transformer needs no extra package):
    ours, the reference and the two ablations fit the same batch from step 0 on, and the parameter
    counts differ by exactly the final LayerNorm that nn.Transformer adds to each of its post-LN
    stacks (2 x 2 x d_model); an ablation changes the init, not the model."""
    out = tmp_path / "init_parity.md"
    run_script(
        "init_parity",
        "--cases",
        "seq2seq_post",
        "--steps",
        "2",
        "--threads",
        "1",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    text = out.read_text()
    rows = {
        m[0]: m[1:]
        for m in re.findall(
            r"^\| (\w+) \| ([\d,]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| "
            r"([\d.]+) \| ([+-][\d.]+) \|$",
            text,
            flags=re.M,
        )
    }
    assert set(rows) == {
        "blockbench_seq2seq",
        "torch_transformer",
        "torch_transformer_small_embedding",
        "blockbench_seq2seq_xavier",
    }, text
    params = {name: int(row[0].replace(",", "")) for name, row in rows.items()}
    assert params["torch_transformer"] - params["blockbench_seq2seq"] == 2 * 2 * 128
    assert params["torch_transformer_small_embedding"] == params["torch_transformer"]
    assert params["blockbench_seq2seq_xavier"] == params["blockbench_seq2seq"]
    for name, (_, at0, _at1, at2, _ratio, _gap) in rows.items():
        assert float(at2) < float(at0), (name, at0, at2)  # a fit, not a constant
    assert float(rows["blockbench_seq2seq"][4]) == 1.0 and float(rows["blockbench_seq2seq"][5]) == 0.0
    assert re.search(r"\| seq2seq_post \| [\d.]+ \| torch_transformer \| [\d.]+ \| \*\*\d+\.\d\d\*\* \|", text)
    assert "get_cpu_capability()" in text and "python -m benchmarks.parity.init_parity --cases seq2seq_post" in text


def test_init_parity_benchmark_vit_references_match_our_parameter_count(tmp_path):
    """One step of the ViT case: timm's and HF's ViT are built at our shape: the same parameter count
    but for the position row they give the CLS token, which blockbench's does not (d_model = 128)."""
    pytest.importorskip("timm", reason='the reference ViTs need the bench extra: pip install -e ".[bench]"')
    pytest.importorskip("transformers", reason='the reference ViTs need the bench extra: pip install -e ".[bench]"')
    out = tmp_path / "init_parity.md"
    run_script(
        "init_parity",
        "--cases",
        "vit",
        "--steps",
        "1",
        "--threads",
        "1",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    counts = dict(re.findall(r"^\| (blockbench_vit|timm_vit|hf_vit) \| ([\d,]+) \|", out.read_text(), flags=re.M))
    counts = {name: int(count.replace(",", "")) for name, count in counts.items()}
    assert set(counts) == {"blockbench_vit", "timm_vit", "hf_vit"}, counts
    assert counts["timm_vit"] == counts["hf_vit"] == counts["blockbench_vit"] + 128, counts


def test_mask_cost_benchmark_times_every_variant_on_both_paths_with_identical_outputs(tmp_path):
    """The --quick path (a tiny shape, seconds): the identity check passes for every variant (the
    script exits 0 after saying so) and the table has a row per variant and pass, with the ratio,
    its interval over the 2 rounds and a verdict; the header names the command and the CPU."""
    variants = list(benchmark_module("mask_cost").VARIANTS)
    out = tmp_path / "mask_cost.md"
    printed = run_script("mask_cost", "--quick", "--out", str(out), cwd=tmp_path)
    for variant in variants:
        assert f"{variant}: the shared and per-layer paths give identical logits, loss and gradients" in printed
    text = out.read_text()
    rows = re.findall(
        r"^\| (\w+) \| (forward \(no gradients\)|forward \+ backward) \| [\d.]+ \| [\d.]+ \| \*\*[\d.]+\*\* \| "
        r"[\d.]+–[\d.]+ \| (shared faster|shared slower|tie) \|$",
        text,
        flags=re.M,
    )
    assert [(v, p) for v, p, _ in rows] == [
        (v, p) for v in variants for p in ("forward (no gradients)", "forward + backward")
    ], text
    assert "python -m benchmarks.speed.mask_cost --quick" in text and "get_cpu_capability()" in text


def test_mask_cost_per_layer_path_builds_a_mask_in_every_layer_and_the_check_catches_a_difference(monkeypatch):
    """What the two timed paths are: the model's own forward builds one ``AttentionMask``, the
    per-layer path one per layer, with the same bits; a per-layer path that computed anything else
    would stop the run (``check_identical`` is not vacuous)."""
    import contextlib

    import torch

    from blockbench.models import attention

    mask_cost = benchmark_module("mask_cost")
    args = mask_cost.build_parser().parse_args([])
    args.__dict__.update(mask_cost.PROFILES["quick"], layers=3)
    model = mask_cost.build_model("relative", args)
    batch = mask_cost.make_batch(args.batch, args.seq_len, args.vocab, torch.Generator().manual_seed(0))
    assert batch.padding_mask.any() and not batch.padding_mask.all(dim=1).any()

    built = []
    original = attention.AttentionMask.__init__
    monkeypatch.setattr(
        attention.AttentionMask, "__init__", lambda self, *a, **k: built.append(1) or original(self, *a, **k)
    )
    mask_cost.logits(model, batch)
    assert len(built) == 1
    with mask_cost.per_layer(model):
        mask_cost.logits(model, batch)
    assert len(built) == 1 + 3
    assert "forward" not in model.stack.__dict__  # the model's own stack forward is back
    monkeypatch.undo()

    mask_cost.check_identical(model, batch)

    per_layer = mask_cost.per_layer

    @contextlib.contextmanager
    def off_by_a_bit(model):  # the per-layer path with another final norm weight
        weight = model.stack.final_norm.weight
        kept = weight.detach().clone()
        with per_layer(model):
            with torch.no_grad():
                weight.add_(1e-3)
            try:
                yield model
            finally:
                with torch.no_grad():
                    weight.copy_(kept)

    monkeypatch.setattr(mask_cost, "per_layer", off_by_a_bit)
    with pytest.raises(AssertionError, match="logits of the shared and per-layer paths differ"):
        mask_cost.check_identical(model, batch)


# --------------------------------------------------------------------------- nanoGPT and litgpt
def _build(name: str, dims, sources=None):
    import torch

    impl = benchmark_module("implementations").IMPLEMENTATIONS[name]
    torch.manual_seed(0)
    return impl.make(torch, torch.Generator().manual_seed(0), dims, sources)


@pytest.mark.skipif(not NANOGPT.is_file(), reason=f"no copy of nanoGPT's model.py at {NANOGPT}")
@pytest.mark.parametrize("where", ["file", "folder"])
def test_nanogpt_is_imported_from_the_path_given_and_built_at_the_gpt_shape(where):
    """nanoGPT's model.py is loaded from the user's path (the file or its folder), not from the repo;
    at the GPT shape it has exactly blockbench's parameter count, and its loss is what its own
    forward computes from targets: F.cross_entropy on its logits."""
    import torch
    import torch.nn.functional as F

    implementations = benchmark_module("implementations")
    shape = benchmark_module("throughput").SHAPES["lm_gpt"]
    path = NANOGPT if where == "file" else NANOGPT.parent
    module = implementations.load_nanogpt(path)
    assert Path(module.__file__) == NANOGPT.resolve()
    assert _build("nanogpt", shape.dims, {"nanogpt": path}).model.__class__ is module.GPT
    ours = _build("blockbench", shape.dims).model
    theirs = _build("nanogpt", shape.dims, {"nanogpt": path})
    assert parameters(theirs.model) == parameters(ours) == 5_322_240 and theirs.param_difference == 0
    assert theirs.model.config.block_size == shape.dims.seq_len and theirs.model.config.dropout == 0.0

    tiny = implementations.Dims(d_model=32, n_layers=1, n_heads=2, d_ff=128, batch=2, vocab=64, seq_len=8)
    run = _build("nanogpt", tiny, {"nanogpt": path})
    inputs, targets = run.batch
    logits, _ = run.model(inputs, targets)
    torch.testing.assert_close(run.loss(run.model, run.batch), F.cross_entropy(logits.flatten(0, 1), targets.flatten()))


def test_nanogpt_without_a_path_is_not_run_with_a_line_that_says_how(tmp_path):
    implementations = benchmark_module("implementations")
    nanogpt = implementations.IMPLEMENTATIONS["nanogpt"]
    why = nanogpt.unavailable({"nanogpt": None})
    assert why and "--nanogpt PATH" in why and "\n" not in why
    assert implementations.missing_packages([nanogpt]) == []  # skipped, not an error
    with pytest.raises(FileNotFoundError, match="--nanogpt PATH"):
        implementations.load_nanogpt(tmp_path)  # a folder without model.py
    (tmp_path / "model.py").write_text("x = 1\n")
    with pytest.raises(ImportError, match=r"not nanoGPT's model\.py"):
        implementations.load_nanogpt(tmp_path)


def test_litgpt_is_skipped_with_a_line_when_it_is_not_installed():
    """litgpt cannot share constraints.txt's environment (huggingface-hub): a run without it goes on."""
    implementations = benchmark_module("implementations")
    for name in ("litgpt_gpt", "litgpt_llama"):
        litgpt = implementations.IMPLEMENTATIONS[name]
        assert implementations.missing_packages([litgpt]) == []
        why = litgpt.unavailable()
        assert (why is None) == implementations.importable("litgpt")
        assert why is None or "pip install litgpt" in why


def test_litgpt_builders_match_the_gpt_and_llama_shapes():
    """litgpt's GPT at the GPT shape: blockbench's parameters less the learned position table,
    which litgpt has not (RoPE), tied like its pretrain.py ties; at the Llama shape exactly ours.
    The loss is litgpt's chunked_cross_entropy, the mean F.cross_entropy over all tokens."""
    pytest.importorskip("litgpt", reason="litgpt is not installed (no release installs beside constraints.txt)")
    import torch
    import torch.nn.functional as F

    shapes = benchmark_module("throughput").SHAPES
    gpt, llama = shapes["lm_gpt"].dims, shapes["lm_llama"].dims
    litgpt_gpt = _build("litgpt_gpt", gpt)
    assert parameters(litgpt_gpt.model) - parameters(_build("blockbench", gpt).model) == -gpt.seq_len * gpt.d_model
    assert litgpt_gpt.param_difference == -gpt.seq_len * gpt.d_model
    config = litgpt_gpt.model.config
    assert litgpt_gpt.model.transformer.wte.weight is litgpt_gpt.model.lm_head.weight
    assert (
        config.norm_class_name,
        config.mlp_class_name,
        config.bias,
        config.parallel_residual,
        config.intermediate_size,
        config.padded_vocab_size,
    ) == ("LayerNorm", "GptNeoxMLP", True, False, 1024, 8192)
    litgpt_llama = _build("litgpt_llama", llama)
    assert parameters(litgpt_llama.model) == parameters(_build("blockbench_llama", llama).model) == 7_145_728
    config = litgpt_llama.model.config
    assert (config.norm_class_name, config.mlp_class_name, config.bias, config.n_query_groups, config.rope_n_elem) == (
        "RMSNorm",
        "LLaMAMLP",
        False,
        2,
        llama.d_model // llama.n_heads,
    )

    tiny = benchmark_module("implementations").Dims(
        d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=128, batch=2, vocab=512, seq_len=8
    )
    run = _build("litgpt_llama", tiny)
    rows = run.batch[0]
    expected = F.cross_entropy(run.model(rows[:, :-1]).flatten(0, 1), rows[:, 1:].flatten())
    torch.testing.assert_close(run.loss(run.model, run.batch), expected)


# ------------------------------------------------------------------------------------- ratios
def test_ratio_interval_against_a_hand_computed_example_and_the_tie_rule():
    """Three rounds whose ratios (theirs / ours per round) are 1.2, 1.1 and 1.3: logs 0.18232, 0.09531
    and 0.26236, mean 0.18000, sd 0.08355; t(0.975, 2 dof) = 4.3027, half width 4.3027 * 0.08355 /
    sqrt(3) = 0.20755; exp gives the geometric mean 1.1972 = 1.716^(1/3) and the interval
    0.9728-1.4734, which includes 1: a tie. Ratios 1.2, 1.25 and 1.3 (sd 0.04002): 1.1311-1.3799, faster."""
    tie = harness.ratio_interval({0: 100.0, 1: 110.0, 2: 90.0}, {0: 120.0, 1: 121.0, 2: 117.0})
    assert (tie.ratio, tie.low, tie.high) == pytest.approx((1.716 ** (1 / 3), 0.97282, 1.47337), rel=1e-4)
    assert tie.rounds == 3 and tie.verdict == "tie"
    faster = harness.ratio_interval({0: 100.0, 1: 100.0, 2: 100.0}, {0: 120.0, 1: 125.0, 2: 130.0})
    assert (faster.ratio, faster.low, faster.high) == pytest.approx((1.24933, 1.13109, 1.37993), rel=1e-4)
    assert faster.verdict == "faster"
    slower = harness.ratio_interval({0: 120.0, 1: 125.0, 2: 130.0}, {0: 100.0, 1: 100.0, 2: 100.0})
    assert (slower.low, slower.high) == pytest.approx(
        (1 / 1.37993, 1 / 1.13109), rel=1e-4
    ) and slower.verdict == "slower"
    # rounds pair by index: round 3 has no partner; a single round has no interval and no verdict
    paired = harness.ratio_interval({0: 100.0, 1: 100.0, 2: 100.0}, {1: 125.0, 2: 130.0, 3: 500.0})
    assert paired.rounds == 2 and paired.ratio == pytest.approx(math.sqrt(1.25 * 1.3))
    single = harness.ratio_interval({0: 100.0}, {0: 150.0})
    assert (single.ratio, single.low, single.high, single.verdict) == (1.5, None, None, "no interval (1 round)")


def _merged(impl: str, shape: str, round_ms: list[float], parameters: int, difference: int = 0) -> dict:
    median = sorted(round_ms)[len(round_ms) // 2]
    return {
        "impl": impl,
        "shape": shape,
        "dtype": "fp32",
        "device": "cpu",
        "flops_per_step": 1e9,
        "parameters": parameters,
        "items": 4096,
        "note": f"{impl} note",
        "param_difference": difference,
        "param_difference_why": "no learned position table" if difference else "",
        "cpu": "x",
        "cpu_capability": "AVX2",
        "steps": 3 * len(round_ms),
        "step_ms_median": median,
        "step_ms_min": min(round_ms),
        "step_ms_max": max(round_ms),
        "round_medians_ms": round_ms,
        "rounds": list(range(len(round_ms))),
        "throughput": 4096 / median * 1e3,
        "achieved_tflops": 1e9 / median / 1e9,
        "peak_tflops": 1.0,
    }


def test_report_calls_a_ratio_whose_interval_includes_one_a_tie_and_checks_parameter_counts():
    """The report's table from merged runs: the fastest reference (the lowest median) with the
    interval of the hand-computed example above and "tie", never "faster"; a reference whose
    parameter count differs from ours by more than its builder explains is flagged."""
    throughput = benchmark_module("throughput")
    results = [
        _merged("blockbench", "lm_gpt", [100.0, 110.0, 90.0], 5_322_240),
        _merged("nanogpt", "lm_gpt", [120.0, 121.0, 117.0], 5_322_240),
        _merged("hf_gpt2", "lm_gpt", [140.0, 150.0, 130.0], 5_322_241),
        _merged("litgpt_gpt", "lm_gpt", [150.0, 150.0, 150.0], 5_256_704, difference=-65_536),
    ]
    args = throughput.build_parser().parse_args(["--rounds", "3"])
    machine = {
        "device": "cpu",
        "gpu": None,
        "cpu": "AMD EPYC",
        "cpu_capability": "AVX2",
        "native_bf16": False,
        "logical_cpus": 2,
        "torch_threads": 2,
        "torch": "2.14.1",
        "python": "3.11",
        "packages": "x",
    }
    text = throughput.report(results, [], args, "cmd", machine, ["bf16 skipped: this CPU (AVX2) has no native bf16"])
    assert "| lm_gpt | fp32 | 100 | nanogpt | 120 | **1.20** | 0.97–1.47 | tie |" in text
    assert "faster" not in text.split("## Ours / every reference")[0]
    assert (
        "| lm_gpt | fp32 | litgpt_gpt | 150 | 1.51 | 1.17–1.93 | faster | -65,536 (no learned position table) |" in text
    )
    assert "| lm_gpt | fp32 | nanogpt | 120 | 1.20 | 0.97–1.47 | tie | same |" in text
    assert "| hf_gpt2 | 140 | 1.40 | 1.31–1.51 | faster | **+1, expected +0**: the shapes do not match |" in text
    assert "`torch.backends.cpu.get_cpu_capability()` = AVX2" in text and "CPU AMD EPYC" in text
    assert "- bf16 skipped: this CPU (AVX2) has no native bf16" in text


# ------------------------------------------------------------------------------------- bf16
def _no_probe():
    raise AssertionError("the capability and CPU flags decide: no probe")


def test_bf16_is_skipped_with_a_note_where_the_cpu_has_no_native_bf16():
    throughput = benchmark_module("throughput")
    note = throughput.bf16_skip_note("AVX2", None, _no_probe)
    assert note.startswith("bf16 skipped:") and "AVX2" in note and "emulated" in note and "\n" not in note
    assert throughput.bf16_skip_note("NO AVX", None, _no_probe)
    # "AVX512" says nothing about BF16: the CPU flags (AVX512-BF16 or AMX) decide
    assert throughput.bf16_skip_note("AVX512", True, _no_probe) is None
    assert "neither AVX512-BF16 nor AMX" in throughput.bf16_skip_note("AVX512", False, _no_probe)
    # no flags (another architecture): a bf16 matmul timed against fp32
    assert throughput.bf16_skip_note("SVE256", None, lambda: 0.6) is None
    assert "12.5x" in benchmark_module("throughput").bf16_skip_note("DEFAULT", None, lambda: 12.5)


def test_the_real_probe_and_flags_agree_with_this_cpus_capability():
    """On x86 the flags are known; a CPU whose capability is AVX2 has neither AVX512-BF16 nor AMX,
    and its bf16 matmul is measurably slower than fp32 (emulated)."""
    import platform

    import torch

    throughput = benchmark_module("throughput")
    native = harness.native_bf16_instructions()
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert native is not None
    if torch.backends.cpu.get_cpu_capability() in throughput.NO_NATIVE_BF16:
        assert native is False
        assert throughput.bf16_matmul_slowdown(size=128) > throughput.EMULATED_BF16_SLOWDOWN


def test_a_cpu_without_native_bf16_skips_bf16_in_the_output_report_and_json(tmp_path, capsys):
    """Only bf16 asked for on such a CPU: nothing is timed; the note is printed, in the report and
    in the JSON, which records the CPU model and capability."""
    import torch

    throughput = benchmark_module("throughput")
    capability = torch.backends.cpu.get_cpu_capability()
    if (
        throughput.bf16_skip_note(capability, harness.native_bf16_instructions(), throughput.bf16_matmul_slowdown)
        is None
    ):
        pytest.skip("this CPU has native bf16: bf16 would run")
    out = tmp_path / "throughput.md"
    throughput.main(["--shapes", "seq2seq", "--dtypes", "bf16", "--rounds", "1", "--device", "cpu", "--out", str(out)])
    printed = capsys.readouterr().out
    note = next(line for line in printed.splitlines() if line.startswith("bf16 skipped:"))
    assert "round 1/1" not in printed  # no run started
    assert f"- {note}" in out.read_text()
    summary = json.loads(out.with_suffix(".json").read_text())
    assert note in summary["not_run"] and summary["runs"] == []
    assert summary["machine"]["cpu_capability"] == capability and summary["machine"]["cpu"]


def test_profile_step_names_a_missing_reference_package_before_it_profiles(monkeypatch, tmp_path):
    """Without the bench extra, profile_step says what to install, as throughput does, instead of
    a traceback after it has profiled our side."""
    implementations, profile_step = benchmark_module("implementations"), benchmark_module("profile_step")
    monkeypatch.setattr(implementations, "importable", lambda module: module != "timm")
    profiled = []
    monkeypatch.setattr(profile_step, "profile", lambda *args: profiled.append(args))
    with pytest.raises(SystemExit) as exited:
        profile_step.main(["--shapes", "vit", "--out", str(tmp_path / "profile.md")])
    assert str(exited.value) == 'the reference implementations need timm: pip install -e ".[bench]"'
    assert profiled == [] and not (tmp_path / "profile.md").exists()


@pytest.mark.slow  # about a minute: two profiled steps of the ViT shape and of timm's
def test_profile_step_tables_the_top_operators_of_ours_and_the_reference(tmp_path):
    """The profile of one step per implementation: the matmuls lead, each table's shares are a part
    of the step (they sum to at most 100%), and the header names the command and the CPU capability."""
    pytest.importorskip("timm", reason='the reference ViT needs the bench extra: pip install -e ".[bench]"')
    out = tmp_path / "profile.md"
    run_script(
        "profile_step",
        "--shapes",
        "vit",
        "--steps",
        "1",
        "--warmup",
        "1",
        "--threads",
        "1",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    text = out.read_text()
    tables = re.split(r"^\*\*(\w+)\*\*", text, flags=re.M)[1:]
    assert tables[0::2] == ["blockbench_vit", "timm_vit", "Bound"], text
    # Amdahl: the reference's operator time over our matrix products alone, at least today's ratio
    bound, reference_ms, ours_matmul_ms, ratio = re.search(
        r"by at most \*\*([\d.]+)x\*\*.*\((\d+) ms of timm_vit's operator time / (\d+) ms of our matrix products "
        r"and attention\); today's profiled ratio is ([\d.]+)x",
        text,
    ).groups()
    assert float(bound) == pytest.approx(float(reference_ms) / float(ours_matmul_ms), abs=0.02)
    assert float(bound) >= float(ratio)
    tables = tables[:4]
    for body in tables[1::2]:
        rows = re.findall(r"^\| `([\w:]+)` \| ([\d.]+) \| ([\d.]+)% \| (\d+) \|$", body, flags=re.M)
        assert len(rows) == 12 and rows[0][0] in ("aten::mm", "aten::addmm"), body
        assert sum(float(share) for _, _, share, _ in rows) <= 100.0 + 0.1 * len(rows)
        assert [float(ms) for _, ms, _, _ in rows] == sorted((float(ms) for _, ms, _, _ in rows), reverse=True)
    assert "python -m benchmarks.speed.profile_step --shapes vit" in text and "get_cpu_capability()" in text


@pytest.mark.slow  # spawns four training processes; run with -m slow
def test_jobs_benchmark_compares_one_cell_on_every_core_with_one_cell_per_core(tmp_path):
    out = tmp_path / "jobs.md"
    run_script(
        "jobs",
        "--tasks",
        "vit",
        "--cores",
        "2",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--rounds",
        "2",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    row = re.search(
        r"^\| vit \| (\d+) \| (\d+) \| \*\*([\d.]+)\*\* \| ([\d.]+) to ([\d.]+) \| (.+) \|$", out.read_text(), re.M
    )
    assert row, out.read_text()
    _lone, _shared, ratio, low, high = (float(x) for x in row.groups()[:5])
    assert low <= ratio <= high and row.group(6) in ("2 cells at once", "one cell at a time", "tie")


def test_the_book_runs_the_flagship_first_and_leaves_out_the_gpu_matrix_and_the_demonstration():
    """run_book's order: the flagship first (the matrices after it copy its shared cells), every design
    matrix once, the empirical null and the real-data matrix last; not the GPU-sized one, smoke, the
    scale ladders or the flagship ladder's shape check (runs of their own)."""
    order = [path.stem for path in benchmark_module("run_book").book_order()]
    design = sorted(p.stem for p in (REPO / "configs" / "matrix").glob("*.yaml"))
    assert order[0] == "prenorm_vs_postnorm" and order[-2:] == ["null_comparison", "prenorm_vs_postnorm_real_cpu"]
    ladders = {name for name in design if name.endswith("_ladder")}
    assert {"prenorm_vs_postnorm_ladder", "dense_vs_moe_ladder", "sandwich_norm_ladder"} <= ladders
    left_out = {"prenorm_vs_postnorm_real", "smoke", "prenorm_vs_postnorm_shape", *ladders}
    assert sorted(order) == sorted(set(design) - left_out)


def test_the_book_runs_each_matrix_by_its_path_in_the_checkout_and_logs_its_estimate_and_time(tmp_path, monkeypatch):
    """Each matrix runs as ``blockbench matrix configs/matrix/<name>.yaml`` (the command its summary then
    names, which anyone can rerun from a clone, not this machine's absolute path), after its dry run,
    and book_run.jsonl keeps the estimate, the trained count and the wall time."""
    module = benchmark_module("run_book")
    calls = []

    def fake(args, **kwargs):
        calls.append(list(args))
        return subprocess.CompletedProcess(
            args, 0, stdout="about 0:01:00 on this machine to train 3 cells\n", stderr=""
        )

    monkeypatch.setattr(module, "book_order", lambda: [REPO / "configs" / "matrix" / "smoke.yaml"])
    monkeypatch.setattr(module.subprocess, "run", fake)
    assert module.main(["--results-dir", str(tmp_path / "book")]) == 0
    dry, run = calls
    assert dry[-5:] == ["matrix", "configs/matrix/smoke.yaml", "--jobs", "2", "--dry-run"]
    assert run[1:] == [
        "-m",
        "blockbench",
        "--results-dir",
        str(tmp_path / "book"),
        "matrix",
        "configs/matrix/smoke.yaml",
        "--jobs",
        "2",
    ]
    [logged] = [json.loads(line) for line in (tmp_path / "book" / "book_run.jsonl").read_text().splitlines()]
    assert logged["matrix"] == "smoke" and logged["to_train"] == 3 and logged["returncode"] == 0


@pytest.mark.slow  # the smoke matrix trained in a subprocess (about a minute); run with -m slow
def test_publishing_copies_the_matrices_that_ran_to_their_end_without_what_git_leaves_out(tmp_path, monkeypatch):
    """--publish: a matrix whose last book run ended (exit 0) is copied into the results folder, replacing
    the old one, without event files, logs or locks, and its summary and the index are rebuilt; one whose
    last run was killed (143) is left where it is."""
    module = benchmark_module("run_book")
    root, target = tmp_path / "book", tmp_path / "results"
    shutil.copytree(REPO / "results" / "smoke", root / "smoke")
    shutil.copytree(REPO / "results" / "smoke", root / "norm_type")
    cell = next((root / "smoke" / "cells").glob("*/*/seed0"))
    (cell / "train.log").write_text("log")
    (cell / ".lock").write_text("123")
    (root / "smoke" / "tb").mkdir()
    (target / "smoke" / "cells").mkdir(parents=True)
    (target / "smoke" / "old.txt").write_text("from the earlier book")
    lines = [{"matrix": "smoke", "returncode": 143}, {"matrix": "norm_type", "returncode": 143}]
    lines.append({"matrix": "smoke", "returncode": 0})  # the last run of smoke ran to its end
    (root / "book_run.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    matrices = REPO / "configs" / "matrix"
    monkeypatch.setattr(module, "book_order", lambda: [matrices / "smoke.yaml", matrices / "norm_type.yaml"])
    assert module.publish(root, target) == ["smoke"]
    published = target / "smoke"
    assert not (published / "old.txt").exists() and not (published / "tb").exists()
    assert not list(published.rglob("train.log")) and not list(published.rglob(".lock"))
    assert len(list(published.rglob("result.json"))) == len(list((REPO / "results" / "smoke").rglob("result.json")))
    assert (published / "summary.md").read_text().startswith("# smoke")
    assert "smoke" in (target / "README.md").read_text() and not (target / "norm_type").exists()
    assert f"`blockbench report --index {target}`" in (target / "README.md").read_text()  # outside the checkout
    # the book ran smoke again and reused every cell: the published folder keeps the run that trained them
    run = json.loads((published / "matrix_run.json").read_text())
    (root / "smoke" / "matrix_run.json").write_text(json.dumps({**run, "cells_trained": 0, "wall_time_s": 5.0}))
    assert module.publish(root, target) == []
    assert json.loads((published / "matrix_run.json").read_text()) == run
    record = next(published.rglob("result.json"))
    record.write_text(record.read_text().replace('"ok"', '"ok" ', 1))  # a record differs: published again
    assert module.publish(root, target) == ["smoke"]
    assert json.loads((published / "matrix_run.json").read_text())["cells_trained"] == 0


def _csv(rows: list[dict[str, str]]) -> str:
    columns = list(dict.fromkeys(key for row in rows for key in row))
    lines = [",".join(columns)] + [",".join(f'"{row.get(c, "")}"' for c in columns) for row in rows]
    return "\n".join(lines) + "\n"


def test_verdict_changes_reads_each_question_three_ways_and_says_what_changed_it():
    """benchmarks/book/verdict_changes.py: the earlier book's verdict (Holm: significant -> its direction, no
    test -> untested, else n.s.), the same cells under the new rule, and the rerun, matched per matrix x
    task x variant x budget (the earlier ``,max_steps=300`` label is the rerun's plain variant at 300
    steps; its 1,500-step question is dropped); the cause is the rule where the same cells' verdict
    moved, the cells where the rerun's did; a matrix whose means are unchanged is not rerun yet."""
    module = benchmark_module("verdict_changes")
    base = {"task": "lm", "metric": "perplexity", "baseline_variant": "ffn=mlp", "direction": "worse"}

    def old(variant, steps, significant, p="0.01", mean="7.4"):
        row = {**base, "variant": f"{variant},max_steps={steps}", "steps": steps, "mean": mean}
        row["baseline_variant"] = f"ffn=mlp,max_steps={steps}"
        return {**row, "significant": significant, "diff_p_holm": p, "diff_vs_baseline": "0.1", "seeds": "3"}

    def new(variant, steps, verdict, mean="7.4", label=True, seeds="3"):
        row = {**base, "variant": f"{variant},max_steps={steps}" if label else variant, "steps": steps, "mean": mean}
        row["baseline_variant"] = f"ffn=mlp,max_steps={steps}" if label else "ffn=mlp"
        return {**row, "verdict": verdict, "decision_difference": "0.1", "decision_seeds": seeds, "seeds": "9"}

    earlier = {
        "ffn_type": _csv([old("ffn=swiglu", "300", "False"), old("ffn=swiglu", "1500", "False", p="")]),
        "norm_type": _csv([old("norm=rms", "300", "True")]),
    }
    redecided = {
        "ffn_type": _csv([new("ffn=swiglu", "300", "worse"), new("ffn=swiglu", "1500", "saturated")]),
        "norm_type": _csv([new("norm=rms", "300", "worse")]),
    }
    rerun = {
        "ffn_type": _csv([new("ffn=swiglu", "300", "equivalent", mean="7.2", label=False, seeds="6")]),
        "norm_type": redecided["norm_type"],
    }
    changes = {(c.question.matrix, c.question.steps): c for c in module.compare(earlier, redecided, rerun)}
    swiglu, saturated, rms = changes["ffn_type", "300"], changes["ffn_type", "1500"], changes["norm_type", "300"]
    assert (swiglu.earlier.verdict, swiglu.redecided.verdict, swiglu.rerun.verdict) == ("n.s.", "worse", "equivalent")
    assert swiglu.cause == "rule, then cells" and swiglu.rerun_done and swiglu.rerun.seeds == "6 seeds"
    assert (saturated.earlier.verdict, saturated.rerun, saturated.cause) == ("untested", None, "dropped from the book")
    assert rms.earlier.verdict == "worse" and rms.cause == "unchanged" and not rms.rerun_done
    ns = module.Change(swiglu.question, swiglu.earlier, replace(swiglu.redecided, verdict="undecided"), None, True)
    assert replace(ns, rerun=ns.redecided).cause == "unchanged"  # n.s. is undecided in the new words
    page = module.report(list(changes.values()), earlier="e", redecided="r", head="h")
    assert (
        "| n.s. | equivalent | 1 |" in page
        and "What moved them (questions rerun so far, and those dropped): both: 1; dropped from the book: 1." in page
        and "Not rerun yet (the rerun column still holds the earlier cells): norm_type" in page
    )


def test_loss_chunks_times_the_plain_loss_and_each_chunk_size_with_its_provenance(capsys):
    """benchmarks/speed/loss_chunks.py: a row for the plain loss and one per chunk size, each a positive
    median, under a header naming the command, the device and torch (a committed figure says what
    made it)."""
    import torch

    sizes = ["--tokens", "64", "--d-model", "16", "--vocab", "50", "--chunks", "16", "64"]
    benchmark_module("loss_chunks").main([*sizes, "--device", "cpu", "--dtype", "fp32", "--repeats", "2"])
    out = capsys.readouterr().out
    rows = re.findall(r"^\| (plain .*|fused, chunk \d+) \| ([\d.]+) \|", out, flags=re.M)
    assert [name for name, _ in rows] == ["plain F.cross_entropy(F.linear)", "fused, chunk 16", "fused, chunk 64"]
    assert all(float(ms) > 0 for _, ms in rows)
    assert "python -m benchmarks.speed.loss_chunks --tokens 64" in out and f"torch {torch.__version__}" in out


def test_a_gpu_profile_counts_kernels_once_leaving_out_the_annotation_ranges_over_them():
    """On CUDA the profiler also reports ``Optimizer.step#AdamW.step`` as a GPU range with its own time,
    which spans the AdamW kernels listed on their own (results/profile_gpu.md's first run counted both);
    CPU events on a GPU run, and events without time of their own, are left out too."""
    from types import SimpleNamespace

    import torch

    profile_step = benchmark_module("profile_step")
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def event(key, device, gpu_us, cpu_us=0.0, annotation=False):
        return SimpleNamespace(
            key=key,
            device_type=device,
            self_device_time_total=gpu_us,
            self_cpu_time_total=cpu_us,
            count=2,
            is_user_annotation=annotation,
        )

    events = [
        event("multi_tensor_apply_kernel", cuda, 1000.0),
        event("Optimizer.step#AdamW.step", cuda, 1030.0, annotation=True),
        event("nvjet_sm90_gemm", cuda, 3000.0),
        event("aten::mm", cpu, 0.0, cpu_us=500.0),
        event("idle", cuda, 0.0),
    ]
    assert profile_step.self_times(events, cuda=True) == [
        ("nvjet_sm90_gemm", 3000.0, 2),
        ("multi_tensor_apply_kernel", 1000.0, 2),
    ]
    assert profile_step.self_times(events, cuda=False) == [("aten::mm", 500.0, 2)]
    assert profile_step.is_matmul("nvjet_sm90_gemm", cuda=True) and not profile_step.is_matmul("aten::mm", cuda=True)
    assert profile_step.is_matmul("aten::mm", cuda=False)


def test_the_baseline_allocation_simulation_decides_every_design_through_the_rule():
    """Each design of ``benchmarks/statistics/baseline_allocation.py`` at a few families: its array decisions agree with
    ``decide.decide`` question by question (the cross-check), and a true difference of four margins is
    found more often than a null one is called better."""
    allocation = benchmark_module("baseline_allocation")
    rng = __import__("numpy").random.default_rng(0)
    scale = allocation.SCALES[1]
    for design in allocation.DESIGNS:
        row = allocation.simulate(rng, 40, scale, 2, 0.2, design)
        assert row.agree[0] == row.agree[1] > 0, (design, row.agree)
        assert 0.0 <= row.false_rate <= 0.5 and row.power >= row.false_rate, (design, row)
