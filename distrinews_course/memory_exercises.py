"""Chapter 06's exercise checker: ZeRO-1's partition, written by the learner, judged against torch's rule and against
the optimizer state each rank measured. Each wrong answer it recognises gets its own one-line reason.

    grade(my_zero1_partition, zero1_partition_cases(named_sizes, 2, measured_state_bytes))

The learner writes my_zero1_partition(named_sizes, world) -> [[tensor names of rank 0], [... of rank 1], ...]:
torch's ZeroRedundancyOptimizer sorts the parameter tensors largest first and gives each, whole, to the rank that
holds the fewest parameters so far (the first such rank on a tie).
"""

from __future__ import annotations

from collections import Counter

from . import memory as M

# Five tensors on which every mistake below gives a different split from the right one and from each other
SMALL_CASE = {"a": 2, "b": 8, "c": 1, "d": 7, "e": 7, "f": 1}


def _greedy(sizes: list[int], world: int, pick) -> list[int]:
    ranks = [0] * world
    for n in sizes:
        ranks[pick(ranks)] += n
    return ranks


def zero1_totals(sizes: list[int], world: int) -> list[int]:
    """Parameters per rank, in rank order, as ZeroRedundancyOptimizer partitions them."""
    return _greedy(sorted(sizes, reverse=True), world, lambda r: r.index(min(r)))


def _mistakes(sizes: list[int], world: int) -> list[tuple[list[int], str]]:
    """(the rank totals a mistake gives, its one-line reason), for the mistakes the judge names."""
    largest_first = sorted(sizes, reverse=True)
    in_turn = [sum(largest_first[r::world]) for r in range(world)]
    return [
        (_greedy(sizes, world, lambda r: r.index(min(r))), "you handed the tensors out in the order given; sort them "
         "largest first"),
        (_greedy(sorted(sizes), world, lambda r: r.index(min(r))), "you sorted smallest first; ZeroRedundancyOptimizer "
         "hands out the largest tensors first"),
        (in_turn, "you dealt the tensors out in turn; give each to the rank holding the fewest parameters so far"),
        (_greedy(largest_first, world, lambda r: r.index(max(r))), "you gave each tensor to the rank holding the "
         "most parameters; give it to the one holding the fewest"),
        (_greedy(largest_first, world, lambda r: len(r) - 1 - r[::-1].index(min(r))), "on a tie you chose the last "
         "of the least loaded ranks; ZeroRedundancyOptimizer chooses the first (the lowest rank)"),
    ]  # fmt: skip


def zero1_judge(named_sizes: dict, world: int, want: list[int], slack: int = 0):
    """A judge for one case: the learner's partition against `want` (parameters per rank, rank order), up to
    `slack` parameters per rank; returns None when right, else what is wrong in one line."""
    sizes = list(named_sizes.values())

    def judge(got):
        if not isinstance(got, (list, tuple)) or len(got) != world:
            return f"returned {got!r:.60}; return a list of {world} lists, each rank's tensor names"
        if any(not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names) for names in got):
            return f"returned {got!r:.60}; return each rank's list of tensor names, not how many parameters it holds"
        counts = Counter(n for names in got for n in names)
        unknown = [n for n in counts if n not in named_sizes]
        if unknown:
            return f"{unknown[0]!r} is not a tensor of the model; use the names of named_sizes"
        twice = [n for n, c in counts.items() if c > 1]
        missing = [n for n in named_sizes if n not in counts]
        if twice or missing:
            which = f"{twice[0]!r} went to {counts[twice[0]]} ranks" if twice else f"{missing[0]!r} went to no rank"
            return f"{which}: every tensor goes, whole, to exactly one rank"
        totals = [sum(named_sizes[n] for n in names) for names in got]
        if all(abs(a - b) <= slack for a, b in zip(totals, want)):
            return None
        for wrong, why in _mistakes(sizes, world):
            if all(abs(a - b) <= slack for a, b in zip(totals, wrong)):
                return why
        return (
            f"your ranks hold {totals} parameters (rank order), ZeroRedundancyOptimizer's {want}: give each tensor, "
            "largest first, to the rank holding the fewest so far"
        )

    return judge


