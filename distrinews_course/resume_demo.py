"""Chapter 07's kill-and-resume demo with scripts/train_ddp.py: the plan of its runs (how many steps, when to
snapshot, when to kill), the lines of torchrun's log that tell what happened, and the cases its snapshot exercise is
graded on.

    plan = demo_plan(env)                     # the run's sizes on this machine (CPU gloo, or one GPU per rank)
    print("\\n".join(story(result.output)))     # the script's lines and torchrun's failure and restart lines
"""

from __future__ import annotations

import inspect
import math
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from distrinews_lib.training import resume, snapshot

AGENT = re.compile(r"^[IWE]\d{4} [\d:.]+ +\d+ \S+\] ")  # torchrun's own log lines (glog format)
STORY = ("restart_count=", "will restart", "exitcode", "closing signal", "Root Cause", "successfully finished")
PREAMBLE = ("preset ", "plan (", "data: ", "class balance:", "model: ")  # the script's start-up lines
# The CPU demo: the tiny model on 3,200 real AG News texts, with a learning rate that learns well above chance in 100
# steps; one thread per rank (2 ranks on 2 cores).
CPU_RECIPE = ["--config", "cpu_smoke", "--num_samples", 3200, "--eval_samples", 400, "--batch_size", 32, "--lr", 4e-3,
              "--threads", 1]  # fmt: skip


