"""benchmarks/gpu_check.py on a CPU: the no-GPU path, its arguments, its plan, and its sections run
through the same code at tiny shapes (its figures come from a GPU run, not from here)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

from benchmarks.harness import lightning_version, machine_facts, module_env

SCRIPT = REPO / "benchmarks" / "gpu_check.py"  # the command people run; the check is benchmarks.gpu.check
SECTIONS = ["throughput", "trainer", "gradients", "matrix", "compile"]


def gpu_check():
    return importlib.import_module("benchmarks.gpu.check")


def tiny():
    return gpu_check().Dims(d_model=32, n_layers=1, n_heads=2, d_ff=128, batch=2, vocab=64, seq_len=16)


def tiny_context(tmp_path: Path, *argv: str, trainer_steps: int = 2):
    g = gpu_check()
    settings = g.Settings(
        rounds=1, warmup=1, min_steps=2, max_steps=2, min_seconds=0.0, trainer_steps=trainer_steps, matrix_seeds=(0,)
    )
    return g.Context(
        g.parse_args(list(argv)),
        settings,
        tmp_path,
        device="cpu",
        dims=tiny(),
        gradient_dims=tiny(),
        gradient_dtypes=("fp32",),
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
    for option in ("--nanogpt", "--quick", "--skip", "--out", "--plan", "--dtypes", "--runs"):
        assert option in done.stdout
    for section in SECTIONS:
        assert section in done.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--skip", "matrx"], "unknown section 'matrx'; choose from throughput, trainer, gradients, matrix, compile"),
        (["--skip", "matrix,foo"], "unknown section 'foo'"),
        (["--skip", "throughput,trainer", "gradients", "matrix", "compile"], "--skip leaves no section to run"),
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
    assert g.parse_args(["--skip", "matrix,compile", "trainer"]).skip == ["matrix", "compile", "trainer"]
    args = g.parse_args([])
    assert (args.skip, args.out, args.dtypes, args.quick, args.jobs) == (
        [],
        "results/gpu.md",
        ["bf16", "fp32"],
        False,
        "auto",
    )
    assert g.parse_args(["--jobs", "2"]).jobs == 2


# ------------------------------------------------------------------------------------- the plan
def test_plan_lists_the_sections_and_shapes_without_a_gpu(monkeypatch):
    """The plan builds the trainer configs with build_run_config and expands the smoke matrix with
    expand_matrix, as the runs will: GPT-2 small for the speed sections, every positional variant in
    fp32 and bf16, every smoke cell (one seed with --quick)."""
    g = gpu_check()
    monkeypatch.setattr(g, "importable", lambda module: False)  # transformers or not: the same plan here
    planned = g.plan(g.parse_args([]))
    assert [s.name for s in planned] == SECTIONS
    by_name = {s.name: s for s in planned}
    assert "d 768, 12 layers, 12 heads, context 1024, vocab 50304" in by_name["throughput"].shape
    assert by_name["throughput"].runs == ("blockbench bf16", "blockbench fp32")
    notes = " ".join(by_name["throughput"].notes)
    assert "nanogpt not run: pass --nanogpt PATH" in notes and "hf_gpt2 not run" in notes
    assert "d 768, 12 layers, 12 heads, context 1024" in by_name["trainer"].shape
    assert "precision auto" in by_name["trainer"].shape
    assert len(by_name["gradients"].runs) == 12 and "relative fp32" in by_name["gradients"].runs
    assert len(by_name["matrix"].runs) == 12 and "vit/norm_placement=post/seed1" in by_name["matrix"].runs
    assert by_name["compile"].runs == ("blockbench.cell.train.train, 300 steps, model.compile=true",)

    quick = {s.name: s for s in g.plan(g.parse_args(["--quick", "--nanogpt", "x", "--skip", "trainer"]))}
    assert "trainer" not in quick
    assert quick["throughput"].runs == ("blockbench bf16", "blockbench fp32", "nanogpt bf16", "nanogpt fp32")
    assert len(quick["matrix"].runs) == 6 and all(run.endswith("seed0") for run in quick["matrix"].runs)
    # without the trainer section, the compile section runs its own compile-off run
    assert quick["compile"].runs == (
        "blockbench.cell.train.train, 60 steps, model.compile=false",
        "blockbench.cell.train.train, 60 steps, model.compile=true",
    )
    text = g.format_plan(list(quick.values()))
    assert "| throughput |" in text and "rough total" in text and "estimates from one H200 run" in text


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


def test_throughput_section_times_ours_through_throughput_py_on_a_cpu(tmp_path):
    """One round of the throughput section at a tiny shape: a worker process per run, timed by
    benchmarks.speed.throughput's time_training_step, pooled by its merge, MFU against the given peak."""
    g = gpu_check()
    ctx = tiny_context(tmp_path, "--dtypes", "fp32", "--peak-tflops", "1")
    section = g.section_throughput(ctx)
    assert not section.failed, "\n".join(section.lines)
    # ours, and the references that are installed here (transformers with the bench extra)
    (run,) = [r for r in section.data["runs"] if r["impl"] == "blockbench"]
    assert {r["impl"] for r in section.data["runs"]} <= {"blockbench", "hf_gpt2", "litgpt_gpt"}
    assert (run["impl"], run["dtype"], run["device"], run["steps"], run["matmul_precision"]) == (
        "blockbench",
        "fp32",
        "cpu",
        2,
        "highest",
    )
    assert run["peak_source"] == "config" and run["peak_tflops"] == 1.0 and run["flops_per_step"] > 0
    text = "\n".join(section.lines)
    assert "| blockbench | fp32 |" in text and "nanogpt not run" in text


