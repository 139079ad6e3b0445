"""scripts/gpu_check.py: its CPU-checkable part runs here (CI has no GPU): --dry-run, the plan, the parsers
of each stage's output, the T4 estimate, and clear refusals."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from distrinews_course.bench import gpu_estimate, gpu_stages

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def gc():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = mod  # its dataclasses look their module up while being defined
    spec.loader.exec_module(mod)
    return mod


def _args(gc, *argv):
    return gc.build_arg_parser().parse_args(list(argv))


def test_dry_run_writes_a_marked_json_and_checks_every_command(gc, tmp_path, capsys):
    out = tmp_path / "gpu.json"
    assert gc.main(["--dry-run", "--out", str(out), "--run_dir", str(tmp_path / "run"), "--offline"]) == 0
    res = json.loads(out.read_text())
    assert res["dry_run"] is True and "nothing was measured" in res["dry_run_note"]
    assert [s["name"] for s in res["plan"]] == list(gc.STAGES)
    assert all(res["stages"][n]["skipped"] == "dry run" for n in gc.STAGES[1:])
    assert sum("command line accepted" in c for c in res["checks"]) == 8  # 7 launched stages + serving
    for key in ("machine", "versions", "git_commit", "command"):
        assert key in res  # provenance
    assert res["env"]["lines"] and res["flops_per_text_distilbert_base"]["flops_per_text"] > 1e9
    est = res["t4_epoch_estimate"]
    assert "FORECAST" in est["label"] and est["seed_claims_minutes"] == {"1x T4": 8.0, "2x T4": 4.5}
    train = next(s for s in res["plan"] if s["name"] == "train_fp16")["cmd"]
    assert "--amp" in train and train[train.index("--amp") + 1] == "fp16"
    assert train[train.index("--data") + 1] != "hub"  # never the network
    assert "checked: 10 command lines" in capsys.readouterr().out


def test_the_default_dry_run_json_never_lands_in_benchmarks(gc):
    args = _args(gc, "--dry-run")
    assert args.out is None and gc.device_slug(True).endswith("_dry_run")


def test_plan_on_two_t4s(gc, tmp_path):
    args = _args(gc)
    stages = {
        s.name: s
        for s in gc.make_plan(args, n_gpus=2, bf16_native=False, model="minilm", data_arg="/data/ag", run_dir=tmp_path)
    }
    assert all(s.skip is None for s in stages.values())
    ddp = stages["ddp_nccl"].cmd
    assert "--nproc_per_node=2" in ddp and ddp[-2:] == ["--backend", "nccl"]
    assert "expected: refused" in stages["train_bf16"].what
    bench = stages["bench_train"].cmd
    assert bench[bench.index("--sections") + 1] == "compare,preset,floor,ddp"
    nb = stages["notebooks"]
    assert nb.cmd[nb.cmd.index("--preset") + 1] == "single_gpu" and nb.env == {"DISTRINEWS_DATA_DIR": "/data/ag"}


def test_plan_without_a_gpu_skips_every_gpu_stage_and_only_selects(gc, tmp_path):
    stages = gc.make_plan(_args(gc), n_gpus=0, bf16_native=None, model="tiny", data_arg="embedded", run_dir=tmp_path)
    assert all(s.skip == "no CUDA GPU on this machine" for s in stages[1:])
    stages = gc.make_plan(
        _args(gc, "--only", "train_fp16,serving"),
        n_gpus=1,
        bf16_native=True,
        model="tiny",
        data_arg="embedded",
        run_dir=tmp_path,
    )
    assert [s.name for s in stages if s.skip is None] == ["train_fp16", "serving"]
    assert "--nproc_per_node=1" in next(s for s in stages if s.name == "ddp_nccl").cmd  # one rank with one GPU


def test_pytest_parser_fails_a_cuda_test_skipped_on_a_cuda_machine():
    stage = SimpleNamespace(name="cuda_tests")
    good = SimpleNamespace(
        ok=True, output="SKIPPED [1] tests/test_x.py:3: checks the no-GPU message\n12 passed, 1 skipped in 3s"
    )
    assert gpu_stages.parse_pytest(stage, good, {})["status"] == "ok"
    bad = SimpleNamespace(
        ok=True, output="SKIPPED [2] tests/test_gpu_cuda.py:20: needs a CUDA GPU\n3 passed, 2 skipped in 1s"
    )
    res = gpu_stages.parse_pytest(stage, bad, {})
    assert res["status"] == "FAILED" and res["skipped_for_want_of_cuda"] and res["counts"]["passed"] == 3


def test_training_parser(tmp_path):
    refused = SimpleNamespace(
        ok=False,
        returncode=2,
        output="error: --amp bf16: Tesla T4 (compute capability 7.5) has no bf16 in hardware; torch would emulate it",
    )
    res = gpu_stages.parse_training(SimpleNamespace(name="train_bf16", out=str(tmp_path)), refused, {})
    assert res["status"] == "ok" and res["refused_as_designed"]
    metrics = {
        "epochs": [{"samples_per_s": 900.0, "tokens_per_s": 45000.0, "epoch_time_s": 9.0, "val_accuracy": 0.9}],
        "data": {"train_size": 8000, "source": "embedded"},
        "model": {"resolved": "minilm"},
        "ddp": {"world_size": 2, "backend": "nccl"},
    }
    (tmp_path / "metrics.json").write_text(json.dumps(metrics))
    text = (
        "preset single_gpu | 2 processes | nccl | device cuda:0 | fp16 + GradScaler: Tesla T4 has no native bf16 (e.g. T4)\n"  # noqa: E501
        "epoch 1/1 | train loss 0.3 | val loss 0.3 | val acc 90.00% (2000 texts) | 9.0s | 900 samples/s | MFU 31.2%\n"
        "parameters identical on all 2 ranks: True (max difference 0)\n"
    )
    res = gpu_stages.parse_training(
        SimpleNamespace(name="ddp_nccl", out=str(tmp_path)), SimpleNamespace(ok=True, returncode=0, output=text), {}
    )
    assert res["status"] == "ok" and res["mfu"] == pytest.approx(0.312) and res["params_identical"]
    assert res["amp"].startswith("fp16 + GradScaler")
    res = gpu_stages.parse_training(
        SimpleNamespace(name="ddp_nccl", out=str(tmp_path)),
        SimpleNamespace(ok=True, returncode=0, output=text.replace("True", "False")),
        {},
    )
    assert res["status"] == "FAILED"


def test_t4_estimate_arithmetic():
    est = gpu_estimate.t4_epoch_estimate(13e9, {"a": 0.25, "none": None}, rows=120_000, ddp_efficiency=0.9)
    one = 120_000 * 13e9 / (65e12 * 0.25) / 60
    assert est["scenarios"]["a"]["1x T4 minutes"] == pytest.approx(one, abs=0.01)
    assert est["scenarios"]["a"]["2x T4 minutes"] == pytest.approx(one / 1.8, abs=0.01)
    assert "none" not in est["scenarios"] and "floors" not in est


def test_t4_forecast_counts_the_cpu_floor():
    gpu_step = 32 * 13e9 / (65e12 * 0.25)  # 25.6 ms
    est = gpu_estimate.t4_epoch_estimate(13e9, {"a": 0.25}, {"low": 0.010, "high": 0.040}, ddp_efficiency=0.9)
    low, high = est["floors"]["low"], est["floors"]["high"]
    assert low["bound"] == "GPU" and low["1x_step_seconds"] == pytest.approx(gpu_step)
    assert low["2x speedup"] == pytest.approx(1.8, abs=1e-3)  # GPU-bound: DDP's efficiency decides
    assert high["bound"] == "CPU launch floor" and high["1x_step_seconds"] == 0.040
    assert high["2x speedup"] == pytest.approx(2.0, abs=1e-3)  # host-bound on both: each rank its own 2 vCPUs
    assert high["1x T4 minutes"] == pytest.approx(120_000 / 32 * 0.040 / 60, abs=0.01)
    assert high["2x T4 minutes"] == pytest.approx(120_000 / 64 * 0.040 / 60, abs=0.01)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--dry-run", "--data-dir", "/nonexistent/ag"], "does not exist"),
        (["--dry-run", "--only", "nope"], "unknown stage"),
        (["--dry-run", "--num_samples", "1"], "too small"),
    ],
)
def test_bad_input_is_one_paragraph(gc, capsys, argv, message):
    with pytest.raises(SystemExit) as stop:
        gc.main(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU refusal")
def test_without_cuda_it_says_to_use_dry_run():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--offline"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 2 and "--dry-run" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_serving_stage_end_to_end_on_the_cpu(gc, tmp_path):
    """The serving stage's own logic (start, /health, /predict, /predict/batch, stop) with a tiny checkpoint;
    on the GPU machine the same function runs with device='cuda'."""
    from .test_serving import make_checkpoint  # the stage needs a servable checkpoint, not a trained one

    ckpt = tmp_path / "train" / "model.pt"
    ckpt.parent.mkdir()
    make_checkpoint(ckpt)
    stage = gc.Stage("serving", "test", None, timeout=120, out=str(ckpt))
    texts = [f"Stocks rally as markets open, day {i}" for i in range(70)]
    res = gc.serving_stage(stage, tmp_path, texts, device="cpu")
    assert res["status"] == "ok", res
    assert res["device"] == "cpu" and res["batch_answers"] == 64
    assert 0 < res["single_request_latency_ms"]["p50"] <= res["single_request_latency_ms"]["p95"]
    missing = gc.serving_stage(gc.Stage("serving", "test", None, out=str(tmp_path / "none.pt")), tmp_path, texts, "cpu")
    assert missing["status"] == "FAILED" and "no checkpoint" in missing["why"]


def test_the_course_stage_writes_its_gpu_record(tmp_path):
    runs = tmp_path / "runs" / "20270101-000000"
    runs.mkdir(parents=True)
    chapters = [
        {"name": f"{i:02d}_x", "status": "ok", "seconds": 10.0 + i, "headline": "f", "record": {}} for i in range(12)
    ]
    summary = {"preset": "single_gpu", "nproc": "auto", "seconds": 200.0, "machine": {"gpus": ["H100"]}}
    (runs / "summary.json").write_text(json.dumps({**summary, "notebooks": chapters}))
    stage = SimpleNamespace(name="notebooks", cmd=["python", "x", "--runs-dir", str(tmp_path / "runs")],
                            out=str(tmp_path / "course_gpu_x.json"))  # fmt: skip
    res = gpu_stages.parse_course(stage, SimpleNamespace(ok=True), {})
    record = json.loads((tmp_path / "course_gpu_x.json").read_text())
    assert res["status"] == "ok" and record["chapters_ok"] == "12 of 12" and record["device"] == ["H100"]
    assert [c["seconds"] for c in record["chapters"]][:2] == [10.0, 11.0] and "git_commit" in record
    chapters[5].update(status="FAILED", error="05 failed at cell 3")
    (runs / "summary.json").write_text(json.dumps({**summary, "notebooks": chapters}))
    res = gpu_stages.parse_course(stage, SimpleNamespace(ok=False), {})
    record = json.loads((tmp_path / "course_gpu_x.json").read_text())
    assert res["status"] == "FAILED" and record["chapters_ok"] == "11 of 12" and record["chapters"][5]["error"]
    # a second part (run_course --only 05) replaces the chapter it ran and keeps the others
    (runs / "summary.json").write_text(json.dumps({**summary, "seconds": 30.0, "notebooks": [
        {"name": "05_x", "status": "ok", "seconds": 30.0, "headline": "g", "record": {}}]}))  # fmt: skip
    res = gpu_stages.parse_course(stage, SimpleNamespace(ok=True), {})
    record = json.loads((tmp_path / "course_gpu_x.json").read_text())
    assert res["status"] == "ok" and record["chapters_ok"] == "12 of 12" and len(record["parts"]) == 3
    assert record["chapters"][5] == {
        "chapter": "05_x",
        "status": "ok",
        "seconds": 30.0,
        "key_figures": "g",
        "record": {},
    }
