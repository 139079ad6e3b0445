"""The kill and the resume of a run, as a timeline: the optimizer step each rank reached against the wall clock, from
the events the fault wrapper notes (faults.timeline: each process's start, each step's end, the fault).

    story = kill_story(faults.timeline(run_dir), total_steps=100, every=16)
    story.resumed_step, story.lost_s, story.restart_s, story.back_s, story.step_s, story.redone
    plot_kill_and_resume(story)
    plot_resume_plan(plan)   # before run B: the kill, the restart and the resume from a snapshot, as planned

The step attempt 1 resumed at is measured, not given: the run's total steps less the steps attempt 1 trained.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class KillStory:
    lines: dict  # (attempt, rank) -> [(seconds since the first start, global step)], the process start at its step
    kill: tuple  # (seconds, global step) of the fault
    killed_rank: int
    resumed_step: int  # where attempt 1 started: the total steps less the steps it trained
    every: int  # a snapshot every `every` steps
    restart_s: float  # from the kill to the first process of the restarted group
    back_s: float  # from there until every restarted rank was back at the killed step (imports, load, redone steps)
    step_s: float  # median time of one step, a process's first step left out (it also pays the start-up)
    redone: int  # steps trained twice

    @property
    def lost_s(self) -> float:
        """From the kill until the restarted group was back at the step it had reached."""
        return self.restart_s + self.back_s


def _steps_of(points: list) -> list[float]:
    return [b - a for (a, _), (b, _) in zip(points[1:], points[2:])]  # points[0] is the start, points[1] pays start-up


def kill_story(events: list, total_steps: int, every: int) -> KillStory:
    """Attempt 0 counts steps from 1; attempt 1 ends at `total_steps`, so it started at total_steps less its steps.
    Raises ValueError if attempt 1's ranks trained different numbers of steps (no single resume step)."""
    t_first = min(e["t"] for e in events)
    counts: dict = {}
    for e in events:
        if e["event"] == "step":
            counts[(e["attempt"], e["rank"])] = counts.get((e["attempt"], e["rank"]), 0) + 1
    resumed = {total_steps - n for (a, _), n in counts.items() if a == 1}
    if len(resumed) != 1:
        raise ValueError(f"attempt 1's ranks trained different numbers of steps: {sorted(counts.items())}")
    resumed_step = resumed.pop()
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
    attempt1 = [pts for (a, _), pts in lines.items() if a == 1]
    first_start = min(pts[0][0] for pts in attempt1)
    back = max(next(t for t, s in pts if s >= killed_step) for pts in attempt1)
    steps = sorted(d for pts in lines.values() for d in _steps_of(pts))
    return KillStory(
        lines,
        (kill_t, killed_step),
        fault["rank"],
        resumed_step,
        every,
        first_start - kill_t,
        back - first_start,
        steps[len(steps) // 2] if steps else float("nan"),
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
        label=f"until new processes start: {story.restart_s:.1f} s",
    )
    ax.axvspan(
        kt + story.restart_s,
        kt + story.lost_s,
        color="tab:orange",
        alpha=0.08,
        label=f"imports, snapshot load, redone step(s): {story.back_s:.1f} s",
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


def resume_plan(steps_per_epoch: int, epochs: int, every: int, kill_step: int) -> dict:
    """Run B's plan in optimizer steps, for the picture drawn before it runs: attempt 0 trains steps 1..kill_step,
    writing a snapshot after every `every`-th and at each epoch's end; the restarted attempt 1 loads the newest
    snapshot before the kill and trains from it to the end, so the steps between that snapshot and the kill are
    trained twice."""
    total = steps_per_epoch * epochs
    snapshots = sorted({*range(every, total + 1, every), *range(steps_per_epoch, total + 1, steps_per_epoch)})
    snap = max((s for s in snapshots if s <= kill_step), default=0)  # none yet: from the beginning
    return {
        "attempt 0": (0, kill_step),
        "attempt 1": (snap, total),
        "redone": (snap, kill_step),
        "snapshots": snapshots,
        "epoch ends": [steps_per_epoch * e for e in range(1, epochs + 1)],
    }


def plot_resume_plan(plan):
    """The schematic before run B (plan: a resume_demo.DemoPlan): two bars of optimizer steps, attempt 0 killed and
    attempt 1 resumed from the newest snapshot before the kill, with the snapshots and the steps trained twice."""
    from distrinews_course.plots import _pyplot, finish

    p = resume_plan(plan.steps, plan.epochs, plan.every, plan.kill_step)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 2.6))
    for y, name in ((1, "attempt 0"), (0, "attempt 1")):
        lo, hi = p[name]
        ax.barh(y, hi - lo, left=lo, height=0.35, color=f"C{y ^ 1}", alpha=0.7)
        snaps = [s for s in p["snapshots"] if lo < s <= hi]
        ax.plot(snaps, [y] * len(snaps), "D", color="black", ms=5, label="snapshot written" if y else None)
    lo, hi = p["redone"]
    ax.barh(0, hi - lo, left=lo, height=0.35, fill=False, hatch="///", edgecolor="tab:orange", label="trained twice")
    ax.plot(plan.kill_step, 1, "x", color="tab:red", ms=9, mew=2, label=f"rank 1 killed after step {plan.kill_step}")
    ax.annotate("", xy=(lo, 0.19), xytext=(lo, 0.81), arrowprops={"arrowstyle": "->"})
    ax.text(
        lo + 1.5, 0.5, "torchrun restarts every rank; --resume auto loads the newest snapshot", va="center", fontsize=8
    )
    for end in p["epoch ends"]:
        ax.axvline(end, color="grey", lw=0.8, ls="--")
    ax.set_yticks([1, 0], ["attempt 0", "attempt 1"])
    ax.set(ylim=(-0.5, 1.6), xlim=(0, p["attempt 1"][1] + 1), xlabel="optimizer step (dashed: an epoch ends)",
           title="run B, as planned: kill, restart, resume")  # fmt: skip
    ax.legend(fontsize=7, loc="upper right")
    return finish(fig)
