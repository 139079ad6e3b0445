"""What a collective puts on the wire in the bandwidth-optimal ring: the bytes each rank sends, for chapter 03's ladder
(by_hand: the race's bytes per step) and chapter 05's cost model (perf_model)."""

from __future__ import annotations

# Bytes each rank sends for one collective on a buffer of `nbytes` (the whole tensor, as every rank sees it), in the
# bandwidth-optimal ring: an all-reduce is a reduce-scatter then an all-gather, each moving (N-1)/N of the buffer.
RING_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}


def wire_bytes(op: str, nbytes: int, world: int) -> float:
    """Bytes one rank sends for collective `op` on a buffer of `nbytes` among `world` ranks (a ring); 0 alone."""
    return 0.0 if world <= 1 else RING_FACTOR[op](world) * nbytes
