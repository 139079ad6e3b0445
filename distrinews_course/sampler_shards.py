"""Chapter 00, section 2: how DistributedSampler deals a dataset out over the ranks, read the way a training loop
reads it (one sampler per rank, iterated once per epoch), and the claims the chapter makes about it.

    runs = {"shuffled": epochs_of([DistributedSampler(range(10), 2, r, seed=0) for r in range(2)], epochs=2), ...}
    print(shards_table(runs)); settle(sampler_claims(runs))
    settle(forgotten_set_epoch_claims(with_set_epoch, without))      # exercise 2

A sampler needs no process group when it is given num_replicas and rank, so one process can play every rank.
"""

from __future__ import annotations

from .claims import Claim


def epochs_of(samplers, epochs: int, set_epoch: bool = True) -> list[list[list[int]]]:
    """What each rank's sampler yields, epoch after epoch, as a training loop sees it: the SAME sampler objects
    iterated once per epoch, with `sampler.set_epoch(epoch)` before each pass when `set_epoch` (else never).
    Returns [epoch][rank] -> that rank's indices in order."""
    out = []
    for epoch in range(epochs):
        if set_epoch:
            for s in samplers:
                s.set_epoch(epoch)
        out.append([[int(i) for i in s] for s in samplers])
    return out


def shards_table(runs: dict) -> str:
    """One line per run and epoch: every rank's indices."""
    width = max(len(name) for name in runs) + 10
    lines = []
    for name, epochs in runs.items():
        for epoch, ranks in enumerate(epochs):
            label = f"{name}, epoch {epoch}" if len(epochs) > 1 else name
            lines.append(f"{label:<{width}}" + "   ".join(f"rank {r} {order}" for r, order in enumerate(ranks)))
    return "\n".join(lines)


def disjoint_and_complete(ranks: list[list[int]], n: int) -> bool:
    """Every rank the same number of samples, no sample on two ranks, and all n together (n a multiple of the
    ranks: no padding)."""
    flat = [i for order in ranks for i in order]
    return len({len(order) for order in ranks}) == 1 and sorted(flat) == list(range(n))


def sampler_claims(runs: dict, n: int = 10, padded_n: int = 11) -> list[Claim]:
    """Section 2's claims. runs: "no shuffle", "shuffled" (two epochs, set_epoch called) and "padded" (padded_n
    samples, no shuffle), each from epochs_of() over 2 ranks."""
    plain, shuffled, padded = runs["no shuffle"], runs["shuffled"], runs["padded"][0]
    world = len(plain[0])
    per_rank = n // world
    extra = -(-padded_n // world) * world - padded_n  # how many the sampler repeats to fill the last round
    repeated = sorted(set(padded[0]) & set(padded[1])) if world == 2 else []
    return [
        Claim(
            f"every epoch, with or without shuffling: {per_rank} samples per rank, disjoint, together all {n}",
            all(disjoint_and_complete(ranks, n) for ranks in [*plain, *shuffled]),
        ),
        Claim(
            f"without shuffling rank r takes indices r, r + {world}, r + {2 * world}, ...",
            plain[0] == [list(range(r, n, world)) for r in range(world)],
        ),
        Claim(
            "set_epoch(1) gives another split and order than epoch 0",
            any(set(a) != set(b) for a, b in zip(shuffled[0], shuffled[1])) and shuffled[0] != shuffled[1],
        ),
        Claim(
            f"{padded_n} samples: every rank gets {-(-padded_n // world)}; the sampler repeats {extra} from the start "
            f"(sample {repeated[0] if repeated else '?'}) as padding",
            len({len(o) for o in padded}) == 1 and len(repeated) == extra and repeated == list(range(extra)),
        ),
    ]


def forgotten_set_epoch_claims(with_set_epoch: list, without: list, n: int = 10) -> list[Claim]:
    """Exercise 2: two epochs of the same samplers, iterated as a training loop does, once with set_epoch and once
    without. Without it the shards stay disjoint and complete, and epoch 1 replays epoch 0's order exactly."""
    return [
        Claim(
            "without set_epoch the shards still hold every sample once: nothing is lost or doubled",
            all(disjoint_and_complete(ranks, n) for ranks in without),
        ),
        Claim("... but epoch 1 replays epoch 0's split and order exactly", without[0] == without[1]),
        Claim(
            "... which is epoch 0's order of the run that calls set_epoch, while its epoch 1 draws a new one",
            without[0] == with_set_epoch[0] and with_set_epoch[1] != with_set_epoch[0],
        ),
    ]
