"""Chapter 06's reference answers (read only by its solution cells; see README.md here)."""

from distrinews_course import memory as M


def my_zero1_partition(named_sizes, world):
    """Each rank's tensor names under ZeroRedundancyOptimizer: whole tensors, largest first, each to the rank
    holding the fewest parameters so far (the lowest such rank on a tie)."""
    owned = [[] for _ in range(world)]
    load = [0] * world
    for name, n in sorted(named_sizes.items(), key=lambda kv: kv[1], reverse=True):
        rank = load.index(min(load))  # the first of the least loaded ranks
        owned[rank].append(name)
        load[rank] += n
    return owned


def long_sequence_predictions(runtime_mib):
    """Exercise 2: the calculator's peak for one process at 16 x 512 tokens, without and with recomputation (MiB)."""
    return {
        "ddp@16x512": M.estimate("tiny", 16, 512, overhead_mb=runtime_mib).peak_mb,
        "ddp@16x512+ckpt": M.estimate("tiny", 16, 512, recompute=True, overhead_mb=runtime_mib).peak_mb,
    }
