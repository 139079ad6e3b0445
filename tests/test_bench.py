"""The benchmarks stay runnable and their arithmetic stays right: FLOPs/MFU (checked against torch's own
FLOP counter), timing helpers, provenance, and bench_train / bench_accuracy in --quick mode.

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
import torch.nn.functional as F

from distrinews_course.bench import (
    provenance,
    throughput,
    timing,
    train_measure,
    train_scaling,
    train_setup,
    train_stats,
)
from distrinews_lib.data.texts import AG_NEWS_LABELS
from distrinews_lib.errors import UserError
from distrinews_lib.training import flops
from distrinews_lib.training.config import RunConfig

ROOT = Path(__file__).resolve().parent.parent


def _load_script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _run(args, timeout=300, env=None):
    return subprocess.run(
        [sys.executable, *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )


@pytest.fixture(scope="module")
def bench():
    return _load_script("bench_train")


# --------------------------------------------------------------------------- FLOPs and MFU


def test_training_flops_formula():
    shape = flops.ModelShape(n_params=100, n_embedding=40, n_layers=2, dim=8)
    assert shape.n_nonembedding == 60
    # 6 N ΣT + 12 L d ΣT²
    lengths = [3, 5, 10]
    expected = 6 * 60 * 18 + 12 * 2 * 8 * (9 + 25 + 100)
    assert throughput.training_flops(shape, lengths) == expected
    assert flops.training_flops_from_sums(shape, 18, 134) == expected
    assert throughput.training_flops(shape, []) == 0


def _linear_weights(module) -> int:
    return sum(m.weight.numel() for m in module.modules() if isinstance(m, torch.nn.Linear))


def _counted_training_flops(model, lengths) -> int:
    """torch.utils.flop_counter's count of forward + backward, one text per batch (so no padding)."""
    from torch.utils.flop_counter import FlopCounterMode

    total = 0
    gen = torch.Generator().manual_seed(0)
    for t in lengths:
        ids = torch.randint(1000, 2000, (1, t), generator=gen)
        with FlopCounterMode(display=False) as counter:
            logits = model(input_ids=ids, attention_mask=torch.ones(1, t, dtype=torch.long)).logits
            F.cross_entropy(logits.float(), torch.tensor([1])).backward()
        total += counter.get_total_flops()
        model.zero_grad(set_to_none=True)
    return total


def test_mfu_formula_against_torch_flop_counter():
    """throughput.training_flops vs FlopCounterMode on the tiny model, forward + backward, texts of different lengths.

    FlopCounterMode counts matmuls (and attention), 2 FLOPs per multiply-add, the backward as gradients w.r.t.
    inputs and weights. It agrees with the formula EXACTLY once two known simplifications of the formula are
    accounted for:
      1. the formula's 6N counts every non-embedding parameter for every token, but biases and LayerNorm
         weights are elementwise work (the counter, like the formula's own definition, counts no elementwise op:
         no GELU, softmax, LayerNorm, dropout, loss or optimizer);
      2. the classification head (pre_classifier + classifier) runs on ONE token per text, not on every token.
    Attention's 12·L·d·ΣT² term matches the counted Q·Kᵀ and softmax·V matmuls exactly.
    """
    from distrinews_lib.models.build import build_model

    model, _, _ = build_model(RunConfig(model="tiny", seed=0), AG_NEWS_LABELS)
    model.train()
    shape = flops.model_shape(model)
    lengths = [5, 17, 40, 64]
    counted = _counted_training_flops(model, lengths)
    formula = throughput.training_flops(shape, lengths)

    layers = _linear_weights(model.distilbert.transformer)  # matmul weights, run on every token
    head = _linear_weights(model) - layers  # pre_classifier + classifier: one token per text
    elementwise = shape.n_nonembedding - layers - head  # biases and LayerNorm weights
    assert elementwise > 0 and head > 0
    n, tokens = len(lengths), sum(lengths)
    assert counted == 6 * layers * tokens + 6 * head * n + 12 * shape.n_layers * shape.dim * sum(t * t for t in lengths)
    assert formula - counted == 6 * tokens * (elementwise + head) - 6 * n * head
    # The bound: the formula over-counts by 6·ΣT·(biases + LayerNorm + head) / its own total. On the tiny model
    # (dim 64) the head is 4% of the non-embedding weights, so the over-count is about 6%; never under-counts.
    assert 0 < formula / counted - 1 < 0.08


