"""How long a checkpoint blocks training, from what scripts/train_sharded.py records on every rank (result.json: each
optimizer step's start and end, each save's call, return and commit), and the timeline of it.

    saves = blocked(result)                 # per save: mode, how long the group was blocked, how long it wrote after
    async_blocks_less(saves)                # the claim chapter 07 checks
    print(totals_line(result, saves, os.cpu_count(), gpu=False))   # what the async save cost in all, and why
    plot_saves(result)                      # a sync and an async save, side by side, on one time scale
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass
class Save:
    step: int
    mode: str  # "sync" or "async"
    blocked_ms: float  # from the last rank's call to the last rank's return: the group waits for its slowest rank
    background_ms: float  # from that return to the last rank's commit (0 for a sync save: it had committed)


def _save(rank: dict, step: int) -> dict:
    return next(s for s in rank["saves"] if s["step"] == step)


def blocked(result: dict) -> list[Save]:
    """Each save, measured for the group. A rank that calls save() early waits in its barrier for the others; that
    wait is the ranks' imbalance, not the save's cost, so the clock starts when the LAST rank calls."""
    out = []
    ranks = result["ranks"]
    for s in ranks[0]["saves"]:
        call, back, done = (max(_save(r, s["step"])[k] for r in ranks) for k in ("started", "returned", "committed"))
        out.append(Save(s["step"], s["mode"], 1000 * (back - call), 1000 * max(0.0, done - back)))
    return out


def async_blocks_less(saves: list[Save]) -> bool:
    """Every async save blocked the group for less time than the fastest sync save of the same run. No margin is
    needed: both write the same bytes; the async one returns after its copy in memory, the sync one after the whole
    write (serialise, write, fsync). The first save of a run also pays DCP's one-time costs; comparing with the
    fastest sync save keeps that out of the sync side."""
    syncs = [s.blocked_ms for s in saves if s.mode == "sync"]
    asyncs = [s.blocked_ms for s in saves if s.mode == "async"]
    return bool(syncs and asyncs) and max(asyncs) < min(syncs)


def steps_beside_writes(result: dict) -> list[list[float]]:
    """Per rank, in step order, the times (ms) of the steps that overlapped an async save's background write."""
    out = []
    for r in result["ranks"]:
        writes = [(s["returned"], s["committed"]) for s in r["saves"] if s["mode"] == "async" and s["committed"]]
        out.append([1000 * (b - a) for _, a, b in r["steps"] if any(a < w1 and b > w0 for w0, w1 in writes)])
    return out


def steps_during_writes(result: dict) -> tuple[float, float, int]:
    """(median step ms of the steps that overlapped an async save's background write, median of the others, how many
    overlapped), over every rank: what the write costs the training that goes on beside it. The median of an even
    count is the mean of the two middle values (statistics.median)."""
    during, other = [], []
    for r in result["ranks"]:
        writes = [(s["returned"], s["committed"]) for s in r["saves"] if s["mode"] == "async" and s["committed"]]
        for _, a, b in r["steps"]:
            (during if any(a < w1 and b > w0 for w0, w1 in writes) else other).append(1000 * (b - a))
    median = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
    return median(during), median(other), len(during)


def beside_writes_line(result: dict) -> str:
    """One line on the steps that ran beside the background write: each one's time, rank by rank in step order, their
    median, and the other steps' median, so that the figures the sentence states are the ones listed."""
    during, other, n = steps_during_writes(result)
    if not n:
        return f"no step overlapped a background write; the steps took {other:.0f} ms (median)"
    per_rank = "; ".join(
        f"rank {i}: {', '.join(f'{ms:.0f}' for ms in xs)} ms" for i, xs in enumerate(steps_beside_writes(result)) if xs
    )
    return (
        f"the {n} steps beside the background write ({per_rank}) took {during:.0f} ms (median), "
        f"{during / other:.2f}x the {other:.0f} ms median of the other steps"
    )


def write_slowdown_ms(result: dict) -> float:
    """What the async saves' background writes cost the steps beside them, per rank: the sum over those steps of
    their time less the median of the other steps, over the number of ranks. Add the async save's blocked time to
    compare its whole cost with a sync save's blocked time."""
    _, other, _ = steps_during_writes(result)
    extra = 0.0
    for r in result["ranks"]:
        writes = [(s["returned"], s["committed"]) for s in r["saves"] if s["mode"] == "async" and s["committed"]]
        extra += sum(1000 * (b - a) - other for _, a, b in r["steps"] if any(a < w1 and b > w0 for w0, w1 in writes))
    return extra / len(result["ranks"])


def slowdown_spread_ms(result: dict) -> float:
    """How far write_slowdown_ms can move from step-to-step noise alone: the interquartile range of the steps that
    did not overlap a write, times the steps per rank that did (the slowdown sums that many steps' excess over the
    median). 0 when no step overlapped a write or fewer than two others ran."""
    during, other = [], []
    for r in result["ranks"]:
        writes = [(s["returned"], s["committed"]) for s in r["saves"] if s["mode"] == "async" and s["committed"]]
        for _, a, b in r["steps"]:
            (during if any(a < w1 and b > w0 for w0, w1 in writes) else other).append(1000 * (b - a))
    if not during or len(other) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(other, n=4)
    return (q3 - q1) * len(during) / len(result["ranks"])


