"""benchmarks/gpu_check.py on a CPU: the no-GPU path, its arguments, its plan, its time limits, and
every section run through the same code at tiny shapes with CUDA faked (its figures come from a GPU
run, not from here)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO, write_matrix

from benchmarks.harness import lightning_version, machine_facts, module_env

SCRIPT = REPO / "benchmarks" / "gpu_check.py"  # the command people run; the check is benchmarks.gpu.check
SECTIONS = ["loss", "cudnn", "eager", "compiled", "matrix", "breakdown", "gradients", "trainer"]


def gpu_check():
    return importlib.import_module("benchmarks.gpu.check")


def tiny():
    return gpu_check().Dims(d_model=32, n_layers=1, n_heads=2, d_ff=128, batch=2, vocab=64, seq_len=16)


def tiny_context(tmp_path: Path, *argv: str, trainer_steps: int = 2):
    """The sections' context on a CPU: tiny shapes, fp32, the workers in this process, two SDPA backends
    a CPU has, torch.compile's eager backend (inductor on a CPU takes minutes)."""
    g = gpu_check()
    settings = g.Settings(
        rounds=3,
        warmup=1,
        min_steps=2,
        max_steps=2,
        min_seconds=0.0,
        trainer_steps=trainer_steps,
        matrix_seeds=(0,),
        calls=2,
    )
    shape = {"label": "tiny", "batch": 2, "heads": 2, "seq": 8, "head_dim": 8, "causal": True, "calls_per_cell": 40}
    return g.Context(
        g.parse_args(["--dtypes", "fp32", *argv]),
        settings,
        tmp_path,
        device="cpu",
        dims=tiny(),
        gradient_dims=tiny(),
        gradient_dtypes=("fp32",),
        loss_dtypes=("fp32",),
        sdpa_backends=("math", "flash"),
        attention_shapes=[shape],
        compile_backend="eager",
        in_process=True,
    )


