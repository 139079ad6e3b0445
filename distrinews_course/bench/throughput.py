"""The benchmarks' one throughput calculation: what a timed window of training steps processed, per second.

window() turns one process's window (its clock readings and the real lengths and padded width of each batch
it trained on) into samples/s, tokens/s, padding and model FLOP/s; over_ranks() combines the windows of the
ranks of one DDP run. harness.Window, scripts/bench_train.py (our scripts and Trainer alike),
scripts/bench_runs.py and scripts/measure_speedup.py all quote these figures.
"""

from __future__ import annotations

from distrinews_lib.training import flops

from .timing import foreign_cores


def training_flops(shape: flops.ModelShape, lengths) -> float:
    """Model FLOPs of one training pass over texts of these real lengths: Σᵢ Tᵢ·(6N + 12·L·d·Tᵢ)."""
    lengths = [int(x) for x in lengths]
    return flops.training_flops_from_sums(shape, sum(lengths), sum(t * t for t in lengths))


def window(
    steps: int,
    seconds: float,
    cpu_s: float,
    batches: list,
    *,
    busy=(None, None),
    shape=None,
    peak=None,
    n_devices: int = 1,
) -> dict:
    """One process's figures. batches: (real lengths, padded width) of each batch in the window; busy: the
    machine's busy CPU-seconds at the window's start and end (timing.cpu_busy_seconds); shape: the model's
    flops.ModelShape, for model FLOP/s (and MFU where the device's peak is known)."""
    lengths = [n for ls, _ in batches for n in ls]
    padded = sum(len(ls) * width for ls, width in batches)
    out = {
        "steps": steps,
        "seconds": seconds,
        "cpu_s": cpu_s,
        "cpu_share": cpu_s / seconds if seconds else None,
        "samples": len(lengths),
        "tokens": sum(lengths),
        "padded_tokens": padded,
        "samples_per_s": len(lengths) / seconds,
        "tokens_per_s": sum(lengths) / seconds,
        "samples_per_cpu_s": len(lengths) / cpu_s if cpu_s > 0 else None,
        "padding_fraction": 1 - sum(lengths) / padded if padded else None,
        "foreign_cores": foreign_cores(busy[0], busy[1], cpu_s, seconds),
    }
    if shape is not None:
        fl = training_flops(shape, lengths)
        out["model_tflops"] = fl / seconds / 1e12
        out["mfu"] = flops.mfu(fl / seconds, peak, n_devices)
    return out


def over_ranks(parts: list, *, busy=(None, None), peak=None) -> dict:
    """One DDP run's figures from its ranks' window() results: the run lasts as long as its slowest rank, and
    samples, tokens and CPU time add up. samples_per_cpu_s is per CPU-second of the average rank; busy: the
    machine's busy CPU-seconds around one rank's window, for the other processes' share of the CPU."""
    seconds = max(p["seconds"] for p in parts)
    samples, tokens = sum(p["samples"] for p in parts), sum(p["tokens"] for p in parts)
    padded, cpu_s = sum(p["padded_tokens"] for p in parts), sum(p["cpu_s"] for p in parts)
    out = {
        "seconds": seconds,
        "samples": samples,
        "tokens": tokens,
        "padded_tokens": padded,
        "cpu_s": cpu_s,
        "samples_per_s": samples / seconds,
        "tokens_per_s": tokens / seconds,
        "samples_per_cpu_s": samples / cpu_s * len(parts) if cpu_s > 0 else None,
        "padding_fraction": 1 - tokens / padded if padded else None,
        "cpu_share_per_rank": cpu_s / seconds / len(parts),
        "foreign_cores": foreign_cores(busy[0], busy[1], cpu_s, seconds),
    }
    if all(p.get("model_tflops") is not None for p in parts):
        total = sum(p["model_tflops"] * 1e12 * p["seconds"] for p in parts)  # each rank's own FLOPs
        out["model_tflops"] = total / seconds / 1e12
        out["mfu"] = flops.mfu(total / seconds, peak, len(parts))
    return out
