"""Issue 41's CPU-checkable parts of the GPU path: TF32 read through either API, contenders that cannot leak global
state into each other, the step's launches and host syncs against the bare loop, the meter's lazy NaN check, the
large-GPU preset and the CUDA-graphs option."""

import contextlib
import io
import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from distrinews_course.bench import global_state, harness, step_ops, train_bare, train_compare
from distrinews_course.bench.train_setup import parse_argv, script_argv
from distrinews_lib import plan as run_plan
from distrinews_lib.data import batching
from distrinews_lib.errors import UserError
from distrinews_lib.training import config, epochs, flops, precision

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def restored():
    """Whatever a test does to TF32, cuDNN or the environment is undone afterwards."""
    saved = global_state.GlobalState.capture()
    yield saved
    saved.restore()


def test_matmul_dtype_reads_tf32_set_through_the_new_api(restored):
    assert flops.matmul_dtype("off", "cuda") == "fp32"
    if not hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        pytest.skip(f"torch {torch.__version__} has only the legacy TF32 flag")
    torch.backends.cuda.matmul.fp32_precision = "tf32"  # what Trainer does (issue 41: round 2 crashed here)
    with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
        torch.backends.cuda.matmul.allow_tf32  # noqa: B018  the legacy read that crashed
    assert flops.matmul_dtype("off", "cuda") == "tf32"
    assert flops.matmul_dtype("bf16", "cuda") == "bf16" and flops.matmul_dtype("off", "cpu") == "fp32"
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    assert flops.matmul_dtype("off", "cuda") == "fp32"
    torch.backends.cuda.matmul.fp32_precision = "none"  # inherits the generic setting
    torch.backends.fp32_precision = "tf32"
    assert flops.matmul_dtype("off", "cuda") == "tf32"


def test_matmul_dtype_reads_the_legacy_flag(restored):
    torch.backends.cuda.matmul.allow_tf32 = True
    assert flops.matmul_dtype("off", "cuda") == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = False
    assert flops.matmul_dtype("off", "cuda") == "fp32"


def test_a_window_starts_from_the_baseline_whatever_the_last_contender_set(restored, monkeypatch):
    baseline = global_state.GlobalState.capture()
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = "tf32"
    else:
        torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.benchmark = not baseline_flag("benchmark")
    torch.set_num_threads(max(1, torch.get_num_threads() + 1))
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")  # what a Trainer run leaves behind
    moved = global_state.GlobalState.capture().differences(baseline)
    assert any("matmul" in m for m in moved) and any("benchmark" in m for m in moved)
    assert any("threads" in m for m in moved) and any("ACCELERATE_MIXED_PRECISION" in m for m in moved)
    global_state.start_window(baseline, "next")
    assert global_state.GlobalState.capture().differences(baseline) == []
    assert flops.matmul_dtype("off", "cuda") == "fp32" and "ACCELERATE_MIXED_PRECISION" not in os.environ
    # and a state that restore() cannot put back stops the run instead of measuring a tainted window
    torch.backends.cudnn.benchmark = not baseline_flag("benchmark")
    monkeypatch.setattr(global_state.GlobalState, "restore", lambda self: None)
    with pytest.raises(global_state.StateLeak, match="cudnn benchmark"):
        global_state.start_window(baseline, "next")


def baseline_flag(name):
    return getattr(torch.backends.cudnn, name)


def _tiny_args(tmp_path, steps=8, batch=16, flags=()):
    return script_argv(
        model="tiny",
        data_arg="embedded",
        batch_size=batch,
        steps=steps,
        num_samples=max(steps * batch, 64),
        max_length=64,
        seed=3,
        threads=1,
        out=tmp_path / "run",
        device_type="cpu",
        flags=list(flags),
    )


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    argv = _tiny_args(tmp_path_factory.mktemp("prep"))
    cfg = parse_argv(argv)
    with contextlib.redirect_stdout(io.StringIO()):
        run = run_plan.prepare(run_plan.decide(cfg, log=lambda *a: None), log=lambda *a: None)
    return argv, cfg, run


def test_the_compare_loop_isolates_every_window(prepared, restored, monkeypatch, tmp_path):
    """Each fake contender turns TF32 on and records the dtype its window STARTED with: every one must start at
    fp32 (the bug: the contender after Trainer inherited TF32), and MFU is computed on the dtype that ran."""
    argv, cfg, run = prepared
    started = []

    def contender(kind):
        def fake(*a, **k):
            started.append((kind, flops.matmul_dtype("off", "cuda")))
            if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
                torch.backends.cuda.matmul.fp32_precision = "tf32"
            else:
                torch.backends.cuda.matmul.allow_tf32 = True
            return {"samples_per_s": 1.0, "tokens_per_s": 1.0, "model_tflops": 1.0, "foreign_cores": 0.0}

        return fake

    monkeypatch.setattr(train_compare, "run_ours", contender("ours"))
    monkeypatch.setattr(train_compare, "run_bare", contender("bare"))
    monkeypatch.setattr(train_compare, "run_trainer", contender("trainer"))
    monkeypatch.setattr(train_compare.run_plan, "prepare", lambda *a, **k: run)
    args = SimpleNamespace(
        models=["tiny"], n_train=8000, quick=True, max_length=64, seed=3, threads=1, compile=False, peak_tflops=None,
        quiet_cores=1.0, quiet_timeout=0.0, quiet_budget=0.0, count_steps=False, trace_dir=None,
    )  # fmt: skip
    plan = {"compare": {"tiny": dict(batch_size=16, warmup=1, steps=2, rounds=2)}, "ablations": {"tiny": []}}
    out = train_compare.compare_section(plan, "embedded", torch.device("cpu"), args, lambda s: None, tmp_path)
    assert len(started) >= 4 and {d for _, d in started} == {"fp32"}, started
    assert {k for k, _ in started} >= {"ours", "bare"}
    assert all(r["matmul_dtype"] == "fp32" for c in out["tiny"]["contenders"].values() for r in c["rounds"])


