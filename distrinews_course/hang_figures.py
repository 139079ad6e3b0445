"""Chapter 12's pictures: each rank's collectives on a timeline, with the one that never came; and when each rank
reaches each step's all-reduce, where a straggler shows as the rank the others wait for."""

from __future__ import annotations

from pathlib import Path

from .plots import _pyplot

COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:purple")


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
    fig.tight_layout()
    if save_to:
        Path(save_to).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(save_to, dpi=110)
    return fig


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
    fig.tight_layout()
    if save_to:
        Path(save_to).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(save_to, dpi=110)
    return fig