def totals_line(result: dict, saves: list[Save], cores: int, gpu: bool) -> str:
    """The async save's whole cost to the training (the time it blocked plus write_slowdown_ms) against the fastest
    sync save's blocked time, and one sentence on what to take from it. When the two differ by no more than
    slowdown_spread_ms, the run cannot tell which costs more, and the sentence says so. On CPU ranks the background
    write competes with the training for the same cores, so it can give back what it saved in blocking; on GPU ranks
    the steps run on the GPU and the write on the CPU beside them."""
    sync_ms = min(s.blocked_ms for s in saves if s.mode == "sync")
    async_ms = max(s.blocked_ms for s in saves if s.mode == "async")
    slow_ms = write_slowdown_ms(result)
    total, n = async_ms + slow_ms, len(result["ranks"])
    head = (
        f"on this run that write slowed the steps beside it by {slow_ms:.0f} ms per rank: with the {async_ms:.0f} ms "
        f"it blocked, the async save cost the training {total:.0f} ms, "
        f"{'more' if total > sync_ms else 'less'} than the fastest sync save's {sync_ms:.0f} ms"
    )
    spread = slowdown_spread_ms(result)
    if abs(total - sync_ms) <= spread:
        return (
            f"{head}.\ntoo close to call on this run: the {abs(round(total) - round(sync_ms))} ms between them is "
            f"inside the steps' own spread ({spread:.0f} ms: the other steps' interquartile range times the steps per "
            "rank beside the write)."
        )
    if total <= sync_ms:
        return f"{head}.\nasync paid here: the steps beside its background write lost less than a sync save blocks."
    if gpu:
        why = "the CPU that writes also feeds the GPUs, and the write took more from the steps than async saved"
    else:
        why = (
            f"the write ran on the same {cores} CPU core(s) as the {n} training ranks and took back from their steps "
            "what it saved in blocking; on GPUs the steps run on the GPU and the write on the CPU beside them, which "
            "is where async can pay"
        )
    return f"{head}.\nasync blocked less but did not pay here: {why}."


def table(saves: list[Save]) -> str:
    rows = [f"{'save at step':>12} {'mode':>6} {'training blocked':>17} {'written after':>14}"]
    for s in saves:
        after = f"{s.background_ms:>11.0f} ms" if s.mode == "async" else f"{'-':>14}"
        rows.append(f"{s.step:>12} {s.mode:>6} {s.blocked_ms:>14.0f} ms {after}")
    return "\n".join(rows)


def plot_saves(result: dict, window_s: float | None = None):
    """One panel per save mode (the first sync and the first async save): each rank's optimizer steps (grey), the
    time its training was blocked (red), and the async save's background write (hatched), on one time scale."""
    from distrinews_course.plots import _pyplot

    plt = _pyplot()
    saves = blocked(result)
    picked = [next(s for s in saves if s.mode == m) for m in ("sync", "async") if any(s.mode == m for s in saves)]
    ranks = result["ranks"]
    step_s = sorted(t1 - t0 for _, t0, t1 in ranks[0]["steps"])[len(ranks[0]["steps"]) // 2]
    window = window_s or max(s.blocked_ms + s.background_ms for s in picked) / 1000 + 4 * step_s
    fig, axes = plt.subplots(1, len(picked), figsize=(11, 1.2 + 0.45 * len(ranks)), sharey=True, squeeze=False)
    for ax, save in zip(axes[0], picked):
        t0 = min(_save(r, save.step)["started"] for r in ranks) - 1.5 * step_s
        for y, r in enumerate(ranks):
            for _, a, b in r["steps"]:
                if b > t0 and a < t0 + window:
                    ax.barh(y, b - a, left=a - t0, color="lightgrey", edgecolor="grey", height=0.6)
            mine = _save(r, save.step)
            a, b = mine["started"], mine["returned"]
            ax.barh(y, b - a, left=a - t0, color="tab:red", height=0.6, label="training blocked")
            if save.mode == "async":
                a, b = mine["returned"], mine["committed"]
                ax.barh(
                    y + 0.35,
                    b - a,
                    left=a - t0,
                    color="none",
                    edgecolor="tab:red",
                    hatch="///",
                    height=0.25,
                    label="written in the background" if y == 0 else None,
                )
        ax.set(
            xlim=(0, window),
            xlabel="seconds",
            title=f"{save.mode} save at step {save.step}: blocked {save.blocked_ms:.0f} ms",
            yticks=range(len(ranks)),
            yticklabels=[f"rank {r['rank']}" for r in ranks],
        )
    axes[0][0].invert_yaxis()
    handles = {h.get_label(): h for ax in axes[0] for h in ax.containers}
    fig.legend(
        [handles[k] for k in ("training blocked", "written in the background") if k in handles],
        [k for k in ("training blocked", "written in the background") if k in handles],
        loc="upper center",
        ncol=2,
        fontsize=8,
        title="grey: optimizer steps",
        title_fontsize=8,
        frameon=False,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.78))
    return fig
