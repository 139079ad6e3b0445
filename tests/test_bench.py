"""The benchmarks stay runnable: perf arithmetic, and bench_train / bench_accuracy in --quick mode.

No timing is asserted anywhere (the CI machine is shared and noisy): only structure and sanity, such as
positive throughput and the ratio fields being there.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from distrinews_lib import perf

ROOT = Path(__file__).resolve().parent.parent
SHARED_AG_NEWS = ROOT.parent / "shared" / "data" / "ag_news"


def _load_script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


# --------------------------------------------------------------------------- perf arithmetic

def test_flops_per_token_formula():
    shape = perf.ModelShape(n_params=100, n_embedding=40, n_layers=2, dim=8)
    assert shape.n_nonembedding == 60
    # 6N + 12 L d T
    assert perf.flops_per_token(shape, 10) == 6 * 60 + 12 * 2 * 8 * 10
    lengths = [3, 5, 10]
    assert perf.training_flops(shape, lengths) == pytest.approx(sum(t * perf.flops_per_token(shape, t) for t in lengths))


def test_model_shape_of_the_tiny_preset():
    from distrinews_lib.model import TINY_CONFIG, build_model

    model, _, info = build_model("tiny", seed=0)
    shape = perf.model_shape(model)
    assert (shape.n_layers, shape.dim) == (TINY_CONFIG["n_layers"], TINY_CONFIG["dim"])
    assert shape.n_params == info.num_parameters
    assert shape.n_embedding == 30522 * 64 + 512 * 64  # word + position tables
    assert 0 < shape.n_nonembedding < shape.n_params


@pytest.mark.parametrize("name,dtype,peak", [
    ("Tesla T4", "fp16", 65.0), ("Tesla T4", "bf16", None), ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
    ("NVIDIA H100 80GB HBM3", "bf16", 989.0), ("NVIDIA H100 PCIe", "bf16", 756.0), ("NVIDIA L4", "fp16", 121.0),
    ("NVIDIA L40S", "bf16", 362.0), ("NVIDIA A10G", "bf16", None), ("Some Future GPU", "bf16", None),
])
def test_peak_table(name, dtype, peak):
    assert perf.peak_tflops(name, dtype) == peak


def test_mfu_and_rates():
    assert perf.mfu(1e12, None) is None  # a CPU: no peak, no MFU
    assert perf.mfu(65e12 / 2, 65.0) == pytest.approx(0.5)
    assert perf.mfu(65e12, 65.0, n_devices=2) == pytest.approx(0.5)
    assert "MFU 50.0%" in perf.format_rate(10, 100, 1.0, 0.5)
    assert "MFU" not in perf.format_rate(10, 100, 1.0, None)
    assert perf.matmul_dtype("bf16", "cpu") == "bf16" and perf.matmul_dtype("off", "cpu") == "fp32"


def test_step_timer_skips_warmup():
    t = perf.StepTimer(warmup=2)
    for _ in range(5):
        t.step(samples=4, tokens=40, padded_tokens=48)
    r = t.result()
    assert (r["steps"], r["samples"], r["tokens"], r["padded_tokens"]) == (3, 12, 120, 144)
    assert r["seconds"] >= 0 and r["padding_fraction"] == pytest.approx(1 - 120 / 144)
    t0 = perf.StepTimer(warmup=0)
    with pytest.raises(RuntimeError):
        t0.step(samples=1)


def test_summary_ratio_slug_and_provenance():
    assert perf.summary([3, 1, 2])["median"] == 2 and perf.summary([])["n"] == 0
    assert perf.ratio(3.0, 2.0) == 1.5 and perf.ratio(None, 2.0) is None
    slug = perf.machine_slug()
    assert slug and all(c.isalnum() or c == "-" for c in slug)
    prov = perf.provenance(["scripts/bench_train.py", "--quick"])
    for key in ("machine", "cpu", "versions", "git_commit", "command", "started"):
        assert key in prov
    assert prov["command"].endswith("scripts/bench_train.py --quick")
    assert prov["versions"]["torch"] == torch.__version__


def test_foreign_cores_and_quiet_gate():
    assert perf.foreign_cores(None, 1.0, 0.0, 1.0) is None
    assert perf.foreign_cores(10.0, 12.0, 0.5, 1.0) == pytest.approx(1.5)
    gate = perf.QuietGate(max_foreign_cores=100.0, timeout_each_s=1.0, budget_s=0.0)
    assert gate.wait() is None  # no budget: never waits


def test_paired_ratios_use_rounds_side_by_side():
    bench = _load_script("bench_train")
    a = [{"samples_per_s": 20.0, "foreign_cores": 0.0}, {"samples_per_s": 10.0, "foreign_cores": 1.5}]
    b = [{"samples_per_s": 10.0, "foreign_cores": 0.1}, {"samples_per_s": 10.0, "foreign_cores": 0.0}]
    p = bench.paired(a, b)
    assert p["per_round"] == [2.0, 1.0] and p["median_of_rounds"] == 1.5
    assert p["clean_rounds"] == 1 and p["median_of_clean_rounds"] == 2.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (MFU and AMP are measured there)")
def test_mfu_is_reported_on_cuda(tmp_path):
    out = tmp_path / "train.json"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_train.py"), "--quick", "--sections", "compare",
                    "--out", str(out), "--no-plots"], check=True, cwd=ROOT, timeout=600)
    res = json.loads(out.read_text())
    ours = res["compare"]["tiny"]["contenders"]["ours"]
    assert res["settings"]["device"].startswith("cuda")
    if perf.peak_tflops(torch.cuda.get_device_name(0), "bf16") or perf.peak_tflops(torch.cuda.get_device_name(0), "fp16"):
        assert ours["mfu"]["median"] > 0


# --------------------------------------------------------------------------- the scripts, --quick

@pytest.mark.slow
def test_bench_train_quick(tmp_path):
    out = tmp_path / "train_quick.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_train.py"), "--quick", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    for key in ("machine", "cpu", "versions", "git_commit", "command", "settings", "data", "targets"):
        assert key in res, key
    assert "--quick" in res["command"]
    tiny = res["compare"]["tiny"]
    ours = tiny["contenders"]["ours"]
    assert ours["samples_per_s"]["median"] > 0 and ours["tokens_per_s"]["median"] > 0
    assert 0 <= ours["padding_fraction"]["median"] < 1
    if _has("accelerate"):
        trainer = tiny["contenders"]["hf_trainer"]
        assert trainer["samples_per_s"]["median"] > 0
        assert tiny["ratios"]["ours / hf_trainer"]["median_of_rounds"] > 0
        assert "cpu_tiny_ours_vs_trainer" in res["targets"] or not res["settings"]["device"] == "cpu"
    scaling = res["ddp"]["scaling"]
    two = [r for r in scaling if r["processes"] == 2]
    assert two and two[0]["speedup"] > 0 and two[0]["efficiency"] == pytest.approx(two[0]["speedup"] / 2)
    for plot in res["plots"]:
        assert Path(plot).exists() or (ROOT / plot).exists()


@pytest.mark.slow
@pytest.mark.skipif(not SHARED_AG_NEWS.is_dir() and not os.environ.get("DISTRINEWS_DATA_DIR"),
                    reason="needs the real AG News folder (../shared/data/ag_news or $DISTRINEWS_DATA_DIR)")
def test_bench_accuracy_quick(tmp_path):
    out = tmp_path / "acc.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_accuracy.py"), "--quick", "--out", str(out),
                           "--runs_dir", str(tmp_path / "runs")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    for side in ("single", "ddp"):
        assert 0.0 <= res[side]["accuracy"] <= 1.0
        assert res[side]["command"] and res[side]["eval_examples"] > 0
    assert res["single"]["world_size"] == 1 and res["ddp"]["world_size"] == res["settings"]["nproc"]
    assert res["single"]["global_batch_size"] == res["ddp"]["global_batch_size"]
    assert res["same_eval_set"] and res["gap_points"] >= 0
    assert "ddp_matches_single" in res["targets"] and "command" in res and "git_commit" in res


def test_bench_accuracy_skips_without_data(capsys):
    bench = _load_script("bench_accuracy")
    assert bench.main(["--quick", "--data", "/nonexistent/ag_news"]) == 0
    assert "SKIP" in capsys.readouterr().out