def test_ours_syncs_no_more_than_the_bare_loop_and_every_extra_launch_is_named(prepared, tmp_path):
    """The CPU proxy of a GPU (step_ops): per step, our script's host syncs are the bare loop's (both are the model's
    own), and what it launches beyond the bare loop comes from the lines named here, nothing else."""
    argv, cfg, run = prepared
    torch.set_num_threads(1)
    with step_ops.StepWindow(3, 4, proxy=True) as ours, contextlib.redirect_stdout(io.StringIO()):
        harness.run(ROOT / "scripts" / "train_single.py", argv, warmup=1, steps=7, device=torch.device("cpu"))
    bare = step_ops.StepWindow(3, 4, proxy=True)
    batches = train_bare.our_batches(run, cfg, torch.device("cpu"), 8)
    train_bare.run_bare(run.model, batches, cfg, torch.device("cpu"), warmup=1, steps=7, window=bare)
    o, b = ours.summary(), bare.summary()
    assert o["counted_steps"] == b["counted_steps"] == 3
    assert o["syncs_per_step"] <= b["syncs_per_step"], (o["sync_sites_per_step"], b["sync_sites_per_step"])
    assert all("transformers" in site for site in o["sync_sites_per_step"]), o["sync_sites_per_step"]
    script = (ROOT / "scripts" / "train_single.py").read_text().splitlines()
    extra = {}
    for site, n in o["launch_sites_per_step"].items():
        path, line = site.split(" ")[0].rsplit(":", 1)
        text = script[int(line) - 1] if path == "scripts/train_single.py" else path
        extra[text.strip()[:40]] = n
    meter = sum(n for s, n in o["launch_sites_per_step"].items() if s.startswith("distrinews_lib/training/epochs.py"))
    assert meter == 2  # the meter: one copy of the loss, one of the gradient norm; no sync
    assert o["launches_per_step"] - b["launches_per_step"] <= 16, extra
    copies = sum(n for t, n in extra.items() if t.startswith("batch = epochs.to_device"))
    assert copies == 3, o["launch_sites_per_step"]  # input_ids, attention_mask, labels; not the rows' index


def test_the_meter_finds_the_first_bad_step_however_late_it_reads(restored):
    amp = precision.resolve_amp("off", torch.device("cpu"))
    m = epochs.EpochMeter(torch.device("cpu"), amp, epoch=2)
    batch = {"attention_mask": torch.ones(2, 3, dtype=torch.long)}
    losses = [1.0, 0.5, float("nan"), 0.25]
    for i, v in enumerate(losses):  # one micro-batch per step; the gradient of step 2 is infinite
        m.add(torch.tensor(v), batch)
        m.step(torch.tensor(float("inf") if i == 1 else 1.0))
    with pytest.raises(epochs.NonFiniteLoss, match="optimizer step 2 of epoch 2"):
        m.check_finite()
    m2 = epochs.EpochMeter(torch.device("cpu"), amp, epoch=1, state={"loss_sum": 3.0, "seconds": 1.0, **dict.fromkeys(
        ("samples", "tokens", "padded", "sum_sq", "steps", "batches"), 0)})  # fmt: skip
    for v in (1.0, 0.5):
        m2.add(torch.tensor(v), batch)
        m2.step(torch.tensor(1.0))
    m2.check_finite()
    assert m2.loss_sum == 3.0 + 2 * 1.0 + 2 * 0.5 and m2.step_losses() == [1.0, 0.5]
    assert m2.state_dict()["loss_sum"] == m2.loss_sum and m2.steps == 2