def test_mfu_formula_overcount_is_small_on_distilbert_base():
    """DistilBERT-base's shape (6 layers, dim 768; a small vocabulary, which the formula leaves out anyway):
    the formula over-counts FlopCounterMode by under 2% (the head is 0.6M of 43M non-embedding weights)."""
    from transformers import AutoModelForSequenceClassification, DistilBertConfig

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(DistilBertConfig(vocab_size=2048, num_labels=4))
    model.train()
    lengths = [24, 48]
    counted = _counted_training_flops(model, lengths)
    formula = throughput.training_flops(flops.model_shape(model), lengths)
    assert 0 < formula / counted - 1 < 0.02


def test_model_shape_of_the_tiny_preset():
    from distrinews_lib.models.build import TINY_CONFIG, build_model

    model, _, info = build_model(RunConfig(model="tiny", seed=0), AG_NEWS_LABELS)
    shape = flops.model_shape(model)
    assert (shape.n_layers, shape.dim) == (TINY_CONFIG["n_layers"], TINY_CONFIG["dim"])
    assert shape.n_params == info.num_parameters
    assert shape.n_embedding == 30522 * 64 + 512 * 64  # word + position tables
    assert 0 < shape.n_nonembedding < shape.n_params


@pytest.mark.parametrize(
    "name,dtype,peak",
    [
        ("Tesla T4", "fp16", 65.0),
        ("Tesla T4", "bf16", None),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
        ("NVIDIA H100 80GB HBM3", "bf16", 989.0),
        ("NVIDIA H100 PCIe", "bf16", 756.0),
        ("NVIDIA L4", "fp16", 121.0),
        ("NVIDIA L40S", "bf16", 362.0),
        ("NVIDIA A10G", "bf16", None),
        ("Some Future GPU", "bf16", None),
        ("NVIDIA H200", "bf16", 989.0),
    ],
)
def test_peak_table(name, dtype, peak):
    assert flops.peak_tflops(name, dtype) == peak


def test_mfu_and_rates():
    assert flops.mfu(1e12, None) is None  # a CPU: no peak, no MFU
    assert flops.mfu(65e12 / 2, 65.0) == pytest.approx(0.5)
    assert flops.mfu(65e12, 65.0, n_devices=2) == pytest.approx(0.5)
    assert "MFU 50.0%" in timing.format_rate(10, 100, 1.0, 0.5)
    assert "MFU" not in timing.format_rate(10, 100, 1.0, None)
    assert flops.matmul_dtype("bf16", "cpu") == "bf16" and flops.matmul_dtype("off", "cpu") == "fp32"
    assert flops.device_peak(torch.device("cpu"), "bf16") is None


# --------------------------------------------------------------------------- timing and provenance


def test_step_timer_skips_warmup():
    t = timing.StepTimer(warmup=2)
    for _ in range(5):
        t.step(samples=4, tokens=40, padded_tokens=48)
    r = t.result()
    assert (r["steps"], r["samples"], r["tokens"], r["padded_tokens"]) == (3, 12, 120, 144)
    assert r["seconds"] >= 0 and r["padding_fraction"] == pytest.approx(1 - 120 / 144)
    t0 = timing.StepTimer(warmup=0)
    with pytest.raises(RuntimeError):
        t0.step(samples=1)