@dataclass
class DemoPlan:
    gpu: bool  # one rank per GPU over NCCL with the preset's model; else 2 gloo processes on the CPU
    nproc: int
    backend: str
    n: int  # training texts
    batch: int  # per process
    recipe: list
    timeout: float
    epochs: int = 2
    out: Path = field(default_factory=lambda: Path("outputs/fault_tolerance"))

    @property
    def steps(self) -> int:
        """Optimizer steps per epoch: each rank sees n / nproc texts, batch at a time."""
        return math.ceil(math.ceil(self.n / self.nproc) / self.batch)

    @property
    def every(self) -> int:
        return max(2, self.steps // 3)  # a snapshot every `every` steps

    @property
    def kill_step(self) -> int:
        return 2 * self.every + 1  # one step after a snapshot

    @property
    def snap_step(self) -> int:
        return self.kill_step // self.every * self.every

    @property
    def expected_snap(self) -> str:
        return f"snap_e001_b{self.snap_step:06d}.pt"

    def train_args(self, run_dir, checkpoint=None) -> list:
        return [*self.recipe, "--epochs", self.epochs, "--backend", self.backend, "--snapshot_every", self.every,
                "--resume", "auto", "--no-progress", "--output", run_dir,
                "--checkpoint", checkpoint or Path(run_dir) / "model.pt"]  # fmt: skip

    def describe(self) -> str:
        return (
            f"{self.nproc} processes ({self.backend}), {self.n} training texts, batch {self.batch} per process: "
            f"{self.steps} optimizer steps per epoch, {self.epochs} epochs\na snapshot every {self.every} steps; in "
            f"run B rank 1 dies after step {self.kill_step}"
        )


def demo_plan(env, timeout_s: float | None = None) -> DemoPlan:
    gpu = env.n_gpus >= 2 and not env.smoke
    nproc = min(max(env.nproc, 2), env.n_gpus) if gpu else max(env.nproc, 2)
    if gpu:
        n, batch = 2560, 32
        recipe = ["--config", env.preset, "--num_samples", n, "--eval_samples", 512, "--batch_size", batch]
    else:
        n, batch, recipe = 3200, 32, CPU_RECIPE
    return DemoPlan(gpu, nproc, "nccl" if gpu else "gloo", n, batch, recipe, timeout_s or (1800 if gpu else 180))


def story(output: str) -> list[str]:
    """The lines that tell a torchrun run's story: the script's own (after its start-up banner, errors in whole
    sentences), and torchrun's failure and restart lines, marked 'torchrun:'."""
    from distrinews_course import faults

    out = []
    for line in faults.tidy(output.splitlines()):
        if not AGENT.match(line):
            if not line.startswith(PREAMBLE):
                out.append(line)
        elif any(key in line for key in STORY):
            out.append("torchrun: " + AGENT.sub("", line).strip())
    return out


def who_noticed(output: str, nproc: int = 2) -> str:
    """How the first attempt ended, as torchrun's log shows it, and no more: whether rank 0 printed its failed
    collective, every exit code torchrun reported (local rank, code, pid), and which processes its agent stopped with
    SIGTERM. Rank 0's exit code is stated only where torchrun reports one; a SIGTERMed pid is named as rank 0 where
    every other local rank is among the failed ones."""
    saw = "a collective operation could not complete" in output
    failed = re.findall(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)", output)
    termed = [
        p
        for p in re.findall(r"Sending process (\d+) closing signal SIGTERM", output)
        if p not in {f[2] for f in failed}
    ]
    first = next(iter(failed), None)
    lines = [
        "rank 0 saw the dropped connection: its all-reduce failed (its error above)"
        if saw
        else "rank 0 printed no failed collective: it never reached its next all-reduce"
    ]
    for code, rank, pid in failed[:1]:
        lines.append(
            f"torchrun reported local rank {rank} (pid {pid}) failed first, exit code {code}"
            + (" (SIGKILL)" if code == "-9" else "")
        )
    if first and first[1] == "0":
        lines.append(f"rank 0 ended on its own, with exit code {first[0]}")
    elif termed:
        lone = nproc - len({f[1] for f in failed}) == 1 and "0" not in {f[1] for f in failed}
        who = f"rank 0 (pid {termed[0]})" if lone and len(termed) == 1 else f"pid {', '.join(termed)}"
        lines.append(f"then torchrun's agent stopped {who} with SIGTERM: rank 0 reported no exit code of its own")
    return "\n".join(lines)


def group_failed(output: str, killed_rank: int = 1) -> bool:
    """torchrun names the first failure it saw: the killed rank's SIGKILL (-9), or, on a busy machine, rank 0 ending
    first because its all-reduce lost the peer (both are gone by torchrun's next look)."""
    first = re.search(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)", output)
    return first is not None and (
        first.groups() == ("-9", str(killed_rank)) or (first.group(2) == "0" and first.group(1) != "0")
    )


def resumed_step(output: str) -> int:
    return int(re.search(r"resumed from \S*snap_e\d+_b(\d+)\.pt", output).group(1))


def resumed_at(output: str) -> tuple[int, int]:
    """(batches skipped into the epoch, optimizer step) from the script's "resumed from ..." line, counted in THIS
    run's batches and steps: on another world size the snapshot's position is rescaled (resume.rescale_schedule)."""
    m = re.search(r"resumed from \S+ \(epoch \d+, (\d+) batches into it, step (\d+)\)", output)
    if m is None:
        raise ValueError("no 'resumed from ... (epoch E, B batches into it, step S)' line in the output")
    return int(m.group(1)), int(m.group(2))


def restart_claims(output: str, plan: DemoPlan, run_dir, checkpoint) -> list:
    """What run B's torchrun log and files must show: torchrun saw the group fail and restarted it, the script started
    twice, resumed from the newest snapshot before the kill, and the restarted attempt saved a checkpoint that loads.
    That rank 1 killed itself after plan.kill_step is the fault's own setting, printed in the story; the timeline
    (fault_timeline.kill_story) is what checks it, from the steps attempt 0 logged."""
    import torch

    from .claims import Claim

    checkpoint = Path(checkpoint)
    n_saved = (
        len(torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]) if checkpoint.exists() else 0
    )
    return [
        Claim(
            "torchrun saw the group fail: rank 1 killed by SIGKILL (exit code -9), or rank 0 ending on the lost peer",
            group_failed(output),
        ),
        Claim(
            "torchrun restarted the worker group",
            "restart_count=1" in output or "will restart worker group" in output,
        ),
        Claim(
            "the training script started twice under one torchrun: the first attempt and the restart",
            output.count(f"preset {plan.recipe[1]} | world size {plan.nproc}") == 2,
        ),
        Claim(
            f"the restarted script resumed from {plan.expected_snap} (step {plan.snap_step}, the newest before the "
            "kill)",
            f"resumed from {Path(run_dir) / 'snapshots' / plan.expected_snap}" in output,
        ),
        Claim(f"the restarted attempt saved {checkpoint.name}, and it loads: {n_saved} tensors", n_saved > 0),
    ]


def show_hang(run_dir, ddp_timeout: float, timeout: float):
    """Launch 2 gloo ranks of scripts/train_ddp.py, rank 1 stopping to join collectives after step 2, with
    --ddp_timeout `ddp_timeout`: print rank 0's error and how the run ended; return (the launch, its claims)."""
    from .faults import WRAPPER
    from .launch import torchrun

    run_dir = Path(run_dir)
    train = [*CPU_RECIPE, "--epochs", 1, "--backend", "gloo", "--ddp_timeout", ddp_timeout, "--no-progress"]
    args = [
        "hang:rank=1:step=2",
        "scripts/train_ddp.py",
        *train,
        "--output",
        run_dir,
        "--checkpoint",
        run_dir / "model.pt",
    ]
    hang = torchrun(WRAPPER, 2, args, timeout=timeout, check=False, echo=False)
    print("\n".join(line for line in hang.lines if "injected fault" in line or line.startswith(("error:", "       "))))
    print(
        f"\nwith --ddp_timeout {ddp_timeout}, the hung run ended by itself after {hang.seconds:.1f} s, exit code "
        f"{hang.returncode}"
    )
    return hang, hang_claims(hang.output, hang.returncode, hang.timed_out)