def test_auto_picks_the_large_gpu_preset_only_on_a_large_gpu(monkeypatch):
    gib = 2**30
    gpus = {
        "H100": SimpleNamespace(major=9, minor=0, total_memory=80 * gib),
        "A100-40GB": SimpleNamespace(major=8, minor=0, total_memory=40 * gib),
        "T4": SimpleNamespace(major=7, minor=5, total_memory=15 * gib),
        "A10": SimpleNamespace(major=8, minor=6, total_memory=24 * gib),
        "V100-32GB": SimpleNamespace(major=7, minor=0, total_memory=32 * gib),
    }
    for name, expected in [("H100", "large_gpu"), ("A100-40GB", "large_gpu"), ("T4", "single_gpu"),
                           ("A10", "single_gpu"), ("V100-32GB", "single_gpu")]:  # fmt: skip
        monkeypatch.setattr(config, "gpu_count", lambda: 1)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i, p=gpus[name]: p)
        assert config.auto_preset() == expected, name
    monkeypatch.setattr(config, "gpu_count", lambda: 2)
    assert config.auto_preset() == "kaggle_t4x2"
    monkeypatch.setattr(config, "gpu_count", lambda: 0)
    assert config.auto_preset() == "cpu_smoke"


def test_the_large_gpu_preset_scales_the_rate_by_the_square_root_rule():
    large, single = config.read_preset("large_gpu")[1], config.read_preset("single_gpu")[1]
    assert large["batch_size"] == 8 * single["batch_size"] and large["compile"] is True
    assert large["lr"] == pytest.approx(single["lr"] * math.sqrt(8), rel=0.01)
    assert config.from_scratch_lr(256) == pytest.approx(1e-3 * math.sqrt(8)) and config.from_scratch_lr() == 1e-3
    for name in ("single_gpu", "kaggle_t4x2"):  # the T4 presets stay as they were
        assert config.read_preset(name)[1]["batch_size"] == 32 and config.read_preset(name)[1]["lr"] == 5e-5


def test_compile_mode_turns_compile_on_and_pads_to_four_widths():
    cfg = config.parse("t", ["--config", "cpu_smoke", "--compile_mode", "reduce-overhead"])
    assert cfg.compile and cfg.compile_mode == "reduce-overhead"
    assert batching.loader_options(cfg, 0, torch.device("cpu"))["pad_to_multiple_of"] == 16  # max_length 64
    assert batching.static_width_multiple(128) == 32 and batching.static_width_multiple(100) == 8
    typed = config.parse("t", ["--config", "cpu_smoke", "--compile_mode", "reduce-overhead", "--pad_multiple", "8"])
    assert batching.loader_options(typed, 0, torch.device("cpu"))["pad_to_multiple_of"] == 8  # a typed value wins
    with pytest.raises(UserError, match="--no-compile"):
        config.parse("t", ["--compile_mode", "reduce-overhead", "--no-compile"])
    assert not config.parse("t", ["--config", "cpu_smoke"]).compile


@pytest.mark.bench
@pytest.mark.slow
def test_the_graphs_path_on_a_cpu_runs_resumes_and_trains_under_ddp(tmp_path):
    """bench/graphs_check as the GPU script runs it (on a CPU reduce-overhead only compiles: ~2 minutes here):
    the loss of every step equals eager's, a run resumes from its snapshot, train_ddp.py runs it on 2 gloo ranks."""
    from distrinews_course.bench import graphs_check

    res = graphs_check.check(tmp_path, steps=4)
    assert res["loss_curve"]["same"], res["loss_curve"]
    assert res["resume"]["ok"] and res["resume"]["epochs"] == [1, 2], res["resume"]
    assert res["ddp"]["ok"] and res["ddp"]["processes"] == 2 and res["ddp"]["backend"] == "gloo"


@pytest.mark.bench
@pytest.mark.slow
def test_bench_train_preset_and_floor_sections_on_a_cpu(tmp_path):
    from .helpers import run_script

    out = tmp_path / "t.json"
    r = run_script([ROOT / "scripts" / "bench_train.py", "--quick", "--sections", "preset,floor", "--no-plots",
                    "--out", out], timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["launch_floor"]["kind"] == "PROXY" and "NOT a measurement" in res["launch_floor"]["what"]
    assert res["launch_floor"]["eager"]["seconds_per_step"] > 0 and res["launch_floor"]["cores"]
    forecast = res["t4_forecast"]
    assert "FORECAST" in forecast["label"] and forecast["floors"]["eager"]["2x speedup"] > 0
    assert res["preset"]["variants"]["eager"]["samples_per_s"] > 0 and res["preset"]["lr"] == pytest.approx(1.41e-4)
    assert "gpu_large_gpu_preset_mfu" not in res["targets"]  # a CPU claims no GPU target


def test_bench_train_update_merges_one_device_calls_sections_into_the_last_ones_file():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_train_for_merge", ROOT / "scripts" / "bench_train.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    race = {"compare": {"x": 1}, "git_commit": "a", "started": "t0", "command": "race", "seconds_total": 300.0}
    extras = {"preset": {"y": 2}, "launch_floor": {"kind": "MEASURED"}, "t4_forecast": {}, "compare": {"stale": 1},
              "git_commit": "a", "started": "t1", "command": "extras", "seconds_total": 200.0}  # fmt: skip
    merged = bench.merge_parts(race, extras, {"preset", "floor"})
    assert merged["compare"] == {"x": 1} and merged["preset"] == {"y": 2} and merged["launch_floor"]["kind"]
    assert [p["command"] for p in merged["parts"]] == ["race", "extras"] and merged["seconds_total"] == 500.0
