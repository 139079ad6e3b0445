"""Chapter 02's reference answers (read only by its solution cells; see README.md here)."""

import torch


def my_shard(n, rank, world, epoch, seed=0):
    """The indices DistributedSampler yields after set_epoch(epoch).

    That is DistributedSampler(range(n), num_replicas=world, rank=rank, seed=seed).
    """
    g = torch.Generator()
    g.manual_seed(seed + epoch)  # the same seed on every rank: one shared permutation
    order = torch.randperm(n, generator=g).tolist()
    order += order[: (-n) % world]  # pad from the start to a multiple of world
    return order[rank::world]  # every world-th index, from this rank's position