def test_summary_ratio_slug_and_provenance():
    assert timing.summary([3, 1, 2])["median"] == 2 and timing.summary([])["n"] == 0
    assert timing.ratio(3.0, 2.0) == 1.5 and timing.ratio(None, 2.0) is None
    slug = provenance.machine_slug()
    assert slug and all(c.isalnum() or c == "-" for c in slug)
    prov = provenance.provenance(["scripts/bench_train.py", "--quick"])
    for key in ("machine", "cpu", "versions", "git_commit", "command", "started"):
        assert key in prov
    assert prov["command"].endswith("scripts/bench_train.py --quick")
    assert prov["versions"]["torch"] == torch.__version__


def test_foreign_cores_and_quiet_gate():
    assert timing.foreign_cores(None, 1.0, 0.0, 1.0) is None
    assert timing.foreign_cores(10.0, 12.0, 0.5, 1.0) == pytest.approx(1.5)
    gate = timing.QuietGate(max_foreign_cores=100.0, timeout_each_s=1.0, budget_s=0.0)
    assert gate.wait() is None  # no budget: never waits


# --------------------------------------------------------------------------- bench_train's pieces


def test_paired_ratios_use_rounds_side_by_side():
    a = [{"samples_per_s": 20.0, "foreign_cores": 0.0}, {"samples_per_s": 10.0, "foreign_cores": 1.5}]
    b = [{"samples_per_s": 10.0, "foreign_cores": 0.1}, {"samples_per_s": 10.0, "foreign_cores": 0.0}]
    p = train_stats.paired(a, b)
    assert p["per_round"] == [2.0, 1.0] and p["median_of_rounds"] == 1.5
    assert p["clean_rounds"] == 1 and p["median_of_clean_rounds"] == 2.0


def test_bench_data_auto_never_hard_codes_a_path(monkeypatch, tmp_path):
    monkeypatch.setenv("DISTRINEWS_DATA_DIR", str(tmp_path))
    assert train_setup.resolve_data("auto") == str(tmp_path)
    monkeypatch.delenv("DISTRINEWS_DATA_DIR")
    assert train_setup.resolve_data("auto") == "embedded"  # the real AG News sample inside distrinews_lib
    monkeypatch.setenv("DISTRINEWS_DATA_DIR", str(tmp_path / "missing"))
    with pytest.raises(UserError, match="DISTRINEWS_DATA_DIR"):
        train_setup.resolve_data("auto")
    with pytest.raises(UserError, match="no such folder"):
        train_setup.resolve_data(str(tmp_path / "nope"))
    for part in [ROOT / "scripts" / "bench_train.py", *(ROOT / "distrinews_course" / "bench").glob("train_*.py")]:
        assert "shared/data" not in part.read_text(), part


def test_bench_contenders_follow_the_device():
    cpu = [name for name, _ in train_setup.ablation_flags(torch.device("cpu"), "all")]
    assert "--no-group_by_length" in cpu and "--no-fused_adam" in cpu  # engine fuses AdamW on the CPU too
    assert "--no-pin_memory" not in cpu and "--amp off" not in cpu  # nothing to switch off on a CPU
    assert not any("proposed" in n for n in cpu)
    argv = train_setup.script_argv(
        model="tiny",
        data_arg="embedded",
        batch_size=8,
        steps=5,
        num_samples=40,
        max_length=64,
        seed=1,
        threads=1,
        out=Path("/tmp/x"),
        device_type="cpu",
        flags=["--no-group_by_length"],
    )
    cfg = train_setup.parse_argv(argv)  # every contender is a command line the training script accepts
    assert (cfg.batch_size, cfg.max_steps_per_epoch, cfg.group_by_length, cfg.snapshots) == (8, 5, False, False)


@pytest.mark.skipif(not _has("accelerate"), reason="Trainer needs accelerate")
def test_trainer_same_options_use_this_transformers_spelling():
    import dataclasses

    from transformers import TrainingArguments

    from distrinews_lib.training import config

    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    opts = train_measure.trainer_options(config.RunConfig(), torch.device("cpu"), same_options=True, compile_=False)
    assert set(opts) <= fields  # every option exists in the installed transformers
    grouping = opts.get("train_sampling_strategy") or opts.get("group_by_length")
    assert grouping in ("group_by_length", True)
    assert opts["optim"] == "adamw_torch_fused" and opts["weight_decay"] == 0.01
    assert (
        train_measure.trainer_options(config.RunConfig(), torch.device("cpu"), same_options=False, compile_=False) == {}
    )
    assert train_measure.trainer_options(config.RunConfig(), torch.device("cpu"), False, compile_=True) == {
        "torch_compile": True
    }


