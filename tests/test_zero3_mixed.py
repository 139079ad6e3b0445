"""ZeRO-3 by hand in mixed precision (scripts/by_hand/zero3.py's param_dtype and reduce_dtype): as a peer's script uses
it after a bare init_process_group, against torch's FSDP2 with the same MixedPrecisionPolicy and against one process
that casts the same way (tests/workers/zero3_mixed.py, 2 gloo ranks); chapter 03's race section on it (race_mixed.py);
its clear errors; and chapter 06's calculator's mode for its split (memory.MIXED_FSDP)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from distrinews_course import memory
from distrinews_course.by_hand import models, report
from distrinews_lib.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
DTYPES = ("float32", "float16", "bfloat16")


def zero3():
    spec = importlib.util.spec_from_file_location("zero3_under_test", ROOT / "scripts" / "by_hand" / "zero3.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def peers(tmp_path_factory):
    out = tmp_path_factory.mktemp("zero3_mixed") / "mixed.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    proc = subprocess.run(
        [*cmd, str(ROOT / "tests" / "workers" / "zero3_mixed.py"), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())["ranks"]


@pytest.mark.slow
def test_a_peers_plain_sgd_over_the_shards_matches_one_process_that_casts_the_same_way(peers):
    """Three steps of torch.optim.SGD over dp.parameters() (the fp32 master shards) on 2 ranks, against one process
    doing the same arithmetic with both ranks' batches: within 1e-4 in every dtype gloo carries (all three)."""
    for rank in peers:
        for kind in ("tiny", "tied"):
            for name in DTYPES:
                got = rank["one_process"][f"{kind} {name}"]
                assert got["max_diff"] <= 1e-4, (kind, name, got)
                assert got["dtypes"] == ["torch.float32"], (kind, name, got)  # what SGD stepped: the fp32 masters


@pytest.mark.slow
def test_equal_to_fsdp2s_mixed_precision_policy_bit_for_bit(peers):
    """The same MixedPrecisionPolicy(param_dtype, reduce_dtype=float32) on the course's model and the tied GPT-2, three
    steps of AdamW: the same casts, the same sums in the same order, so the same bits (tolerance 0)."""
    for rank in peers:
        for key, got in rank["fsdp2"].items():
            assert got["max_diff"] == 0.0, (key, got)
        assert set(rank["fsdp2"]) == {f"{k} {n}" for k in ("tiny", "tied") for n in DTYPES}


@pytest.mark.slow
def test_each_gather_moves_half_the_bytes_in_half_precision(peers):
    gathers = peers[0]["gather_bytes"]
    for kind in ("tiny", "tied"):
        full = gathers[f"{kind} float32"]
        assert len(full) == 2 * (len(models.layers(models.build_model(kind, 0))) + 1)  # every block, twice
        for name in ("float16", "bfloat16"):
            assert [2 * b for b in gathers[f"{kind} {name}"]] == full, (kind, name)


@pytest.mark.slow
def test_float16_trains_with_torchs_grad_scaler_over_the_fp32_shards(peers):
    """GradScaler's first scale overflows the tiny model's float16 gradients: the scaler skips those steps and halves
    its scale until one is taken; the weights end finite and moved (it unscales the fp32 gradients on the shards)."""
    for rank in peers:
        g = rank["grad_scaler"]
        assert g["scales"][0] == 2.0**16 and min(g["scales"]) < g["scales"][0], g
        assert g["finite"] and g["moved"] > 0, g


# Chapter 03 asserts the same on the race's mixed section under nbval (the cell after its launch)
@pytest.mark.also_in_notebook
@pytest.mark.slow
def test_the_race_section_against_fsdp2_the_bytes_the_loss_scale_and_the_memory(tmp_path):
    res = report.run_race(["--sections", "mixed", "--models", ""], tmp_path / "mixed.json")["mixed"]
    assert res["vs_fsdp2"] == {"float16": 0.0, "bfloat16": 0.0}
    c = res["collectives"]
    assert [2 * e["bytes"] for e in c["float16"] if e["name"].startswith("gather")] == [
        e["bytes"] for e in c["float32"] if e["name"].startswith("gather")
    ]
    u = res["underflow"]
    assert u["float16 x1"]["lost_share"] > 10 * u["float16 x1024"]["lost_share"] > 0, u
    assert u["float16 x65536"]["nonfinite"] > 0 and u["bfloat16"]["nonfinite"] == 0, u
    for label in ("zero3 float32", "zero3 float16", "fsdp2 float16"):
        m = res["memory"][label]
        assert all(abs(p / m["calculator_mb"] - 1) <= 0.15 for p in m["compute_mb_per_rank"]), (label, m)
    low, full = res["memory"]["zero3 float16"], res["memory"]["zero3 float32"]
    assert all(a < b for a, b in zip(low["compute_mb_per_rank"], full["compute_mb_per_rank"])), (low, full)  # each rank


