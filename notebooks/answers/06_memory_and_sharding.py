"""Chapter 06's reference answers (read only by its solution cells; see README.md here)."""

from distrinews_course import memory as M


def my_zero1_split(sizes, world):
    """Parameters per rank under ZeroRedundancyOptimizer: whole tensors, largest first, each to the least loaded one."""
    ranks = [0] * world
    for n in sorted(sizes, reverse=True):
        ranks[ranks.index(min(ranks))] += n  # the rank holding the fewest parameters so far
    return ranks


def long_sequence_predictions(runtime_mib):
    """Exercise 2: the calculator's peak for one process at 16 x 512 tokens, without and with recomputation (MiB)."""
    return {
        "ddp@16x512": M.estimate("tiny", 16, 512, overhead_mb=runtime_mib).peak_mb,
        "ddp@16x512+ckpt": M.estimate("tiny", 16, 512, recompute=True, overhead_mb=runtime_mib).peak_mb,
    }
