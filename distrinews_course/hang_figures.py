"""Chapter 12's pictures: the idea of a hang before any run (a rank skips a collective, every rank waits); each rank's
collectives on a timeline, with the one that never came; and when each rank reaches each step's all-reduce, where a
straggler shows as the rank the others wait for."""

from __future__ import annotations

from .plots import _pyplot, finish

COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:purple")


def skipped_collective_picture(batches: dict, save_to=None):
    """The idea of section 1 before its run, drawn from each rank's batch count ({rank: batches}, as
    hang_scenarios.skip_batches deals them): every rank steps through its batches, each step ending in the all-reduce
    that all ranks must join (dotted: the ranks meet there). A rank with fewer batches goes on to the barrier before the
    save; a rank with more waits in its extra step's all-reduce. Each waits, in a different collective, for a partner
    that never comes, until the group's timeout fails them all. Equal counts cannot hang: ValueError."""
    if len(set(batches.values())) < 2:
        raise ValueError(f"every rank has {min(batches.values())} batches: no rank skips a collective")
    plt = _pyplot()
    ranks, last = sorted(batches), max(batches.values())
    step_w, end = 1.0, (last + 1) * 1.0 + 1.6
    fig, ax = plt.subplots(figsize=(9, 1.4 + 0.75 * len(ranks)))
    for step in range(1, last + 1):
        callers = [r for r in ranks if batches[r] >= step]
        x = step * step_w
        if len(callers) == len(ranks):
            ax.plot([x, x], [-0.3, len(ranks) - 0.7], ":", color="grey", lw=1)
    for y, rank in enumerate(ranks):
        color = COLORS[y % len(COLORS)]
        for step in range(1, batches[rank] + 1):
            x = step * step_w
            ax.broken_barh([(x - 0.85 * step_w, 0.75 * step_w)], (y - 0.15, 0.3), color=color, alpha=0.35)
            ax.text(x - 0.47 * step_w, y, f"step {step}", ha="center", va="center", fontsize=7)
            ax.plot([x], [y], "D", color=color, ms=6)
        mine = batches[rank]
        x = mine * step_w
        behind = ", ".join(str(r) for r in ranks if batches[r] < mine)
        ahead = ", ".join(str(r) for r in ranks if batches[r] > mine)
        if mine < last:
            what, start = f"waits in the barrier before the save, which rank {ahead} never reaches", x + 0.1 * step_w
            ax.plot([start], [y], "s", color="black", ms=6)
        else:
            what, start = f"waits in step {mine}'s all-reduce, which rank {behind} never calls", x
        ax.broken_barh([(start, end - start)], (y - 0.18, 0.36), color="tab:red", alpha=0.3)
        ax.text(start + 0.1, y + 0.3, what, fontsize=8, color="darkred", va="center")
    ax.axvline(end, color="black", lw=1.2)
    ax.text(end, -0.45, " the group's timeout:\n every rank fails", fontsize=8, va="center")
    ax.set_yticks(range(len(ranks)), [f"rank {r} ({batches[r]} batches)" for r in ranks])
    ax.set_ylim(len(ranks) - 0.4, -0.7)
    ax.set_xlim(0, end + 1.6)
    ax.set_xticks([])
    ax.set_xlabel("time (diamonds: a step's all-reduce, which every rank must join; dotted: the ranks meet there)")
    ax.set_title("A rank that skips a collective: the others wait in a different one", fontsize=10)
    return finish(fig, save_to)


def collective_timeline(fr: dict, probed_ns: int, save_to=None, title: str = ""):
    """Each rank's Flight Recorder entries on one time axis (seconds from the first collective): a dot per completed
    collective, labelled with its sequence number, and a bar from each waiting collective's start to the moment the
    recorder was read, labelled with what it waits in."""
    plt = _pyplot()
    ranks = sorted(fr)
    t0 = min(e["time_created_ns"] for es in fr.values() for e in es)
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.7 * len(ranks)))
    for y, rank in enumerate(ranks):
        done = [e for e in fr[rank] if e["retired"]]
        xs = [(e["time_created_ns"] - t0) / 1e9 for e in done]
        ax.plot(xs, [y] * len(xs), "o", color=COLORS[y % len(COLORS)], ms=5)
        for e, x in zip(done[-4:], xs[-4:]):
            ax.annotate(
                f"#{e['collective_seq_id']}", (x, y), textcoords="offset points", xytext=(0, 7), fontsize=7, ha="center"
            )
        for e in fr[rank]:
            if e["retired"]:
                continue
            start = (e["time_created_ns"] - t0) / 1e9
            ax.broken_barh(
                [(start, (probed_ns - e["time_created_ns"]) / 1e9)], (y - 0.18, 0.36), color="tab:red", alpha=0.35
            )
            op = e["profiling_name"].split(":", 1)[-1]
            ax.text(start, y - 0.34, f"waits in {op} #{e['collective_seq_id']}", fontsize=8, va="top", color="darkred")
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    ax.set_ylim(len(ranks) - 0.4, -0.8)
    ax.set_xlabel("seconds since the first collective (dots: completed, bars: still waiting when read)")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    return finish(fig, save_to)


def arrival_plot(runs: dict, save_to=None):
    """{label: arrivals (hang_reading.arrivals)}: for each collective, how many ms after the first rank each rank
    arrived, per run; the rank the others wait for rides high."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(runs), figsize=(4.2 * len(runs), 3.0), sharey=True, squeeze=False)
    for ax, (label, rows) in zip(axes[0], runs.items()):
        ranks = sorted({r for row in rows for r in row})
        for i, rank in enumerate(ranks):
            ax.plot(
                range(1, len(rows) + 1),
                [row[rank] for row in rows],
                "o-",
                ms=3,
                color=COLORS[i % len(COLORS)],
                label=f"rank {rank}",
            )
        ax.set(title=label, xlabel="collective (in the order they ran)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("arrived after the first rank (ms)")
    axes[0][0].legend(fontsize=8)
    return finish(fig, save_to)