@pytest.mark.slow  # about a minute: a trainer run in a worker process on the CPU
def test_trainer_and_compile_sections_report_the_real_trainers_record(tmp_path, monkeypatch):
    """The trainer section's run goes through build_run_config and train in a worker process; its
    share of wall time in training steps is the record's train_steps / total; the compile section
    reuses that run as its compile-off side (the compiled one is faked here: inductor on a CPU
    takes minutes)."""
    g = gpu_check()
    ctx = tiny_context(tmp_path)
    trainer = g.section_trainer(ctx)
    assert not trainer.failed, "\n".join(trainer.lines)
    run = trainer.data["run"]
    breakdown = run["wall_time_breakdown"]
    assert run["status"] == "ok" and run["steps"] == 2 and run["compile"] is False
    assert g.train_step_share(breakdown) == pytest.approx(breakdown["train_steps"] / breakdown["total"])
    assert (tmp_path / "compile-off" / "result.json").is_file()
    assert "| compile-off | ok | 32-true | 2 |" in "\n".join(trainer.lines)

    runs = []
    monkeypatch.setattr(g, "_trainer_run", lambda ctx, compile: runs.append(compile) or {**run, "label": "compile-on"})
    compiled = g.section_compile(ctx)
    assert runs == [True] and not compiled.failed  # the compile-off run is the trainer section's
    assert compiled.data["speedup"] == pytest.approx(1.0)


@pytest.mark.slow  # about a minute: six smoke cells on the CPU
def test_matrix_section_runs_the_smoke_matrix_through_run_matrix(tmp_path):
    """The matrix section's code on a CPU, from a script as gpu_check.py runs it (the cells fork from
    the runner's server, which re-imports the main script): run_matrix trains seed 0 of every smoke
    cell with trainer.precision auto (32-true on a CPU), and the section reads each cell's record."""
    driver = tmp_path / "driver.py"
    driver.write_text(
        f"""import json
from pathlib import Path
import benchmarks.gpu.check as g

if __name__ == "__main__":
    ctx = g.Context(g.parse_args(["--quick", "--jobs", "2"]), g.QUICK, Path({str(tmp_path / "runs")!r}), device="cpu")
    section = g.section_matrix(ctx)
    print("RESULT " + json.dumps({{"failed": section.failed, "data": section.data, "lines": section.lines}}))
"""
    )
    done = subprocess.run(
        [sys.executable, str(driver)], cwd=tmp_path, capture_output=True, text=True, timeout=900, env=module_env()
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert not result["failed"], "\n".join(result["lines"])
    cells = result["data"]["cells"]
    assert len(cells) == 6 and {c["status"] for c in cells} == {"ok"} and {c["precision"] for c in cells} == {"32-true"}
    assert (tmp_path / "runs" / "matrix" / "smoke" / "summary.md").is_file()


def test_main_writes_the_report_naming_the_device_and_goes_on_past_a_failed_section(tmp_path, monkeypatch):
    """The GPU path's plumbing with the device faked: every section not skipped runs in order, a
    section that raises is reported as failed while the others still run (exit status 1), and the
    report names the GPU, its driver, CUDA, cuDNN, NCCL, torch and lightning versions."""
    g = gpu_check()
    monkeypatch.setattr(g, "cuda_available", lambda: True)
    facts = {
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
    monkeypatch.setattr(g, "gpu_facts", lambda: facts)
    monkeypatch.setattr(
        g,
        "machine_facts",
        lambda device, threads, packages: {
            **machine_facts("cpu", threads, packages),
            "device": device,
            "gpu": facts["name"],
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
    assert ran == ["throughput", "trainer", "gradients", "compile"]
    text = out.read_text()
    for fact in ("NVIDIA H100 80GB HBM3", "driver 550.54.15", "CUDA 12.4", "cuDNN 90100", "NCCL 2.21.5"):
        assert fact in text
    assert f"torch 2.6.0, lightning {lightning_version()}" in text
    assert "| gradients | FAILED: RuntimeError: no kernel |" in text and "| compile | compile headline |" in text
    assert "## matrix" not in text
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["gpu"] == facts and summary["sections"]["gradients"]["failed"] is True
    assert summary["sections"]["throughput"]["figure"] == 1


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