@pytest.fixture
def one_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_param_dtype_must_be_a_floating_dtype(one_rank):
    rung = zero3()
    for bad in ("float16", torch.int8, 2):
        with pytest.raises(UserError, match="param_dtype and reduce_dtype take a floating torch.dtype"):
            rung.Zero3DP(models.build_model("tiny", 0), param_dtype=bad)


def test_a_backend_that_cannot_carry_the_dtype_is_named_at_construction(one_rank, monkeypatch):
    rung = zero3()

    def refuses(*args, **kwargs):
        raise RuntimeError("ProcessGroupGloo::allgather: invalid tensor type")

    monkeypatch.setattr(rung.dist, "all_gather_into_tensor", refuses)
    with pytest.raises(UserError, match=r"backend \(gloo\) cannot all-gather torch.bfloat16: choose a param_dtype"):
        rung.Zero3DP(models.build_model("tiny", 0), param_dtype=torch.bfloat16)


def test_the_defaults_keep_the_models_dtype_and_reduce_in_the_masters(one_rank):
    rung = zero3()
    dp = rung.Zero3DP(models.build_model("tiny", 0))
    assert dp.param_dtype == dp.reduce_dtype == torch.float32
    dp = rung.Zero3DP(models.build_model("tiny", 0), param_dtype=torch.float16)
    assert (dp.param_dtype, dp.reduce_dtype) == (torch.float16, torch.float32)  # FSDP2 would reduce in float16
    assert {p.dtype for p in dp.parameters()} == {torch.float32}
    assert {b.full.dtype for b in dp.blocks} == {torch.float16}


def test_the_calculators_mode_for_fsdp2s_split():
    """MIXED_FSDP at stage 3: the fp32 master shard, its fp32 gradients and AdamW's moments as fp32; the gathered unit
    (its weights and their gradients in the compute dtype, the reduce-scatter's buffer in fp32) and the activations
    in 2 bytes. The other modes are unchanged: fp32 and the ZeRO paper's count 3 x their weight bytes per unit."""
    fp32 = memory.estimate("tiny", 8, 64, "fp32", 3, 2, impl="even").parts
    mixed = memory.estimate("tiny", 8, 64, memory.MIXED_FSDP, 3, 2, impl="even").parts
    paper = memory.estimate("tiny", 8, 64, "mixed (fp16 + fp32 master)", 3, 2, impl="even").parts
    for part in ("weights", "gradients", "optimizer state", "AdamW temporaries"):
        assert mixed[part] == fp32[part], part
    assert mixed["activations"] == memory.activation_bytes(memory.SHAPES["tiny"], 8, 64, 2)
    assert mixed["gathered unit"] == pytest.approx(fp32["gathered unit"] * (2 * 2 + 4) / 12, abs=1)
    assert paper["gathered unit"] == pytest.approx(fp32["gathered unit"] / 2, abs=1)
    torch_mixed = memory.estimate("tiny", 8, 64, memory.MIXED_FSDP, 3, 2, impl="torch").parts
    unit = sum(memory.SHAPES["tiny"].tensors()[:4] + memory.SHAPES["tiny"].tensors()[-4:])
    assert torch_mixed["gathered unit"] - mixed["gathered unit"] == pytest.approx(2 * unit, abs=1)  # FSDP2's copy-out
    unsharded = memory.estimate("tiny", 8, 64, memory.MIXED_FSDP, 0, 2).parts
    assert unsharded["gathered unit"] == 2 * memory.SHAPES["tiny"].n_params  # the compute copy of every weight
