"""Chapter 02's exercise 1 (distrinews_course.shard_exercise): the reference my_shard passes against torch's
DistributedSampler, and each mistake the checker names has a mutant that gets exactly that one line."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest
import torch

from distrinews_course.attempt import try_exercise
from distrinews_course.shard_exercise import CASES, shard_test, torchs

ROOT = Path(__file__).resolve().parent.parent


def _reference():
    spec = importlib.util.spec_from_file_location("answers02", ROOT / "notebooks/answers/02_ddp_training.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.my_shard


def _shard(n, rank, world, epoch, seed=0, *, seeded=None, shuffle="torch", pad="start", take="strided", sort=False):
    """The reference with one thing changed: the mutants below."""
    g = torch.Generator()
    g.manual_seed(
        {"epoch": seed + epoch, "no_epoch": seed, "rank": seed + epoch + rank, "no_seed": epoch}[seeded or "epoch"]
    )
    if shuffle == "torch":
        order = torch.randperm(n, generator=g).tolist()
    elif shuffle == "python":
        order = list(range(n))
        random.Random(seed + epoch).shuffle(order)
    else:
        order = list(range(n))
    missing = (-n) % world
    if pad == "world":  # a whole world's worth more, not just what is missing
        missing += world
    order += {"start": order[:missing], "end": order[len(order) - missing :], "none": []}.get(pad, order[:missing])
    k = len(order) // world
    shard = order[rank::world] if take == "strided" else order[rank * k : (rank + 1) * k]
    return sorted(shard) if sort else shard


MUTANTS = {
    "no_padding": (dict(pad="none"), "the length is wrong: without padding"),
    "seed_without_epoch": (dict(seeded="no_epoch"), "that is epoch 0's shard"),
    "seed_ignored": (dict(seeded="no_seed"), "that is seed 0's shard: the seed argument is ignored"),
    "not_shuffled": (dict(shuffle="none"), "not shuffled"),
    "contiguous_block": (dict(take="block"), "a contiguous block"),
    "sorted_shard": (dict(sort=True), "the right indices in another order"),
    "padding_from_the_end": (dict(pad="end"), "the padding: repeat indices from the START"),
    "one_seed_per_rank": (dict(seeded="rank"), "your ranks' shards overlap"),
    "python_shuffle": (dict(shuffle="python"), "other indices"),
    "padded_too_far": (dict(pad="world"), "indices where every rank gets"),
}


def test_the_reference_answer_matches_distributed_sampler():
    shard_test(_reference())  # raises on a mistake
    assert _shard(11, 1, 2, 3) == torchs(11, 1, 2, 3)  # the mutants' base is right too


@pytest.mark.parametrize("name", list(MUTANTS))
def test_each_mistake_is_named_in_one_line(name, capsys):
    changes, reason = MUTANTS[name]

    def my_shard(n, rank, world, epoch, seed=0):
        return _shard(n, rank, world, epoch, seed, **changes)

    with pytest.raises(AssertionError, match=reason):
        shard_test(my_shard)
    assert not try_exercise(shard_test, my_shard)
    out = capsys.readouterr().out
    assert out.startswith("not yet: ") and reason in out and out.count("\n") == 1, out


def test_the_stub_is_not_written_yet(capsys):
    def my_shard(n, rank, world, epoch, seed=0):
        """doc"""
        ...  # your code here

    assert not try_exercise(shard_test, my_shard)
    assert "not written yet" in capsys.readouterr().out


def test_the_cases_need_padding_later_epochs_and_seeds():
    """The cases can catch what the mutants do: some sizes do not divide, some epochs and some seeds are not 0."""
    assert any(n % world for n, world, _, _ in CASES) and any(epoch for _, _, epoch, _ in CASES)
    assert any(seed for *_, seed in CASES)