def test_ddp_contenders():
    configs = train_scaling.ddp_configs(dict(global_batches=[64, 256], steps=(3, 2), warmup=1, knobs=True), nproc=2)
    names = [c["name"] for c in configs]
    assert names[:2] == ["G64 x1 (train_single.py)", "G64 x2"]
    assert {c["batch_per_rank"] for c in configs if c["global_batch"] == 64 and c["world"] == 2} == {32}
    assert [c["flags"] for c in configs if c["flags"]] == [["--bucket_cap_mb", "1"], ["--no-gradient_as_bucket_view"]]
    with pytest.raises(UserError, match="not divisible"):
        train_scaling.ddp_configs(dict(global_batches=[64], steps=3, warmup=1), nproc=3)


def test_step_probe_records_each_step_and_waits_once():
    waits = []
    probe = train_measure.StepProbe(warmup=2, wait=lambda: waits.append(1) or "quiet")
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with probe:
        for _ in range(5):
            model(torch.ones(1, 2)).sum().backward()
            opt.step()
    opt.step()  # after the block: the hook is gone
    assert len(probe.cpu) == 5 and waits == [1] and probe.quiet == "quiet"
    assert len(probe.step_cpu_seconds(3)) == 3 and all(s >= 0 for s in probe.step_cpu_seconds(3))


@pytest.mark.parametrize(
    "args,message",
    [
        (["--data", "/nonexistent/ag_news"], "no such folder"),
        (["--models", "gpt9"], "unknown model"),
        (["--sections", "compare,nope"], "unknown nope"),
        (["--rounds", "0"], "at least 1"),
    ],
)
def test_bench_train_bad_input_is_one_paragraph(bench, capsys, args, message):
    before = (os.environ.get("CUDA_VISIBLE_DEVICES"), torch.get_num_threads())
    with pytest.raises(SystemExit) as stop:
        bench.main(["--quick", *args])
    assert stop.value.code == 2
    assert message in capsys.readouterr().err
    assert (
        os.environ.get("CUDA_VISIBLE_DEVICES"),
        torch.get_num_threads(),
    ) == before  # refused before touching anything


def test_bench_train_bad_input_from_the_command_line():
    proc = _run([ROOT / "scripts" / "bench_train.py", "--data", "/nonexistent/ag_news"], timeout=120)
    assert proc.returncode == 2 and "no such folder" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (MFU and AMP are measured there)")