# ------------------------------------------------------------------------------------ no GPU
def test_without_a_cuda_device_it_says_so_exits_0_and_writes_nothing(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "no CUDA device: nothing measured; see README"
    assert list(tmp_path.iterdir()) == []  # no results/gpu.md, no gpu.json, no runs


def test_the_no_gpu_path_does_not_plan_or_run_a_section(monkeypatch, tmp_path, capsys):
    g = gpu_check()
    monkeypatch.setattr(g, "cuda_available", lambda: False)
    monkeypatch.setattr(g, "plan", lambda args: pytest.fail("planned without a GPU"))
    out = tmp_path / "gpu.md"
    assert g.main(["--out", str(out), "--nanogpt", str(tmp_path / "missing")]) == 0
    assert capsys.readouterr().out == g.NO_GPU_MESSAGE + "\n"
    assert not out.exists() and not out.with_suffix(".json").exists()


# --------------------------------------------------------------------------------- arguments
def test_help_names_every_section():
    done = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0
    for option in ("--nanogpt", "--quick", "--skip", "--out", "--plan", "--dtypes", "--runs", "--budget"):
        assert option in done.stdout
    for section in SECTIONS:
        assert section in done.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--skip", "matrx"], "unknown section 'matrx'; choose from " + ", ".join(SECTIONS)),
        (["--skip", "matrix,foo"], "unknown section 'foo'"),
        (["--skip", "loss,cudnn,eager", "compiled", "matrix", "breakdown,gradients", "trainer"], "--skip leaves no"),
        (["--dtypes", "fp16"], "invalid choice: 'fp16'"),
        (["--jobs", "many"], "--jobs must be a number or auto"),
    ],
)
def test_bad_arguments_stop_with_a_clear_error(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        gpu_check().parse_args(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_skip_takes_names_and_comma_lists():
    g = gpu_check()
    assert g.parse_args(["--skip", "matrix,compiled", "trainer"]).skip == ["matrix", "compiled", "trainer"]
    args = g.parse_args([])
    assert (args.skip, args.out, args.dtypes, args.quick, args.jobs, args.budget) == (
        [],
        "results/gpu.md",
        ["bf16"],
        False,
        "auto",
        420.0,
    )
    assert g.parse_args(["--jobs", "2"]).jobs == 2


# ------------------------------------------------------------------------------------- the plan
def test_plan_lists_the_sections_in_order_with_their_limits_without_a_gpu(monkeypatch):
    """The sections in order of priority, the first six within the 7-minute limit; the matrix is the
    smoke matrix's seed 0 (expand_matrix, as run_matrix expands it) run twice, the attention shapes
    those of the smoke matrix's and base.yaml's cells."""
    g = gpu_check()
    monkeypatch.setattr(g, "importable", lambda module: False)  # transformers or not: the same plan here
    planned = g.plan(g.parse_args([]))
    assert [s.name for s in planned] == SECTIONS
    assert sum(g.BUDGET_S[name] for name in SECTIONS[:6]) <= g.TOTAL_BUDGET_S == 420
    by_name = {s.name: s for s in planned}
    assert "16384 tokens, d 768, vocab 50304" in by_name["loss"].shape
    assert "lm (smoke): batch 32, 4 heads, seq 64, head 16" in by_name["cudnn"].shape
    assert "vit (base): batch 32, 4 heads, seq 65, head 32" in by_name["cudnn"].shape
    assert by_name["cudnn"].runs == ("cudnn", "flash", "efficient")
    assert "d 768, 12 layers, 12 heads, context 1024, vocab 50304" in by_name["eager"].shape
    assert by_name["eager"].runs == ("blockbench bf16",)
    assert "nanogpt not run: pass --nanogpt PATH" in " ".join(by_name["eager"].notes)
    assert by_name["matrix"].runs == ("--jobs 1", "--jobs auto")
    assert len(by_name["gradients"].runs) == 12 and "relative fp32" in by_name["gradients"].runs

    quick = {s.name: s for s in g.plan(g.parse_args(["--quick", "--nanogpt", "x", "--skip", "trainer"]))}
    assert "trainer" not in quick
    assert quick["eager"].runs == ("blockbench bf16", "nanogpt bf16")
    assert quick["compiled"].runs == ("blockbench bf16 compiled", "nanogpt bf16 compiled")
    text = g.format_plan(list(quick.values()))
    assert "| loss |" in text and "40 s |" in text and "all within 7.0 min" in text


def test_the_book_attention_shapes_are_the_cells_own():
    """The cuDNN section's shapes come from the configs: a ViT's sequence is its patches and its CLS
    token, not the model's max_seq_len, and a cell's SDPA calls are its attention layers times its steps."""
    g = gpu_check()
    shapes = {shape["label"]: shape for shape in g.book_attention_shapes()}
    vit = shapes["vit (smoke): batch 32, 4 heads, seq 65, head 16"]
    assert (vit["seq"], vit["causal"], vit["calls_per_cell"]) == ((32 // 4) ** 2 + 1, False, 2 * 100)
    translation = shapes["translation (smoke): batch 32, 4 heads, seq 24, head 16"]
    assert translation["calls_per_cell"] == 3 * 2 * 100  # encoder, decoder and cross attention


def test_the_trainer_runs_are_the_gpt2_small_model_through_build_run_config():
    g = gpu_check()
    for compile in (False, True):
        run = g.trainer_run_config(300, compile)
        model = run.resolved_model()
        assert (model.d_model, model.n_layers, model.n_heads, model.d_ff, model.max_seq_len) == (
            768,
            12,
            12,
            3072,
            1024,
        )
        assert (model.pos_encoding, model.norm_placement, model.bias, model.tie_embeddings) == (
            "learned",
            "pre",
            True,
            True,
        )
        assert model.compile is compile
        assert (run.task.name, run.task.seq_len, run.trainer.batch_size, run.trainer.max_steps) == ("lm", 1024, 16, 300)
        assert run.trainer.precision == "auto" and run.trainer.resolved_precision("gpu") == "bf16-mixed"
        # one epoch of training rows covers the run
        assert run.task.n_train_tokens // (run.task.seq_len + 1) >= 300 * 16


def test_the_smoke_matrix_it_runs_is_the_smoke_matrix_with_precision_auto(tmp_path):
    """The copy gpu_check runs expands (expand_matrix, as run_matrix does) to the smoke matrix's own
    cells with the same config hashes: precision auto is the default, set explicitly."""
    from blockbench.matrix.expand import expand_matrix

    g = gpu_check()
    original = expand_matrix(REPO / "configs" / "matrix" / "smoke.yaml").cells
    copy = expand_matrix(g.smoke_matrix_file(tmp_path / "all")).cells
    assert [c.key for c in copy] == [c.key for c in original] and len(copy) == 12
    assert [c.run.config_hash() for c in copy] == [c.run.config_hash() for c in original]
    assert all(c.run.trainer.precision == "auto" for c in copy)
    assert "trainer.precision: auto" in (tmp_path / "all" / "smoke.yaml").read_text()
    one_seed = expand_matrix(g.smoke_matrix_file(tmp_path / "quick", seeds=[0])).cells
    assert [c.key for c in one_seed] == [c.key for c in original if c.seed == 0]


# --------------------------------------------------------------------------------- the sections
def test_the_loss_section_compares_both_paths_with_fp32_on_a_cpu(tmp_path):
    """The plain and the chunked loss agree with the float32 reference (the plain path itself: 0)."""
    g = gpu_check()
    ctx = tiny_context(tmp_path)
    ctx.loss_dtypes = ("fp32", "bf16")
    section = g.section_loss(ctx)
    assert not section.failed, "\n".join(section.lines)
    rows = {(r["path"], r["dtype"]): r for r in section.data["rows"]}
    assert set(rows) == {("plain", "fp32"), ("plain", "bf16"), ("chunked", "fp32"), ("chunked", "bf16")}
    assert rows["plain", "fp32"]["loss"] == 0 and rows["plain", "fp32"]["grad_weight"] == 0
    assert rows["chunked", "fp32"]["loss"] < 1e-6 and rows["chunked", "fp32"]["grad_hidden"] < 1e-5
    assert 0 < rows["chunked", "bf16"]["grad_weight"] < 5e-2  # bf16 rounds: not 0, within its tolerance
    assert all(r["ms"] > 0 and r["memory_gib"] is None for r in rows.values())  # no CUDA memory on a CPU
    assert "| chunked | bf16 |" in "\n".join(section.lines) and section.headline.startswith("bf16: chunked")


def test_the_cudnn_section_times_first_and_later_calls_per_backend_on_a_cpu(tmp_path):
    g = gpu_check()
    section = g.section_cudnn(tiny_context(tmp_path))
    assert not section.failed, "\n".join(section.lines)
    results = section.data["results"]
    assert set(results) == {"math", "flash"}
    for outcome in results.values():
        (row,) = outcome["results"]
        assert row["label"] == "tiny" and row["first_ms"] > 0 and row["median_ms"] > 0
    assert "| tiny | math |" in "\n".join(section.lines)


def test_cudnn_pays_where_its_saving_repays_its_first_call_within_a_cells_calls():
    """Hand-computed: cuDNN's first call 30 ms over its later 0.1 ms, flash's 2 ms over 0.2: 28 ms more,
    repaid at 0.1 ms a call after 280 calls; a cell of 200 calls does not pay, one of 1,200 does; a cuDNN
    no faster than flash never pays."""
    g = gpu_check()
    shapes = [
        {"label": "small", "calls_per_cell": 200},
        {"label": "large", "calls_per_cell": 1200},
        {"label": "slow", "calls_per_cell": 10**6},
    ]
    results = {
        "cudnn": {
            "results": [
                {"label": "small", "first_ms": 30.1, "median_ms": 0.1},
                {"label": "large", "first_ms": 30.1, "median_ms": 0.1},
                {"label": "slow", "first_ms": 30.3, "median_ms": 0.3},
            ]
        },
        "flash": {
            "results": [{"label": label, "first_ms": 2.2, "median_ms": 0.2} for label in ("small", "large", "slow")]
        },
        "efficient": {"results": [{"label": "small", "error": "no kernel"}]},
    }
    verdicts = {v["label"]: v for v in g.cudnn_verdicts(results, shapes)}
    assert verdicts["small"]["against"] == "flash"
    assert verdicts["small"]["pays_after"] == pytest.approx(28.0 / 0.1)
    assert (verdicts["small"]["pays"], verdicts["large"]["pays"], verdicts["slow"]["pays"]) == (False, True, False)
    assert verdicts["slow"]["pays_after"] == float("inf")
    # the cells' rule keeps cuDNN off below CUDNN_SDPA_MIN_CALLS: right for the small cells, not the large one
    assert [verdicts[label]["agrees"] for label in ("small", "large", "slow")] == [True, False, False]


def test_the_eager_and_compiled_sections_interleave_rounds_in_one_process_on_a_cpu(tmp_path):
    """Ours and the installed references built in one process, 3 interleaved rounds, the ratio with
    its interval over the rounds; the compiled section goes through torch.compile (its eager backend here)."""
    g = gpu_check()
    ctx = tiny_context(tmp_path, "--peak-tflops", "1")
    eager = g.section_eager(ctx)
    assert not eager.failed, "\n".join(eager.lines)
    runs = {r["impl"]: r for r in eager.data["runs"]}
    assert "blockbench" in runs and runs["blockbench"]["compiled"] is False
    assert len(runs["blockbench"]["round_medians_ms"]) == 3 and runs["blockbench"]["peak_source"] == "config"
    if "hf_gpt2" in runs:  # transformers installed (the bench extra)
        (ratio,) = eager.data["ratios"]
        assert (
            ratio["reference"] == "hf_gpt2" and ratio["rounds"] == 3 and ratio["low"] <= ratio["ratio"] <= ratio["high"]
        )
    compiled = g.section_compiled(ctx)
    assert not compiled.failed, "\n".join(compiled.lines)
    assert {r["compiled"] for r in compiled.data["runs"]} == {True}
    assert "`torch.compile`d (backend eager)" in "\n".join(compiled.lines)


def fake_matrix_run(jobs: int, seconds: float, total: float = 9.0, other: float = 0.4) -> dict:
    """A matrix worker's outcome: two cells, each with a breakdown whose parts leave ``other`` seconds."""
    breakdown = {"startup": 1.0, "setup": 0.5, "build": 1.0, "train_steps": total - 2.5 - other, "other": other}
    breakdown |= {"total": total, "measured_from": "process start"}
    cells = [
        {
            "key": f"lm/v/seed{i}",
            "status": "ok",
            "precision": "bf16-mixed",
            "steps": 100,
            "step_ms": 6.0,
            "breakdown": breakdown,
            "runner_s": total + 1.5,
            "error": None,
        }
        for i in range(2)
    ]
    return {"exit_code": 0, "seconds": seconds, "jobs": jobs, "wall_time_s": seconds, "matrix_dir": "x", "cells": cells}


def test_the_matrix_section_compares_one_at_a_time_with_packed_and_the_breakdown_reads_its_cells(tmp_path, monkeypatch):
    g = gpu_check()
    ctx = tiny_context(tmp_path)
    ctx.matrix_file = tmp_path / "m.yaml"
    specs = []

    def fake(kind, spec):
        specs.append(spec)
        return fake_matrix_run(spec["jobs"] if spec["jobs"] != "auto" else 4, 40.0 if spec["jobs"] == 1 else 16.0)

    monkeypatch.setattr(ctx, "worker", fake)
    section = g.section_matrix(ctx)
    assert not section.failed, "\n".join(section.lines)
    assert [(s["label"], s["jobs"]) for s in specs] == [("serial", 1), ("packed", "auto")]
    assert specs[0]["root"] != specs[1]["root"]  # fresh folders: nothing reused between the runs
    assert section.headline == "packed (4 at once) 16 s against one at a time 40 s: 2.50x"
    breakdown = g.section_breakdown(ctx)
    assert not breakdown.failed, "\n".join(breakdown.lines)
    assert breakdown.data["run"] == "serial"
    assert breakdown.headline.startswith("96% to 96% of each cell's wall time attributed")  # 1 - 0.4 / 9
    assert "| lm/v/seed0 | 1.00 | 0.50 | 1.00 |" in "\n".join(breakdown.lines)
    assert "| 9.00 | 95.6% | 10.5 | 1.50 |" in "\n".join(breakdown.lines)  # runner 10.5 s: 1.5 s after the result
    ctx.matrix = {"serial": fake_matrix_run(1, 40.0, other=2.0)}
    low = g.section_breakdown(ctx)
    assert low.failed and "below 90% attributed: lm/v/seed0, lm/v/seed1" in "\n".join(low.lines)
    ctx.matrix = {}
    assert g.section_breakdown(ctx).cut


def test_positional_gradients_against_the_math_backend_on_a_cpu(tmp_path):
    """The gradient section's code on the CPU's kernels: every variant, every parameter's gradient
    (the learned table and the T5 bias table among them) as close to the math backend's as fp32
    allows; the flash kernel ran where the CPU has one for the variant."""
    g = gpu_check()
    section = g.section_gradients(tiny_context(tmp_path))
    assert not section.failed, "\n".join(section.lines)
    checks = {c["variant"]: c for c in section.data["checks"]}
    assert list(checks) == ["learned", "sinusoidal", "rope", "alibi", "relative", "nope"]
    for check in checks.values():
        assert check["dtype"] == "fp32" and check["missing"] == ()
        assert check["max_abs_diff"] < 1e-5 and check["worst_relative"] <= g.GRADIENT_TOLERANCE["fp32"]
    assert list(checks["relative"]["positional"]) == ["positions.weight"]  # the T5 bias table
    assert list(checks["learned"]["positional"]) == ["positions.weight"]
    assert checks["rope"]["positional"] == {}
    assert checks["learned"]["kernels"] == "flash (CPU)"
    text = "\n".join(section.lines)
    assert "| relative | fp32 |" in text and "`positions.weight`" in text and "sdpa_kernel(SDPBackend.MATH)" in text


def test_a_gradient_that_differs_or_is_missing_is_reported():
    g = gpu_check()
    check = g.GradientCheck("relative", "fp32", "memory-efficient", 0.5, "positions.weight", 0.9, {}, ())
    assert not check.agrees
    assert not g.GradientCheck("relative", "bf16", "flash", 0.0, "w", 0.0, {}, ("positions.weight",)).agrees
    assert g.GradientCheck("alibi", "bf16", "flash", 1e-3, "w", 4e-2, {}, ()).agrees
    lines = "\n".join(g.gradient_lines([check], "cuda", tiny()))
    assert "| relative | fp32 | memory-efficient |" in lines and "**NO**" in lines
    assert g.kernel_names({"_scaled_dot_product_efficient_attention", "mm"}) == "memory-efficient"
    assert g.kernel_names({"_scaled_dot_product_flash_attention_for_cpu"}) == "flash (CPU)"
    assert g.kernel_names({"bmm", "_safe_softmax"}) == "math"


def test_a_section_past_its_limit_is_cut_and_the_next_starts(tmp_path, monkeypatch):
    """A worker process that outlives its section's limit is stopped with its process group and the
    section reported as cut; the next section runs; with no time left, a section is cut unrun."""
    g = gpu_check()
    ctx = tiny_context(tmp_path)
    ctx.in_process = False  # a real worker process: it takes seconds to import torch, past a 2 s limit
    started = time.perf_counter()
    cut = g.run_section("loss", ctx, limit=2.0)
    assert cut.cut and not cut.failed and "did not finish" in cut.lines[0]
    assert time.perf_counter() - started < 30
    ctx.in_process = True
    monkeypatch.setitem(g.RUNNERS, "breakdown", lambda ctx: g.Section("breakdown", "ran", []))
    assert g.run_section("breakdown", ctx, limit=5.0).headline == "ran"
    assert g.run_section("breakdown", ctx, limit=0.5).cut


def test_every_section_runs_on_a_cpu_through_main_with_cuda_faked(tmp_path, monkeypatch):
    """main() as on a GPU, each section's code path at tiny shapes on the CPU (the matrix runs faked:
    the slow test below runs a real one), the report and its JSON written with every section."""
    g = gpu_check()
    monkeypatch.setattr(g, "cuda_available", lambda: True)
    monkeypatch.setattr(g, "gpu_facts", lambda: FACTS)
    monkeypatch.setattr(g, "machine_facts", lambda device, threads, packages: machine_facts("cpu", threads, packages))

    def context(args):
        ctx = tiny_context(tmp_path / "runs", "--peak-tflops", "1")
        real = ctx.worker
        ctx.worker = lambda kind, spec: (
            fake_matrix_run(1 if spec["jobs"] == 1 else 2, 10.0) if kind == "matrix" else real(kind, spec)
        )
        return ctx

    monkeypatch.setattr(g, "make_context", context)
    out = tmp_path / "results" / "gpu.md"
    code = g.main(["--quick", "--out", str(out), "--runs", str(tmp_path / "runs"), "--skip", "trainer"])
    text = out.read_text()
    summary = json.loads(out.with_suffix(".json").read_text())
    assert list(summary["sections"]) == SECTIONS[:-1]
    assert code == 0, {name: s for name, s in summary["sections"].items() if s["failed"] or s["cut"]}
    assert "| loss |" in text and "| breakdown | 96% to 96%" in text and "## cudnn:" in text


@pytest.mark.slow  # about a minute: a trainer run in a worker process on the CPU
def test_the_trainer_section_reports_the_real_trainers_record(tmp_path):
    """The trainer section's run goes through build_run_config and train in a worker process; its
    share of wall time in training steps is the record's train_steps / total."""
    g = gpu_check()
    ctx = tiny_context(tmp_path)
    ctx.in_process = False
    trainer = g.section_trainer(ctx)
    assert not trainer.failed, "\n".join(trainer.lines)
    run = trainer.data["run"]
    breakdown = run["wall_time_breakdown"]
    assert run["status"] == "ok" and run["steps"] == 2 and run["compile"] is False
    assert g.train_step_share(breakdown) == pytest.approx(breakdown["train_steps"] / breakdown["total"])
    assert (tmp_path / "trainer" / "result.json").is_file()
    assert "| trainer | ok | 32-true | 2 |" in "\n".join(trainer.lines)


@pytest.mark.slow  # about a minute: a tiny matrix trained twice on the CPU
def test_the_matrix_section_runs_a_matrix_twice_through_run_matrix(tmp_path):
    """The matrix section's real code path from a script as gpu_check.py runs it (the cells fork from the
    runner's server, which re-imports the main script): run_matrix trains a tiny two-cell matrix one cell
    at a time and then two at a time, and the breakdown reads each cell's record."""
    write_matrix(tmp_path, {"seed": [0, 1]})
    driver = tmp_path / "driver.py"
    driver.write_text(
        f"""import json
from pathlib import Path
import benchmarks.gpu.check as g

if __name__ == "__main__":
    ctx = g.Context(g.parse_args(["--jobs", "2"]), g.QUICK, Path({str(tmp_path / "runs")!r}), device="cpu")
    ctx.matrix_file = Path({str(tmp_path / "m.yaml")!r})
    section, breakdown = g.section_matrix(ctx), g.section_breakdown(ctx)
    print("RESULT " + json.dumps({{"failed": section.failed, "data": section.data, "lines": section.lines,
                                   "breakdown": breakdown.data, "breakdown_failed": breakdown.failed}}))
"""
    )
    done = subprocess.run(
        [sys.executable, str(driver)], cwd=tmp_path, capture_output=True, text=True, timeout=900, env=module_env()
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert not result["failed"], "\n".join(result["lines"])
    runs = result["data"]["runs"]
    assert (runs["serial"]["jobs"], runs["packed"]["jobs"]) == (1, 2)
    assert all(c["status"] == "ok" and c["runner_s"] > 0 for run in runs.values() for c in run["cells"])
    assert not result["breakdown_failed"] and len(result["breakdown"]["cells"]) == 2


FACTS = {
    "name": "NVIDIA H100 80GB HBM3",
    "count": 1,
    "capability": "9.0",
    "memory_gib": 79.1,
    "driver": "550.54.15",
    "cuda": "12.4",
    "cudnn": 90100,
    "nccl": "2.21.5",
    "torch": "2.6.0",
    "lightning": "2.5.0",
}


def test_main_writes_the_report_naming_the_device_and_goes_on_past_a_failed_section(tmp_path, monkeypatch):
    """The GPU path's plumbing with the device faked: every section not skipped runs in order, a
    section that raises is reported as failed while the others still run (exit status 1), and the
    report names the GPU, its driver, CUDA, cuDNN, NCCL, torch and lightning versions."""
    g = gpu_check()
    monkeypatch.setattr(g, "cuda_available", lambda: True)
    monkeypatch.setattr(g, "gpu_facts", lambda: FACTS)
    monkeypatch.setattr(
        g,
        "machine_facts",
        lambda device, threads, packages: {
            **machine_facts("cpu", threads, packages),
            "device": device,
            "gpu": FACTS["name"],
            "torch": "2.6.0",
        },
    )
    ran = []

    def fake(name):
        def run(ctx):
            ran.append(name)
            if name == "gradients":
                raise RuntimeError("no kernel")
            return g.Section(name, f"{name} headline", [f"{name} table"], {"figure": 1})

        return run

    monkeypatch.setattr(g, "RUNNERS", {name: fake(name) for name in SECTIONS})
    out = tmp_path / "results" / "gpu.md"
    assert g.main(["--quick", "--skip", "matrix", "--out", str(out)]) == 1
    assert ran == [name for name in SECTIONS if name != "matrix"]
    text = out.read_text()
    for fact in ("NVIDIA H100 80GB HBM3", "driver 550.54.15", "CUDA 12.4", "cuDNN 90100", "NCCL 2.21.5"):
        assert fact in text
    assert f"torch 2.6.0, lightning {lightning_version()}" in text
    assert "| gradients | FAILED: RuntimeError: no kernel |" in text and "| compiled | compiled headline |" in text
    assert "## matrix" not in text
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["gpu"] == FACTS and summary["sections"]["gradients"]["failed"] is True
    assert summary["sections"]["eager"]["figure"] == 1


def test_report_and_breakdown_tables():
    g = gpu_check()
    lines = g.breakdown_lines(
        {
            "startup": 2.0,
            "train_steps": 6.0,
            "other": 2.0,
            "total": 10.0,
            "measured_from": "process start",
            "resumed": False,
        }
    )
    assert "| train_steps | 6.00 | 60.0% |" in lines and not any("resumed" in line for line in lines)
    assert g.train_step_share({"train_steps": 6.0, "total": 10.0}) == 0.6
    assert g.train_step_share(None) is None
    assert g.attributed_share({"other": 1.0, "total": 10.0}) == pytest.approx(0.9)


def test_shares_below_one_percent_keep_two_significant_digits():
    """A smoke cell's MFU on an H200 is about 0.02% (its d 64 model), which one decimal printed as
    0.0% in results/gpu.md's first run."""
    assert [gpu_check()._pct(x) for x in (None, 0.0, 0.00021, 0.0099, 0.304)] == [
        "–",
        "0.0%",
        "0.021%",
        "0.99%",
        "30.4%",
    ]
