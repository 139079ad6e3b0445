"""The kill and the resume of a run, as a timeline: the optimizer step each rank reached against the wall clock, from
the events the fault wrapper notes (faults.timeline: each process's start, each step's end, the fault).

    story = kill_story(faults.timeline(run_dir), resumed_step=32, every=16)
    story.lost_s, story.restart_s, story.redone
    plot_kill_and_resume(story)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class KillStory:
    lines: dict  # (attempt, rank) -> [(seconds since the first start, global step)], the process start at its step
    kill: tuple  # (seconds, global step) of the fault
    killed_rank: int
    resumed_step: int  # the snapshot's step, where attempt 1 starts
    every: int  # a snapshot every `every` steps
    restart_s: float  # from the kill to the first step of the restarted group
    lost_s: float  # from the kill until the restarted group was past the killed step again
    redone: int  # steps trained twice


def kill_story(events: list, resumed_step: int, every: int) -> KillStory:
    """Attempt 0 counts steps from 1; attempt 1 from the snapshot it resumed from (`resumed_step`)."""
    t_first = min(e["t"] for e in events)
    lines: dict = {}
    for e in events:
        key = (e["attempt"], e["rank"])
        points = lines.setdefault(key, [])
        base = 0 if e["attempt"] == 0 else resumed_step
        if e["event"] == "start":
            points.append((e["t"] - t_first, base))
        elif e["event"] == "step":
            points.append((e["t"] - t_first, base + len(points)))  # points[0] is the process start
    fault = next(e for e in events if e["event"] == "fault")
    killed_step = max(s for t, s in lines[(0, fault["rank"])])
    kill_t = fault["t"] - t_first
    restarted = [p for (a, _), pts in lines.items() if a == 1 for p in pts[1:]]
    first_back = min(t for t, _ in restarted)
    past = min(t for t, s in restarted if s > killed_step)
    return KillStory(
        lines,
        (kill_t, killed_step),
        fault["rank"],
        resumed_step,
        every,
        first_back - kill_t,
        past - kill_t,
        killed_step - resumed_step,
    )


def plot_kill_and_resume(story: KillStory):
    from distrinews_course.plots import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 3.6))
    for (attempt, rank), points in sorted(story.lines.items()):
        t, s = zip(*points)
        ax.plot(
            t,
            s,
            "-",
            color=f"C{attempt}",
            lw=1.4 if rank == 0 else 0.8,
            alpha=1 if rank == 0 else 0.6,
            label=f"attempt {attempt}, rank {rank}",
        )
        ax.plot(t[0], s[0], "o", color=f"C{attempt}", ms=4)
    top = max(s for pts in story.lines.values() for _, s in pts)
    for snap in range(story.every, top + 1, story.every):
        ax.axhline(snap, color="grey", lw=0.5, ls=":")
    kt, ks = story.kill
    ax.plot(kt, ks, "x", color="tab:red", ms=10, mew=2, label=f"rank {story.killed_rank} killed (SIGKILL)")
    ax.axvspan(
        kt,
        kt + story.restart_s,
        color="tab:red",
        alpha=0.08,
        label=f"restart: {story.restart_s:.1f} s (new processes, imports, snapshot)",
    )
    ax.axhspan(story.resumed_step, ks, color="tab:orange", alpha=0.15, label=f"{story.redone} step(s) trained twice")
    ax.set(
        xlabel="seconds since the launch (dots: a process starts)",
        ylabel="optimizer steps done",
        title=f"kill and resume: the run lost {story.lost_s:.1f} s (dotted: a snapshot every {story.every} steps)",
    )
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.2)
    fig.tight_layout()
    return fig