def test_mfu_is_reported_on_cuda(tmp_path):
    out = tmp_path / "train.json"
    proc = _run(
        [ROOT / "scripts" / "bench_train.py", "--quick", "--sections", "compare", "--out", out, "--no-plots"], 600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    ours = res["compare"]["tiny"]["contenders"]["ours"]
    assert res["settings"]["device"].startswith("cuda")
    name = torch.cuda.get_device_name(0)
    if flops.peak_tflops(name, "bf16") or flops.peak_tflops(name, "fp16"):
        assert ours["mfu"]["median"] > 0


# --------------------------------------------------------------------------- the scripts, --quick


@pytest.mark.slow
def test_bench_train_quick(tmp_path, bench):
    out = tmp_path / "train_quick.json"
    proc = _run([ROOT / "scripts" / "bench_train.py", "--quick", "--out", out], timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    for key in ("machine", "cpu", "versions", "git_commit", "command", "settings", "data", "targets", "headline"):
        assert key in res, key
    assert "--quick" in res["command"]
    assert res["data"]["is_synthetic"] is False  # auto: $DISTRINEWS_DATA_DIR or the embedded real sample
    tiny = res["compare"]["tiny"]
    ours = tiny["contenders"]["ours"]
    assert ours["samples_per_s"]["median"] > 0 and ours["tokens_per_s"]["median"] > 0
    assert 0 <= ours["padding_fraction"]["median"] < 1
    assert "scripts/train_single.py" in tiny["commands"]["ours"]  # our loop IS the course's script
    assert tiny["attn_implementation"]
    assert tiny["contenders"]["bare"]["samples_per_s"]["median"] > 0 and tiny["race"]["ours_vs_bare_eager"] > 0
    ops = tiny["step_ops"]  # counted after the rounds: a CPU's proxy of a GPU
    assert ops["ours"]["syncs_per_step"] <= ops["bare"]["syncs_per_step"] and "proxy" in ops["ours"]["what"]
    assert all(r["matmul_dtype"] == "fp32" for r in ours["rounds"])  # the precision that ran, window by window
    if _has("accelerate"):
        for name in ("hf_trainer", "hf_trainer_same_options"):
            assert tiny["contenders"][name]["samples_per_s"]["median"] > 0
            assert tiny["ratios"][f"ours / {name}"]["median_of_rounds"] > 0
        opts = tiny["contenders"]["hf_trainer_same_options"]["rounds"][0]["options"]
        assert opts["optim"] == "adamw_torch_fused"
        # both ratios in the headline: Trainer's defaults and Trainer given our options
        assert res["headline"]["tiny_ours_vs_trainer_defaults_speedup"] > 0
        assert res["headline"]["tiny_ours_vs_trainer_same_options_speedup"] > 0
    scaling = res["ddp"]["scaling"]
    two = [r for r in scaling if r["processes"] == 2]
    assert two and two[0]["speedup"] > 0 and two[0]["efficiency"] == pytest.approx(two[0]["speedup"] / 2)
    ddp = res["ddp"]["contenders"]["G32 x2"]
    assert "train_ddp.py" in ddp["command"] and ddp["rounds"][0]["allreduces"] > 0  # timed by the DDP comm hook
    assert 0 < ddp["comm_fraction"]["median"] <= 1
    for plot in res["plots"]:
        assert Path(plot).exists() or (ROOT / plot).exists()
    # --refresh recomputes the derived parts from the measured figures
    res["headline"] = {}
    out.write_text(json.dumps(res))
    proc = _run([ROOT / "scripts" / "bench_train.py", "--refresh", out], timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    again = json.loads(out.read_text())
    assert again["headline"]["ddp2_global_batch32_speedup"] == pytest.approx(two[0]["speedup"])
    assert "refreshed" in again


@pytest.mark.bench
@pytest.mark.slow
def test_bench_accuracy_quick(tmp_path):
    out = tmp_path / "acc.json"
    proc = _run([ROOT / "scripts" / "bench_accuracy.py", "--quick", "--out", out, "--runs_dir", tmp_path / "runs"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    for side in ("single", "ddp"):
        assert 0.0 <= res[side]["accuracy"] <= 1.0
        assert res[side]["command"] and res[side]["eval_examples"] > 0
        assert not res[side]["data"]["is_synthetic"]
    assert res["single"]["command"].split()[1].endswith("train_single.py")
    assert res["single"]["world_size"] == 1 and res["ddp"]["world_size"] == res["settings"]["nproc"]
    assert res["single"]["global_batch_size"] == res["ddp"]["global_batch_size"]
    assert res["same_eval_set"] and res["gap_points"] >= 0
    assert "ddp_matches_single" in res["targets"] and "command" in res and "git_commit" in res


@pytest.mark.parametrize(
    "args,message",
    [(["--data", "/nonexistent/ag_news"], "no such folder"), (["--data", "synthetic"], "says nothing about AG News")],
)
def test_bench_accuracy_bad_data_is_one_paragraph(capsys, args, message):
    bench_acc = _load_script("bench_accuracy")
    with pytest.raises(SystemExit) as stop:
        bench_acc.main(["--quick", *args])
    assert stop.value.code == 2
    assert message in capsys.readouterr().err
