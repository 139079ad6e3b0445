"""Chapter 03's notebook side of the ladder: launch the race (scripts/by_hand/race.py) on 2 gloo ranks, draw its Gantt
charts, and read its timelines and results into the figures the chapter checks."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from ..plots import finish
from . import SCRIPTS


def run_race(args: list, out_json, *, timeout: float = 300, echo: bool = False, nproc: int = 2) -> dict:
    """Launch scripts/by_hand/race.py on `nproc` gloo ranks (2: chapter 03's); returns its JSON. A failure raises
    LaunchError, whose message carries the script's own one-paragraph error (a wrong exercise, a rank that skipped a
    collective...)."""
    from ..launch import LaunchError, torchrun

    out_json = Path(out_json)
    out_json.unlink(missing_ok=True)
    try:
        torchrun(
            SCRIPTS / "race.py",
            nproc,
            [*map(str, args), "--out", out_json],
            timeout=timeout,
            echo=echo,
            env={"OMP_NUM_THREADS": 1},
        )
    except LaunchError as err:
        # The scripts' own one-paragraph messages (main_guard); else the exception lines of the ranks' tracebacks.
        # A paragraph may start mid-line, after another rank's unfinished line on the same pipe.
        lines = [l[l.index("error: ") :] if "error: " in l else l for l in err.result.lines]
        errors = [
            l
            for i, l in enumerate(lines)
            if l.startswith("error:")
            or (l.startswith("       ") and i and lines[i - 1].startswith(("error:", "       ")))
        ]
        errors = errors or [l for l in lines if re.match(r"^(\[rank\d+\]: )?\w+(Error|Exception)\b", l)]
        raise LaunchError("\n".join(dict.fromkeys(errors[:12])) or str(err), err.result) from None
    return json.loads(out_json.read_text())


def plot_gantt(timelines: dict, save_to=None):
    """One row pair per rung: backward (and each gradient's ready time) above, the collectives below."""
    from ..plots import _pyplot

    plt = _pyplot()
    fig, axes = plt.subplots(len(timelines), 1, figsize=(10, 1.3 * len(timelines) + 0.8), sharex=True, squeeze=False)
    for ax, (name, events) in zip(axes[:, 0], timelines.items()):
        for e in events:
            if e["kind"] == "backward":
                ax.barh(1, e["end"] - e["start"], left=e["start"], color="tab:blue", height=0.6)
            elif e["kind"] == "ready":
                ax.plot([e["t"]], [1], "|", color="black", markersize=10)
            elif e["kind"] in ("comm", "comm_sync") and e.get("end") is not None:
                ax.barh(
                    0,
                    e["end"] - e["start"],
                    left=e["start"],
                    color="tab:orange",
                    height=0.6,
                    alpha=0.6,
                    edgecolor="black",
                    linewidth=0.3,
                )
            elif e["kind"] == "step":
                ax.barh(1, e["end"] - e["start"], left=e["start"], color="tab:green", height=0.6)
        ax.set_yticks([0, 1], ["all-reduce", "backward"])
        ax.set_ylabel(name, rotation=0, ha="right", va="center")
    axes[-1, 0].set_xlabel("seconds since the step began (rank 0; ticks: a gradient is ready; green: optimizer step)")
    fig.suptitle("backward compute vs all-reduces, one step of the wide model")
    return finish(fig, save_to)


def overlap_fraction(events: list) -> float:
    """Share of the all-reduce time that ran while backward was still computing."""
    back = [e for e in events if e["kind"] == "backward"]
    comms = [e for e in events if e["kind"] in ("comm", "comm_sync") and e.get("end") is not None]
    total = sum(e["end"] - e["start"] for e in comms)
    if not back or total <= 0:
        return 0.0
    b0, b1 = back[0]["start"], back[0]["end"]
    inside = sum(max(0.0, min(e["end"], b1) - max(e["start"], b0)) for e in comms)
    return inside / total


def launched_during_backward(events: list) -> tuple[int, int]:
    """(all-reduces launched before backward ended, all-reduces) in one step's timeline: a rung whose hooks launch
    them counts every one, whatever the machine's load (the time they then spend under backward does not)."""
    end = next(e["end"] for e in events if e["kind"] == "backward")
    comms = [e for e in events if e["kind"] == "comm"]
    return sum(e["start"] < end for e in comms), len(comms)


def last_bucket(events: list) -> dict:
    """When one step's last collective (a bucketed rung's last bucket: the word embedding's, whose gradient backward
    makes last) ran against backward's end: how long before that end it left (`left_before_ms`, negative if after),
    its time on the cable (`wire_ms`), how much of it came after backward (`after_ms`) and that share (`share_after`).
    Chapter 03 reads it from the dialed race's timeline: most of that bucket's time cannot hide under backward."""
    end = next(e["end"] for e in events if e["kind"] == "backward")
    last = [e for e in events if e["kind"] == "comm"][-1]
    wire = last["end"] - last["start"]
    after = max(0.0, last["end"] - max(last["start"], end))
    return {
        "left_before_ms": 1000 * (end - last["start"]),
        "wire_ms": 1000 * wire,
        "after_ms": 1000 * after,
        "share_after": after / wire if wire > 0 else 0.0,
    }


def rung_summary(res: dict, zero: dict | None = None) -> dict:
    """The benchmark's shape: {contender: {step_time_ratio_vs_ddp, max_weight_diff, collectives_per_step,
    peak_mb_per_rank, ...}} for every rung, and torch's FSDP2 when a race ran the zero section. `res` is a race's
    JSON (its check and timing sections); `zero` the zero section's, when another launch ran it (default: res)."""
    zero = zero or res
    sharding = (zero.get("sharding") or {}).get("contenders", {})
    timings = [t for t in (res.get("timing"), zero.get("zero_timing")) if t]
    out = {}
    for name in [*res["rungs"], *(["fsdp2"] if "fsdp2" in sharding else [])]:
        diffs = [res["check"][m][name]["max_weight_diff"] for m in res["check"] if name in res["check"][m]]
        if name == "fsdp2" and zero.get("zero_check"):
            diffs.append(zero["zero_check"]["max_weight_diff"])
        timed = next((t for t in timings if name in t["ratio_vs_ddp"]), None)
        s = sharding.get(name, {})
        peaks = s.get("peak_mb_per_rank") or []
        out[name] = {
            "step_time_ratio_vs_ddp": timed and timed["ratio_vs_ddp"][name],
            "max_weight_diff": max(diffs) if diffs else None,
            "collectives_per_step": timed and timed["collectives_per_step"][name],
            "peak_mb_per_rank": max(peaks) if peaks and None not in peaks else None,
            "timed_with_foreign_cores": timed and timed["foreign_cores"],
        }
        if s:
            out[name].update(
                {
                    "bytes_per_step": s["bytes_per_step"],
                    "calculator_mb": s["calculator_mb"],
                    "max_weight_diff_vs_fsdp2": s.get("max_weight_diff_vs_fsdp2"),
                }
            )
    return out


def sweep_claims(sweep: dict, chosen_mb: float, bound: float = 0.15) -> tuple[list, float | None, float]:
    """Chapter 03's two claims on a bucket sweep timed in alternating rounds, each (holds, sentence), each on sizes
    compared within a round (the host moves whole rounds): one bucket is slower than the sweep's best size in the
    median round, and a bucket per gradient gains nothing over `chosen_mb`'s few buckets beyond the rounds' noise
    (`bound`, or their spread where wider). Which size comes out fastest is not claimed: on a 2-core host a bucket per
    gradient and a few buckets differ by less than their rounds do (4% one way, 12% the other, in two runs). Returns
    (claims, margin, spread); margin None: the rounds moved by over timing.NOISY_SPREAD, so the claims are shown, not
    checked."""
    from ..bench import timing  # deferred: it imports torch

    rounds = {mb: v.get("bucketed_rounds_s") or [v["bucketed_step_s"]] for mb, v in sweep.items()}
    spread = max(timing.rounds_spread(r) for r in rounds.values())
    margin = timing.checked_margin(bound, spread)
    m = bound if margin is None else margin
    sizes = sorted(sweep, key=float)
    count = {mb: sweep[mb]["bucketed_buckets"] for mb in sizes}
    best = min(sizes, key=lambda mb: sweep[mb]["bucketed_step_s"])
    one, finest, chosen = sizes[-1], sizes[0], next(mb for mb in sizes if float(mb) == float(chosen_mb))

    def paired(a, b):  # a's step over b's, round by round; the median round
        return statistics.median(x / y for x, y in zip(rounds[a], rounds[b]))

    slower, gain = paired(one, best), paired(finest, chosen)
    claims = [
        (
            slower > 1,  # 1.0 exactly where one bucket is the best size itself
            f"one bucket ({one} MiB) is slower than the sweep's best size ({best} MiB, {count[best]} buckets): "
            f"{slower:.2f}x its step in the median round, since nothing leaves before backward ends",
        ),
        (
            gain >= 1 - m,
            f"about a bucket per gradient ({finest} MiB: {count[finest]} buckets) gains nothing over {chosen} MiB's "
            f"{count[chosen]} (within {100 * m:.0f}%): {gain:.2f}x their step in the median round",
        ),
    ]
    return claims, margin, spread


def ladder_sketch(sizes=(0.4,) * 7 + (2.2,), fixed=0.8, step=1.0) -> dict:
    """The idea of rungs 1-5 as one step's timeline, sketched from assumed figures, not measured: backward makes one
    gradient per time unit, the last (the word embedding) the largest; a message on the link costs `fixed` plus its
    size and waits for the one before it. {rung: [(row, start, length, kind)]}: row 1 backward and the optimizer step,
    row 0 the messages; kind backward, ready, all_reduce, reduce_scatter, all_gather or step."""
    end = float(len(sizes))
    ready = [i + 1.0 for i in range(len(sizes))]

    def send(msgs):  # [(launch time, size)] -> the messages' bars, one after another on the link
        bars, free = [], 0.0
        for launch, size in msgs:
            start = max(launch, free)
            free = start + fixed + size
            bars.append((start, fixed + size))
        return bars

    buckets = [(4.0, sum(sizes[:4])), (7.0, sum(sizes[4:7])), (end, sum(sizes[7:]))]  # 3 buckets: as DDP's rule cuts
    plans = {
        "naive": [(end, s) for s in sizes],
        "flat": [(end, sum(sizes))],
        "overlapped": list(zip(ready, sizes)),
        "bucketed": buckets,
    }
    out = {}
    for rung, msgs in plans.items():
        bars = [(0, a, b, "all_reduce") for a, b in send(msgs)]
        done = max(a + b for _, a, b, _ in bars)
        out[rung] = [(1, 0.0, end, "backward"), *[(1, t, 0.0, "ready") for t in ready], *bars, (1, done, step, "step")]
    rs = (0, end, fixed + sum(sizes) / 2, "reduce_scatter")  # a ring's: half an all-reduce's bytes each
    ag = (0, end + rs[2] + step / 2, rs[2], "all_gather")
    zero = [(1, end + rs[2], step / 2, "step")]  # AdamW on this rank's half only
    out["ZeRO-1"] = [(1, 0.0, end, "backward"), *[(1, t, 0.0, "ready") for t in ready], rs, *zero, ag]
    return out


def plot_ladder(save_to=None):
    """ladder_sketch() drawn as plot_gantt draws a measured step: a picture of the idea before the race measures it."""
    from ..plots import _pyplot

    plt = _pyplot()
    sketch = ladder_sketch()
    colors = {"backward": "tab:blue", "step": "tab:green", "all_reduce": "tab:orange"}
    colors.update({"reduce_scatter": "tab:red", "all_gather": "tab:purple"})
    fig, axes = plt.subplots(len(sketch), 1, figsize=(9, 1.05 * len(sketch) + 0.9), sharex=True)
    for ax, (rung, bars) in zip(axes, sketch.items()):
        for row, start, length, kind in bars:
            if kind == "ready":
                ax.plot([start], [row], "|", color="black", markersize=9)
                continue
            label = kind.replace("_", "-") if kind in ("reduce_scatter", "all_gather") else None
            ax.barh(row, length, left=start, color=colors[kind], height=0.6, edgecolor="black", lw=0.3, label=label)
        ax.set_yticks([0, 1], ["messages", "compute"])
        ax.set_ylabel(rung, rotation=0, ha="right", va="center")
        if rung == "ZeRO-1":
            ax.legend(loc="lower right", fontsize=8)
    axes[-1].set_xlabel("time in one step (a sketch: 8 gradients, one per unit; ticks: a gradient is ready)")
    fig.suptitle("the ladder, sketched (not measured): blue backward, orange all-reduces, green optimizer step")
    return finish(fig, save_to)
