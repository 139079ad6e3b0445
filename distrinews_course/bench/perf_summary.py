"""Chapter 05's results in one table, and its record (distrinews_course.records) for the course's runs.

print(perf_summary.table(env, cost, sweep, extras))
perf_summary.record(env, cost, sweep, extras)      # records/05_performance.json, with a one-line headline
"""

from __future__ import annotations

from ..records import write_record
from . import perf_story


def _hardware(env) -> str:
    from distrinews_lib.machine import machine_info

    if env.n_gpus:
        return f"{env.nproc}x " + ", ".join(sorted(set(env.gpu_names)))
    info = machine_info()
    return f"CPU: {info['cpu_count']} cores ({info['processor']}), one per process"


def table(env, cost, sweep, *, small=None, hooks=None, no_sync=None, after=None, paper=None) -> str:
    """Every section's headline figure, measured by this run (the ESTIMATE row: section 5, on paper)."""
    rows = [
        ("hardware", _hardware(env)),
        (
            "all-reduce fit (2 processes)",
            f"alpha {1000 * cost.fit.alpha_s:.2f} ms, {cost.fit.bandwidth / 1e9:.2f} GB/s",
        ),
    ]
    rows += [
        (f"speedup at {p['b']}/process", perf_story.summary_speedup(sweep, p, c))
        for p, c in zip(sweep.pts, sweep.speedup_claims())
    ]
    if small:
        rows.append(("0.25 MiB buckets: step vs plain DDP", f"{small['ratio']:.2f}x (median of the rounds)"))
    if hooks:
        plain, fp16, psgd = (hooks.rows[h]["wire"] for h in ("allreduce", "fp16", "powersgd"))
        if plain:
            rows.append(("compression: bytes written", f"fp16 {fp16 / plain:.0%}, PowerSGD {psgd / plain:.1%}"))
    if no_sync:
        rows.append((f"accumulation x{no_sync.accum}: no_sync", f"{no_sync.time_ratio:.2f}x faster, the same model"))
    if after:
        rows.append((f"box: the {after.link_fit} link read back", f"{after.wire_bits / 1e6:.0f} Mbit/s of payload"))
        rows.append(("box: DDP speedup by link", ", ".join(f"{r['rate']} {r['measured']:.2f}x" for r in after.rows)))
        be = after.model_break_even_bits()
        if be:
            rows.append(
                ("box: 2 processes lose to 1 below", f"{be / 1e6:.0f} Mbit/s (the model on this launch's runs)")
            )
    if paper:
        rows.append(
            (
                "ESTIMATE: DistilBERT efficiency",
                ", ".join(f"{r['n']} GPUs {100 * r['estimate'].efficiency:.0f}%" for r in paper),
            )
        )
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def record(env, cost, sweep, *, seconds, no_sync=None, after=None, box_why=""):
    """The chapter's record: the fit (chapter 03's scaling table reads alpha_ms and bandwidth_gb_s), each point's
    model and measurement, the step's parts and its gap to the ideal, and the box's figures."""
    large = sweep.run("ddp")
    return write_record(
        "05_performance",
        {
            "preset": env.preset,
            "nproc": env.nproc,
            "backend": env.backend,
            "loopback_seconds": seconds,
            "alpha_ms": 1000 * cost.fit.alpha_s,
            "bandwidth_gb_s": cost.fit.bandwidth / 1e9,
            "model_ms": {"ddp_own_work": 1000 * sweep.model.overhead_s, "allreduce_fit": 1000 * sweep.model.comm_s},
            "points": {
                p["b"]: {
                    "model_speedup": p["predicted"],
                    "measured_speedup": p["measured"],
                    "round": p["kept"],
                    "quiet": p["quiet"],
                }
                for p in sweep.pts
            },
            "breakdown_ms": {
                k: 1000 * sum(r["parts"][k] for r in large["ranks"]) / len(large["ranks"])
                for k in ("data", "forward", "backward", "waiting", "transfer", "clip", "optimizer")
            },
            "gap_ms": {k: 1000 * v for k, v in sweep.gap().items()},
            "no_sync_time_ratio": no_sync.time_ratio if no_sync else None,
            "dialed": None
            if after is None
            else {
                "fitted_mbit": after.wire_bits / 1e6,
                "set_mbit": after.set_bits / 1e6,
                "points": [
                    {
                        "link_mbit": r["bits"] / 1e6,
                        "allreduce_ms_predicted_before": 1000 * r["comm_before"],
                        "allreduce_ms_measured": 1000 * r["transfer"],
                        "speedup_predicted_before": r["speedup_before"],
                        "speedup_model": r["model"],
                        "speedup_measured": r["measured"],
                    }
                    for r in after.rows
                ],
                "break_even_mbit": {
                    "predicted_before": (after.before.break_even_bits() or 0) / 1e6 or None,
                    "model": (after.model_break_even_bits() or 0) / 1e6 or None,
                    "measured_crossing": (after.measured_crossing_bits() or 0) / 1e6 or None,
                },
                "ring_wire_time_ratio_4_over_2": {str(s): r for s, (_, _, r) in after.ring_ratios().items()},
            },
            "box_why": box_why,
        },
        headline=f"alpha {1000 * cost.fit.alpha_s:.2f} ms, {cost.fit.bandwidth / 1e9:.2f} GB/s; speedup "
        + " / ".join(perf_story.headline_point(sweep, p, c) for p, c in zip(sweep.pts, sweep.speedup_claims()))
        + f" at {' / '.join(str(p['b']) for p in sweep.pts)} per process",
    )
