"""Which examples each rank trains on: train_ddp.py's DistributedSampler against a loader Accelerate prepares,
computed with the libraries' own classes. Chapter 09's picture of why train_accelerate.py keeps the sampler.

    shares = rank_batches(n=16, world=2, global_batch=8)   # {scheme: [rank][step] -> example indices}
    check(*same_global_batches(shares)); fig = sharding_figure(shares)
"""

from __future__ import annotations

from torch.utils.data import BatchSampler, DistributedSampler, SequentialSampler

from .plots import _pyplot

SAMPLER = "DistributedSampler (train_ddp.py)"
PREPARED = "accelerator.prepare(loader)"


def rank_batches(n: int, world: int, global_batch: int) -> dict:
    """{scheme: per rank, per step, the example indices}, with shuffling off so that the indices read as positions.
    DistributedSampler deals the examples out in turn and each rank batches its own; a prepared loader builds each
    global batch and gives rank r the r-th contiguous slice (split_batches=True, as train_accelerate.py configures
    it; the default, whole per-rank batches in turn, gives the same slices when the batch sizes line up)."""
    from accelerate.data_loader import BatchSamplerShard

    per_rank = global_batch // world
    sampler = {}
    for r in range(world):
        mine = list(DistributedSampler(range(n), num_replicas=world, rank=r, shuffle=False))
        sampler[r] = [mine[i : i + per_rank] for i in range(0, len(mine), per_rank)]
    batches = BatchSampler(SequentialSampler(range(n)), global_batch, drop_last=False)
    prepared = {r: list(BatchSamplerShard(batches, world, r, split_batches=True)) for r in range(world)}
    return {SAMPLER: [sampler[r] for r in range(world)], PREPARED: [prepared[r] for r in range(world)]}


def same_global_batches(shares: dict) -> tuple:
    """Both schemes put the same examples in each step's global batch, and split them differently over the ranks:
    so DDP's all-reduce adds up the same per-example gradients, grouped differently. Exact, no margin."""
    (a, b) = shares.values()
    steps = len(a[0])
    same = all({i for rank in a for i in rank[s]} == {i for rank in b for i in rank[s]} for s in range(steps))
    differ = any(set(a[r][s]) != set(b[r][s]) for r in range(len(a)) for s in range(steps))
    return same and differ, (
        "each step's global batch holds the same examples under both; only which rank computes which differs"
    )


def sharding_figure(shares: dict):
    """One row per scheme, one square per example in the order the data comes, coloured by the rank that computes
    its gradient; a line between global batches (optimizer steps)."""
    plt = _pyplot()
    colours = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b2", "#937860", "#da8bc3", "#8c8c8c"]
    owner, step_of = {}, {}
    for scheme, ranks in shares.items():
        for r, steps in enumerate(ranks):
            for s, batch in enumerate(steps):
                for i in batch:
                    owner[scheme, i], step_of[i] = r, s
    n, world = len(step_of), len(next(iter(shares.values())))
    fig, ax = plt.subplots(figsize=(8, 0.7 * len(shares) + 1.2))
    for row, scheme in enumerate(shares):
        y = len(shares) - 1 - row
        for i in range(n):
            ax.add_patch(plt.Rectangle((i, y + 0.1), 0.92, 0.8, color=colours[owner[scheme, i] % len(colours)]))
            ax.text(i + 0.46, y + 0.5, str(i), ha="center", va="center", fontsize=7, color="white")
    for i in range(1, n):
        if step_of[i] != step_of[i - 1]:
            ax.axvline(i - 0.04, color="k", lw=1.2)
    ax.set_xlim(0, n)
    ax.set_ylim(0, len(shares))
    ax.set_yticks([len(shares) - 0.5 - k for k in range(len(shares))], list(shares), fontsize=8)
    steps = sorted(set(step_of.values()))
    centres = [sum(i for i in step_of if step_of[i] == s) / list(step_of.values()).count(s) + 0.46 for s in steps]
    ax.set_xticks(centres, [f"step {s + 1}: one global batch" for s in steps])
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[r]) for r in range(world)]
    ax.legend(handles, [f"rank {r}" for r in range(world)], fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_title("which rank computes the gradient of which example (shuffling off)", fontsize=10)
    ax.tick_params(length=0)
    fig.tight_layout()
    return fig
