"""Chapter 02's exercise 1: a DistributedSampler by hand. The learner writes my_shard(n, rank, world, epoch, seed=0),
the indices DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed) yields after
set_epoch(epoch); the checker compares it with torch's sampler on several sizes, ranks and epochs and names the
first mistake in one line.

    try_exercise(shard_test, my_shard)
"""

from __future__ import annotations

import torch
from torch.utils.data import DistributedSampler

from .attempt import NotYet

# (n, world, epoch, seed): even and uneven sizes (padding), 2 to 4 ranks, epoch 0 and later ones, seed 0 and others
CASES = ((10, 2, 0, 0), (10, 2, 1, 0), (11, 2, 3, 0), (7, 3, 0, 0), (12, 4, 5, 0), (10, 2, 1, 5), (11, 3, 2, 7))


def torchs(n: int, rank: int, world: int, epoch: int, shuffle: bool = True, seed: int = 0) -> list[int]:
    s = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=seed)
    s.set_epoch(epoch)
    return list(s)


def _order(n: int, seed: int) -> list[int]:
    g = torch.Generator()
    g.manual_seed(seed)
    return torch.randperm(n, generator=g).tolist()


def diagnose(shards: list[list[int]], n: int, world: int, epoch: int, seed: int = 0) -> tuple[int, str] | None:
    """None when every rank's shard (the learner's, shards[rank]) is DistributedSampler's; else the first wrong rank
    and what the learner's function did instead, in a few words."""
    per_rank = -(-n // world)
    order = _order(n, seed + epoch)
    padded = order + order[: per_rank * world - n]
    for rank, got in enumerate(shards):
        want = torchs(n, rank, world, epoch, seed=seed)
        if got == want:
            continue
        if len(got) != len(want):
            if len(got) == len(order[rank::world]):
                return (
                    rank,
                    "the length is wrong: without padding, ranks get different numbers; pad to a multiple of world",
                )
            return rank, f"{len(got)} indices where every rank gets {per_rank}: pad to a multiple of world first"
        if epoch and got == torchs(n, rank, world, 0, seed=seed):
            return rank, "that is epoch 0's shard: seed the generator with seed + epoch"
        if seed and got == torchs(n, rank, world, epoch):
            return rank, "that is seed 0's shard: the seed argument is ignored; seed the generator with seed + epoch"
        if got == torchs(n, rank, world, epoch, shuffle=False):
            return rank, "not shuffled: draw torch.randperm(n) with a generator seeded seed + epoch first"
        if got == padded[rank * per_rank : (rank + 1) * per_rank]:
            return rank, "a contiguous block: take every world-th index starting at rank (order[rank::world])"
        if sorted(got) == sorted(want):
            return rank, "the right indices in another order: keep the shuffled order as it is (no sort, no reshuffle)"
        if got[: len(order[rank::world])] == order[rank::world]:
            return rank, "the padding: repeat indices from the START of the shuffled order (order[:missing])"
        mine = [i for r, shard in enumerate(shards) if r != rank for i in shard]
        if len(set(got) & set(mine)) > len(padded) - n:
            return rank, "your ranks' shards overlap: every rank must shuffle with the same seed (not one per rank)"
        return rank, "other indices: a torch.Generator seeded seed + epoch, torch.randperm, pad, every world-th index"
    return None


def shard_test(fn) -> None:
    """The test try_exercise runs: NotYet for the stub (it returns None), AssertionError naming the first case that
    differs from DistributedSampler and what the function did instead."""
    for n, world, epoch, seed in CASES:
        shards = []
        for rank in range(world):
            got = fn(n, rank, world, epoch, seed)
            if got is None:
                raise NotYet("it returns None")
            shards.append([int(i) for i in got])
        wrong = diagnose(shards, n, world, epoch, seed)
        if wrong:
            rank, problem = wrong
            raise AssertionError(
                f"n={n}, world={world}, epoch={epoch}, seed={seed}, rank {rank}: you returned {shards[rank]}, "
                f"DistributedSampler gives {torchs(n, rank, world, epoch, seed=seed)}: {problem}"
            )
