"""Chapter 12's scenarios: each planted bug, the tools its run is started with, and what each run is read for.

lab = chapter_lab(nproc=2, hang_s=3)    every run of the chapter, not started yet (lab.get(name) starts them all)
skip_batches(world=2)                     {rank: batches} in section 1's uneven shards, as its script deals them
scenario_table(lab)                       one line per run: its script, its arguments, its tools
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .bench.provenance import machine_slug
from .hang_lab import HangLab, Scenario

PITFALLS, HANGS = "scripts/pitfalls", "scripts/hangs"
STRAGGLER_READ_MS = 120  # how much longer each of the straggler's reads takes
STRAGGLER_STEPS = 60  # the doctor needs 10 steps past start-up; a busy machine leaves it few chances to look


def skip_batches(world: int = 2, batch_size: int = 4) -> dict:
    """{rank: batches} as scripts/pitfalls/07_uneven_inputs.py deals them: N = 3 * batch_size * world + 1 samples, one
    too many for even shards, sharded by hand (rank, rank + world, ...) into batches of batch_size, the last one short.
    Section 1's picture is drawn from it; the run's own counts (its my_batches lines) are checked against it."""
    n = 3 * batch_size * world + 1
    return {rank: -(-len(range(rank, n, world)) // batch_size) for rank in range(world)}


def chapter_lab(nproc: int, hang_s: float, timeout_s: float = 120.0, launch_limit_s: float = 10.0) -> HangLab:
    """The chapter's runs. A hanging run's collectives time out after lab.group_timeout_s (hang_s plus the doctor's
    grace); rank 0's save outlasts that by 1.5 s, in the broken slow save and in the fixed one, which runs alone with
    the same group timeout (in the shared launch of the other fixes, run_together's group would wait 60 s, and the
    bug would pass too). launch_limit_s: the launcher's own limit in the run that has no collective timeout of its
    own."""
    lab = HangLab(nproc, hang_s, timeout_s=timeout_s)
    group = f"{lab.group_timeout_s:g}"
    save = f"{lab.group_timeout_s + 1.5:g}"
    straggle = ["--read_ms", STRAGGLER_READ_MS, "--steps", STRAGGLER_STEPS, "--ddp_timeout", group]
    fixes = [
        f"{PITFALLS}/07_uneven_inputs.py", "--mode", "fixed", "--",
        f"{HANGS}/class_counts.py", "--mode", "fixed", "--",
        f"{HANGS}/dies_mid_step.py", "--mode", "fixed",
    ]  # fmt: skip
    for s in [
        Scenario("skip", f"{PITFALLS}/07_uneven_inputs.py", ["--mode", "broken", "--ddp_timeout", group],
                 debug_server=True, probe="hung", planted=1, nproc=2),  # rank 0 gets the extra sample: 1 skips
        Scenario("slow_save", f"{HANGS}/slow_save.py", ["--mode", "broken", "--ddp_timeout", group, "--save_s", save],
                 debug_server=True, probe="hung", pyspy_ranks=(0, 1), planted=0),
        Scenario("slow_save_fixed", f"{HANGS}/slow_save.py",  # alone: run_together's group would wait 60 s
                 ["--mode", "fixed", "--ddp_timeout", group, "--save_s", save,
                  "--path", f"{lab.out}/slow_save_fixed/slow_save.pt"]),
        Scenario("monitored", f"{HANGS}/slow_save.py",
                 ["--mode", "monitored", "--ddp_timeout", f"{hang_s:g}", "--save_s", save], doctor=False, planted=0),
        Scenario("mismatch", f"{HANGS}/class_counts.py", ["--mode", "broken", "--ddp_timeout", group], planted=1),
        Scenario("mismatch_detail", f"{HANGS}/class_counts.py", ["--mode", "broken", "--ddp_timeout", group],
                 doctor=False, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, planted=1),
        Scenario("dies", f"{HANGS}/dies_mid_step.py", ["--mode", "broken", "--ddp_timeout", group], log_dir=True,
                 planted=1),
        Scenario("straggler", f"{HANGS}/straggler.py", ["--mode", "broken", *straggle], debug_server=True,
                 probe=("collectives", STRAGGLER_STEPS * 2 // 3), planted=1),  # read late: more steps to show
        Scenario("straggler_fixed", f"{HANGS}/straggler.py", ["--mode", "fixed", *straggle], debug_server=True,
                 probe=("collectives", STRAGGLER_STEPS // 2)),  # its steps are quick: read before the run ends
        Scenario("mystery", f"{HANGS}/mystery.py", ["--ddp_timeout", group], nproc=3, doctor=False,
                 debug_server=True, probe="hung"),
        Scenario("no_timeout", f"{PITFALLS}/09_one_rank_collective.py", ["--mode", "broken", "--ddp_timeout", 1800],
                 doctor=False, timeout_s=launch_limit_s),
        Scenario("fixes", "distrinews_course.demo", fixes, module=True),
    ]:  # fmt: skip
        lab.add(s)
    return lab


def scenario_table(lab: HangLab) -> str:
    rows = [("run", "script", "tools")]
    for s in lab.scenarios.values():
        tools = [t for t, on in (("debug server", s.debug_server), ("hang doctor", s.doctor)) if on]
        tools += [f"{k}={v}" for k, v in s.env.items()] + (["torchrun --log-dir"] if s.log_dir else [])
        tools += ["py-spy"] if s.pyspy_ranks else []
        script = s.script.rsplit("/", 1)[-1] if not s.module else "the fixed runs, in one launch"
        rows.append((s.name, script, ", ".join(tools) or "-"))
    width = [max(len(r[i]) for r in rows) for i in range(2)]
    return "\n".join(f"{a:<{width[0]}}  {b:<{width[1]}}  {c}" for a, b, c in rows)


def doctor_rows(lab: HangLab, names: list) -> list:
    """(run, planted rank, the ranks the hang doctor named, its kind of verdict, the collective or the time added)
    for each named run: its hang.json, or its straggler.json when it wrote no hang verdict."""
    rows = []
    for name in names:
        run = lab.get(name)
        v = run.doctor or run.straggler or {"culprits": None, "kind": "(no verdict)", "op": "", "seq": None}
        if v["kind"] == "straggler":
            what = f"+{v['details']['added_ms_per_step']:.0f} ms a step"
        else:
            what = f"{v['op']} #{v['seq']}" if v.get("op") else "-"  # a dead rank waits in no collective
        rows.append((name, lab.scenarios[name].planted, v["culprits"], v["kind"], what))
    return rows


def straggler_figures(section_ms: float, collectives: int, details: dict) -> str:
    """One line on the straggler's two figures: section 5's median lateness over the collectives the debug server had
    recorded when it was read, and the doctor's median wait per step over the steps it had seen when it judged (its
    straggler.json details). Two looks at one run, at different moments, over different windows."""
    per = details["per_step"]
    return (
        f"two figures for one straggler: section 5's {section_ms:.0f} ms is rank 1's median lateness over the "
        f"{collectives} collectives the debug server had recorded when it was read; the doctor's "
        f"+{details['added_ms_per_step']:.0f} ms is the median wait rank 1 caused per step ({per} collective"
        f"{'s' if per > 1 else ''} a step) over the {details['steps']} steps the doctor had seen when it judged"
    )


@dataclass
class DoctorCost:
    overhead: float  # median over the pairs of (time per step with the doctor / without) - 1
    pairs: int
    text: str  # the learner's line
    provenance: str  # where the figure comes from: the record's file, machine, commit and load


def doctor_cost(folder="benchmarks") -> DoctorCost:
    """The hang doctor's cost on a healthy run, from scripts/bench_hang_doctor.py's record (this machine's, if there is
    one, else the newest)."""
    records = sorted(Path(folder).glob("hang_doctor_cost_*.json"), key=lambda p: p.stat().st_mtime)
    if not records:
        raise FileNotFoundError(
            f"no benchmarks/hang_doctor_cost_*.json: run scripts/bench_hang_doctor.py (in {folder})"
        )
    mine = [p for p in records if p.stem.endswith(machine_slug())]
    path = (mine or records)[-1]
    rec = json.loads(path.read_text())
    s = rec["summary"]
    load = rec.get("load_average_at_start")
    made = f"recorded at commit {rec.get('git_commit') or '?'}" + (
        " with uncommitted changes" if rec.get("git_dirty") else ""
    )
    made += f", load average {load[0]:g} at its start" if load else ""
    noise = s["min_ratio"] < 1 < s["max_ratio"]  # the pairs went both ways: no cost this benchmark can see
    text = (
        f"the hang doctor's cost on a healthy run{' is within the noise' if noise else ''}: "
        f"{100 * s['overhead']:+.1f}% a step with --debug_hangs (median of {s['pairs']} pairs, "
        f"{100 * (s['min_ratio'] - 1):+.1f}% to {100 * (s['max_ratio'] - 1):+.1f}%; a recorded benchmark, not this run)"
    )
    provenance = (
        f"{path.parent.name}/{path.name}: {rec['machine']}, {rec['nproc']} ranks, train_ddp.py --config cpu_smoke, "
        f"{s['plain_step_ms_median']:.0f} ms a step without the doctor; {made}"
    )
    return DoctorCost(s["overhead"], s["pairs"], text, provenance)
