"""Multi-process DDP tests: 2 gloo ranks on CPU, launched with torchrun through the library's helper."""

import json

import pytest
import torch
from torch.utils.data.distributed import DistributedSampler

from distrinews_course.launch import torchrun
from distrinews_lib.data import batching

from .helpers import ROOT


@pytest.fixture(scope="module")
def ddp_checks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    torchrun(ROOT / "tests" / "workers" / "ddp_checks.py", 2, [out], timeout=240, echo=False)
    return json.loads((out / "ddp_checks.json").read_text())


@pytest.mark.slow
def test_two_ranks_batch_b_match_one_process_batch_2b(ddp_checks):
    # Gradients: the DDP average over ranks equals the gradient of the mean loss over 2b samples.
    assert len(ddp_checks["grad_max_diff_per_step"]) == 5
    assert max(ddp_checks["grad_max_diff_per_step"]) < 1e-5
    # Parameters after 5 AdamW steps.
    assert max(ddp_checks["param_max_diff_per_step"]) < 1e-5


@pytest.mark.slow
def test_every_rank_holds_identical_parameters(ddp_checks):
    assert ddp_checks["world_size"] == 2
    assert ddp_checks["ranks_max_param_diff"] == 0.0


@pytest.mark.slow
def test_ddp_evaluation_is_exact_on_an_odd_sized_set(ddp_checks):
    assert ddp_checks["val_size"] == 101
    assert ddp_checks["ddp_eval"]["shard_sizes"] == 51  # 101 over 2 ranks: one example padded in
    assert ddp_checks["ddp_eval"]["n"] == ddp_checks["single_eval"]["n"] == 101
    assert ddp_checks["ddp_eval"]["accuracy"] == ddp_checks["single_eval"]["accuracy"]
    assert ddp_checks["ddp_eval"]["loss"] == pytest.approx(ddp_checks["single_eval"]["loss"], abs=1e-6)


@pytest.mark.slow
def test_checkpoint_from_ddp_model_has_no_module_prefix_and_predicts_the_same(ddp_checks):
    assert ddp_checks["checkpoint_module_keys"] == 0
    assert ddp_checks["checkpoint_pred_max_diff"] < 1e-6


# ---------------------------------------------------------------- samplers (no processes needed)


def test_distributed_sampler_shards_are_disjoint_cover_and_reshuffle():
    ds = list(range(10))
    shards = {}
    for rank in range(2):
        s = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=0)
        s.set_epoch(0)
        e0 = list(s)
        s.set_epoch(1)
        e1 = list(s)
        assert e0 != e1, "set_epoch must change the order"
        assert sorted(e0) != sorted(range(10))
        shards[rank] = (e0, e1)
    for epoch in (0, 1):
        a, b = shards[0][epoch], shards[1][epoch]
        assert set(a).isdisjoint(b)
        assert sorted(a + b) == list(range(10))


def test_without_set_epoch_the_order_repeats():
    s = DistributedSampler(list(range(10)), num_replicas=2, rank=0, shuffle=True, seed=0)
    assert list(s) == list(s)


def test_length_grouped_batches_keep_shards_disjoint_and_equal_in_count():
    lengths = [((i * 37) % 50) + 3 for i in range(103)]
    per_rank = []
    for rank in range(2):
        ds_sampler = DistributedSampler(list(range(103)), num_replicas=2, rank=rank, shuffle=True, seed=3)
        bs = batching.LengthGroupedBatchSampler(ds_sampler, lengths, batch_size=8, chunk_batches=4, seed=3)
        bs.set_epoch(2)
        batches = list(bs)
        assert len(batches) == len(bs)
        flat = [i for b in batches for i in b]
        assert sorted(flat) == sorted(ds_sampler)  # exactly this rank's shard
        per_rank.append(batches)
    assert len(per_rank[0]) == len(per_rank[1])  # same number of steps on every rank: no hang
    ids0 = {i for b in per_rank[0] for i in b}
    ids1 = {i for b in per_rank[1] for i in b}
    assert len(ids0 & ids1) <= 1  # only DistributedSampler's own padding may repeat
    assert ids0 | ids1 == set(range(103))
    # inside a chunk, batches are length-sorted: padding per batch is smaller than random batching
    spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in per_rank[0]) / len(per_rank[0])
    assert spread < 25


def test_collator_pads_to_a_multiple_of_8():
    coll = batching.PadCollator(pad_id=0, pad_to_multiple_of=8)
    out = coll(
        [
            {"index": 0, "input_ids": [101, 5, 6, 102], "label": 1},
            {"index": 1, "input_ids": list(range(1, 11)), "label": 2},
        ]
    )
    assert out["input_ids"].shape == (2, 16)
    assert out["attention_mask"].sum().item() == 14
    assert torch.equal(out["labels"], torch.tensor([1, 2]))