def hang_claims(output: str, returncode: int, timed_out: bool) -> list:
    """What the hung run's log must show: rank 1 stopped after step 2, the run failed by itself (not by the launch's
    backstop), rank 0 explained the timeout, and exited with the scripts' code for it (3)."""
    from .claims import Claim

    text = " ".join(output.split())
    return [
        Claim("rank 1 stopped joining collectives after step 2", "[rank 1] injected fault: hang after step 2" in text),
        Claim("the run failed by itself instead of hanging to the backstop", returncode != 0 and not timed_out),
        Claim(
            "rank 0 explained the timeout and its causes",
            "could not complete" in text and "skipped a collective" in text,
        ),
        Claim("rank 0 exited with code 3, the scripts' code for a collective timeout", "exitcode: 3" in text),
    ]


def start_epoch(output: str) -> int | None:
    """The epoch a run of scripts/train_ddp.py started training in, read from its log: the epoch of the snapshot it
    resumed from, 1 where --resume auto found nothing readable and started from the beginning, None where the log
    says neither."""
    m = re.search(r"resumed from \S+ \(epoch (\d+), \d+ batches into it", output)
    if m is not None:
        return int(m.group(1))
    return 1 if re.search(r"resume auto: no (readable )?snapshot in \S+; starting from the beginning", output) else None


def initial_weights(checkpoint) -> dict:
    """The weights a run started from: its model built again with the seed its checkpoint records, untrained."""
    import torch

    from distrinews_lib.data.texts import AG_NEWS_LABELS
    from distrinews_lib.models.build import build_model
    from distrinews_lib.training.config import RunConfig

    meta = torch.load(checkpoint, map_location="cpu", weights_only=True)["metadata"]
    model = build_model(RunConfig(model=meta["model"], seed=meta["seed"]), AG_NEWS_LABELS)[0]
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def snapshot_contents(path) -> list[str]:
    """A snapshot's fields, one line each, for the chapter's look inside one."""
    snap = snapshot.read_snapshot(path)
    opt_state = snap["optimizer"]["state"]
    return [
        f"position       : epoch {snap['epoch']}, batch {snap['batches_done']}, global step {snap['global_step']}, "
        f"world size {snap['world_size']}",
        *(  # an epoch-end snapshot is named after where training resumes: the next epoch's batch 0
            [f"                 (written at the end of epoch {snap['epoch'] - 1}: named by where a resume starts)"]
            if snap["batches_done"] == 0 and snap["meters"] is None
            else []
        ),
        f"model tensors  : {len(snap['model'])}",
        f"optimizer state: {len(opt_state)} parameters x {sorted(next(iter(opt_state.values())))}",
        f"scheduler      : last_epoch {snap['scheduler']['last_epoch']}",
        f"RNG states     : {len(snap['rng'])} ranks x {sorted(snap['rng'][0])}",
        f"epoch counters : {'none (an epoch-end snapshot)' if snap['meters'] is None else sorted(snap['meters'][0])}",
    ]


def snapshot_code() -> str:
    """The code behind the chapter's snapshot table, read from the library: `Snapshotter.save`, which every rank
    calls, then the lines of `ResumeChoice.load_into` that give each rank its position, counters and RNG back."""
    load = inspect.getsource(resume.ResumeChoice.load_into).splitlines()
    first = next(i for i, line in enumerate(load) if "snap.global_step = payload" in line)
    last = next(i for i, line in enumerate(load) if "set_rng_state(rngs[snap.rank])" in line)
    return (
        inspect.getsource(snapshot.Snapshotter.save)
        + "\n    # ... ResumeChoice.load_into (resume.py), on every rank, once the model and optimizer are loaded:\n"
        + "\n".join(load[first : last + 1])
    )