def zero1_partition_cases(named_sizes: dict, world: int, measured_state_bytes: list[int]) -> list:
    """grade()'s cases: a small case where every known mistake shows, then the course's model against the optimizer
    state each rank measured (8 bytes of AdamW moments per parameter; the slack, one parameter per tensor, covers
    AdamW's step counters, a 4-byte scalar per tensor)."""
    measured = [round(b / 8) for b in measured_state_bytes]
    return [
        (
            "six tensors, sizes 2 8 1 7 7 1, on 2 ranks",
            (dict(SMALL_CASE), 2),
            zero1_judge(SMALL_CASE, 2, zero1_totals(list(SMALL_CASE.values()), 2)),
        ),
        (
            f"the course's model on {world} ranks, against each rank's measured optimizer state",
            (dict(named_sizes), world),
            zero1_judge(named_sizes, world, measured, slack=len(named_sizes)),
        ),
    ]


# ---------------------------------------------------------------------------------------------------------------
# Exercise 2: a long sequence, predicted, then measured


def peak_setter(launch, name: str, margin: float = 0.15) -> str:
    """Which part set a run's MEASURED peak: how far the peak rose above what the run holds all the time (its weights
    and AdamW's moments, counted on its tensors; DDP's buckets; the launch's runtime), against what the optimizer step
    adds (its gradients, counted, plus AdamW's temporaries, measured apart in section 5). Above that by more than
    `margin` (the calculator's bound), only the activations (with recomputation: each layer's input and the one layer
    recomputed in backward) can have raised it."""
    held, e = launch.fullest(name), launch.predicted(name)
    at_rest = (held["params"] + held["optimizer_state"]) / M.MiB + e.parts_mb.get("DDP buckets", 0.0)
    rose = launch.peak(name) - at_rest - launch.runtime_mb
    step = held["grads"] / M.MiB + e.parts_mb["AdamW temporaries"]
    head = f"the peak rose {rose:.1f} MiB above what the run holds all the time and its runtime"
    what = f"the optimizer step's gradients plus AdamW's temporaries ({step:.1f})"
    if rose > (1 + margin) * step:
        return f"{head}, more than {what}: the activations set it"
    return f"{head}, about {what}: the optimizer step set it"


def judge_measured_peak(yours_mb, launch, name: str, tolerance: float = 0.15) -> tuple[bool, str]:
    """A learner's prediction of one run's peak (MiB) against the peak that run MEASURED, not the calculator's: right
    within `tolerance` (the bound section 5 holds the calculator to). Wrong: how far off, and which slip the number
    matches (memory.judge_peak_prediction's catalogue, on the run's settings and the launch's own runtime). Either
    way, which part set the measured peak (peak_setter)."""
    if not isinstance(yours_mb, (int, float)) or isinstance(yours_mb, bool) or yours_mb <= 0:
        return False, f"write a positive number of MiB, not {yours_mb!r}"
    measured, r = launch.peak(name), launch.results[name]
    sets = f"there {peak_setter(launch, name)}"
    if abs(yours_mb / measured - 1) <= tolerance:
        return (
            True,
            f"right: {yours_mb:.1f} MiB, within {100 * tolerance:.0f}% of the {measured:.1f} MiB measured; {sets}",
        )
    ok, why = M.judge_peak_prediction(
        yours_mb, launch.model, r["batch"], r["seq"], recompute=r["ckpt"], world=launch.world,
        overhead_mb=launch.runtime_mb,
    )  # fmt: skip
    slip = why.removeprefix("not yet: ") if not ok else "the calculator's figure, which this run did not bear out"
    return False, f"{yours_mb / measured - 1:+.0%} from the {measured:.1f} MiB measured ({slip}); {sets}"