def pick_snapshot_cases(run_a, root):
    """The cases exercise 1 grades pick_snapshot(run_dir) on: folders built from run A's two snapshots (hard links
    where intact, cut copies where damaged), each named by what must hold and judged with the mistake that breaks it.
    Every mistake named here has a mutant in PICK_MISTAKES (tests/test_pick_snapshot_exercise.py)."""
    older, newer = snapshot.list_snapshots(run_a)[-2:]
    root = Path(root)
    shutil.rmtree(root, ignore_errors=True)

    def folder(name, intact=(), cut=(), copied=()):
        d = root / name / "snapshots"
        d.mkdir(parents=True)
        for p in intact:
            os.link(p, d / p.name)
        for p in cut:
            (d / p.name).write_bytes(p.read_bytes()[: p.stat().st_size // 3])
        for p in copied:  # its own file (a hard link would share its modification time with run A's)
            shutil.copyfile(p, d / p.name)
        return d.parent

    trap = folder("older_touched_last", intact=(newer,), copied=(older,))
    os.utime(trap / "snapshots" / older.name, (time.time() + 60,) * 2)  # the older file was modified last (a copy)
    (root / "no_snapshots").mkdir()

    def expect(name, mistake):
        def judge(got):
            if name is None:
                return None if got is None else f"returned {Path(got).name}, expected None: {mistake}"
            if got is None:
                return f"returned None, expected {name}: {mistake}"
            return None if Path(got).name == name else f"returned {Path(got).name}, expected {name}: {mistake}"

        return judge

    return [
        ("both intact: the newest by epoch, then batch", (folder("intact", intact=(older, newer)),),
         expect(newer.name, f"{older.name} is older; list_snapshots is oldest first, ordered by epoch then batch "
                            "(not by the batch number alone)")),
        ("the newest cut short: read it, catch SnapshotError, fall back", (folder("newest_cut", intact=(older,),
                                                                                  cut=(newer,)),),
         expect(older.name, "it returned a file it never read; read_snapshot raises SnapshotError for it")),
        ("every snapshot cut short: return None", (folder("all_cut", cut=(older, newer)),),
         expect(None, "a file that cannot be read is no snapshot; with none readable, start from the beginning")),
        ("no snapshots folder: return None, not an error", (root / "no_snapshots",),
         expect(None, "a fresh run folder has nothing to resume")),
        ("the older file modified last: order by name", (trap,),
         expect(newer.name, "it ordered by modification time; a copied file is newer on disk, not in training")),
    ]  # fmt: skip


def _readable(paths):
    for path in paths:
        try:
            snapshot.read_snapshot(path, mmap=True)
        except snapshot.SnapshotError:
            continue
        return path
    return None


def _newest_unread(run_dir):
    return (snapshot.list_snapshots(run_dir) or [None])[-1]


def _uncaught(run_dir):
    for path in reversed(snapshot.list_snapshots(run_dir)):
        snapshot.read_snapshot(path, mmap=True)
        return path
    return None


def _oldest_first(run_dir):
    return _readable(snapshot.list_snapshots(run_dir))


def _by_batch_alone(run_dir):
    found = (Path(run_dir) / "snapshots").glob("snap_e*_b*.pt")
    return _readable(sorted(found, key=lambda p: int(p.stem.split("_b")[1]), reverse=True))


def _last_even_if_cut(run_dir):
    snaps = snapshot.list_snapshots(run_dir)
    return _readable(reversed(snaps)) or (snaps[0] if snaps else None)


def _listdir(run_dir):
    names = sorted(os.listdir(Path(run_dir) / "snapshots"), reverse=True)
    return _readable(Path(run_dir) / "snapshots" / n for n in names)


def _by_mtime(run_dir):
    return _readable(sorted(snapshot.list_snapshots(run_dir), key=lambda p: p.stat().st_mtime, reverse=True))


# Exercise 1's usual mistakes: name -> (a pick_snapshot that makes it, the words of the one line that must name it)
PICK_MISTAKES = {
    "trusts the newest file without reading it": (_newest_unread, "it returned a file it never read"),
    "reads it but lets SnapshotError escape": (_uncaught, "raised SnapshotError"),
    "takes the list oldest first": (_oldest_first, "list_snapshots is oldest first"),
    "orders by the batch number alone, not epoch then batch": (_by_batch_alone, "not by the batch number alone"),
    "returns a cut file when none can be read": (_last_even_if_cut, "with none readable, start from the beginning"),
    "fails when there is no snapshots folder": (_listdir, "raised FileNotFoundError"),
    "orders by modification time": (_by_mtime, "it ordered by modification time"),
}
for _wrong, _ in PICK_MISTAKES.values():
    _wrong.__name__ = "pick_snapshot"  # the grader's lines then read as a learner's would
