"""Plumbing shared by the small demo scripts of chapters 00 (scripts/concepts) and 03 (scripts/pitfalls),
so that each script shows only its concept or its pitfall.

In a script (started by torchrun):
    ctx = start(timeout_s=30)   read torchrun's env, pick the backend (nccl when every rank has its own GPU,
                                else gloo), start the process group with a SHORT timeout: a hang becomes an
                                error in seconds. ctx.rank, ctx.world, ctx.device, ctx.device_ids (for DDP)
    result(ctx, key=value)      print one `RESULT rank=R key=value ...` line (one write: ranks never interleave)
    gather(obj)                 a Python object from every rank (a list, one entry per rank)
    write_json(path, data, ctx.rank)   rank 0 writes the numbers the notebook checks, atomically
    finish()                    free dead DDP models, barrier, destroy the process group, end the process

In a notebook:
    run = SharedLaunch([(script, [args], json_path), ...], nproc, timeout)
    output, data = run("02_ddp_backward.py")   the first call runs EVERY listed script in one launch
                                (python -m distrinews_course.demo A.py ARGS -- B.py ARGS ..., see run_together)
    res, data = run_alone(script, json_path, nproc, timeout, *args)   one script, one launch
    failing = FailingRuns(folder, [(script, [args]), ...], nproc, timeout)
    res = failing("07_uneven_inputs.py", "--mode", "broken")   the first call starts every listed run at once
    results(output)             the RESULT lines as dicts
    show_fix(script)            the lines of a pitfall script marked BUG / FIX, with a line of context
    sections(res.output)        such a launch's output, split per script
    failure_story(res)          the few lines of a failed launch that say what happened
"""

from __future__ import annotations

import gc
import json
import os
import re
import runpy
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from distrinews_lib.distributed import choose_backend, device_for, end_process, torchrun_env
from distrinews_lib.files import atomic_write_json

from .launch import torchrun

_shared = False  # True while run_together() owns the process group: start()/finish() reuse it
MARKER = "=== demo: "  # run_together's line before each script's output


@dataclass
class Ctx:
    rank: int
    local_rank: int
    world: int
    backend: str
    device: torch.device

    @property
    def device_ids(self):
        """DDP's device_ids: this rank's GPU, or None on the CPU."""
        return [self.device.index] if self.device.type == "cuda" else None


def start(timeout_s: float = 30, backend: str = "auto") -> Ctx:
    env = torchrun_env()  # plain `python script.py` works too: a world of one
    backend, _why = choose_backend(backend)
    device = device_for(backend, env.local_rank)  # nccl: torch.cuda.set_device(LOCAL_RANK)
    if not (_shared and dist.is_initialized()):
        dist.init_process_group(
            backend,
            init_method=env.init_method,
            rank=env.rank,
            world_size=env.world_size,
            timeout=timedelta(seconds=timeout_s),
        )
    elif dist.get_backend() != backend:
        raise RuntimeError(f"run_together's process group uses {dist.get_backend()}, this script asks for {backend}")
    return Ctx(env.rank, env.local_rank, env.world_size, backend, device)


def result(ctx_or_rank, **values) -> None:
    rank = ctx_or_rank.rank if isinstance(ctx_or_rank, Ctx) else ctx_or_rank
    fmt = lambda v: json.dumps(v, separators=(",", ":")) if isinstance(v, (list, dict)) else str(v)
    line = " ".join([f"RESULT rank={rank}"] + [f"{k}={fmt(v)}" for k, v in values.items()])
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def gather(obj) -> list:
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def write_json(path, data, rank: int) -> None:
    if rank == 0:
        atomic_write_json(path, data, indent=1)


def report(path, backend_reason: str, **facts) -> None:
    """Chapter 00's hello script hands its facts to the notebook: every rank's `facts` (a tensor as a list, a device
    as its name) and its PID are gathered, and rank 0 writes {"backend_reason", "ranks": [one dict per rank]} to
    `path` (JSON)."""

    def plain(v):
        return v.tolist() if isinstance(v, torch.Tensor) else str(v) if isinstance(v, torch.device) else v

    ranks = gather({**{k: plain(v) for k, v in facts.items()}, "pid": os.getpid()})
    write_json(path, {"backend_reason": backend_reason, "ranks": ranks}, dist.get_rank())


def finish() -> None:
    """The demo is done: free dead DDP models, wait for every rank, and (run alone) destroy the group and END the
    process through end_process, so that gloo's threads cannot abort it at interpreter exit. Inside
    run_together the group stays for the next script, and so does the process."""
    if dist.is_initialized():
        gc.collect()  # free dead DDP models now: one collected after the group is gone can abort the exit
        sys.stdout.flush()
        dist.barrier()  # nobody tears down while a partner is still talking to it
        if not _shared:
            dist.destroy_process_group()
    if not _shared:
        end_process(0)


def run_together(argv: list[str]) -> None:
    """Run demo scripts one after the other in ONE process group: `SCRIPT ARGS... -- SCRIPT ARGS... -- ...`.

    Each launch costs seconds (torchrun, then every rank imports torch and connects); the demos that
    are expected to succeed share one. Each script runs as if started alone (runpy, its own sys.argv);
    its start() and finish() reuse this group. Rank 0 prints a marker line before each script.
    """
    global _shared
    specs, current = [], []
    for arg in [*argv, "--"]:
        if arg == "--":
            if current:
                specs.append(current)
            current = []
        else:
            current.append(arg)
    ctx = start(timeout_s=60)
    _shared = True
    try:
        for script, *args in specs:
            dist.barrier()
            if ctx.rank == 0:
                sys.stdout.write(" ".join([f"{MARKER}{Path(script).name}", *args]) + "\n")
                sys.stdout.flush()
            dist.barrier()  # no rank's output comes before the marker
            t0 = time.perf_counter()
            sys.argv = [script, *args]
            runpy.run_path(script, run_name="__main__")
            finish()
            if ctx.rank == 0:
                sys.stdout.write(f"{MARKER}done in {time.perf_counter() - t0:.2f} s\n")
    finally:
        _shared = False
    finish()


class SharedLaunch:
    """Demo scripts that are expected to finish, run in ONE torchrun launch (for the notebooks).

    runs: (script path, [arguments], the JSON it writes or None). The first call runs every script
    through `python -m distrinews_course.demo` (rank 0's JSON files deleted first: no stale result is ever
    read) and keeps each script's output; later calls return what was kept, except for a script whose
    text changed since it ran (its %%writefile cell edited and rerun): that one runs again, alone.
    Returns (its output, its JSON or None) and prints the output.
    """

    def __init__(self, runs, nproc: int, timeout: float):
        self.runs = {
            Path(script).name: (Path(script), [str(a) for a in args], Path(out) if out else None)
            for script, args, out in runs
        }
        self.nproc, self.timeout, self.done = nproc, timeout, {}
        self.startup_s = None  # the last launch's cost beyond its scripts' own time: torchrun, imports, the group

    def _launch(self, names) -> None:
        argv, texts = [], {}
        for name in names:
            script, args, out = self.runs[name]
            if out:
                out.unlink(missing_ok=True)
            argv += ["--", str(script), *args]
            texts[name] = script.read_text()
        res = torchrun("distrinews_course.demo", self.nproc, argv[1:], timeout=self.timeout, module=True, echo=False)
        own = sum(float(t) for t in re.findall(rf"^{MARKER}done in ([\d.]+) s", res.output, re.M))
        self.startup_s = max(0.0, res.seconds - own)
        print(
            f"[one launch ran {len(names)} script{'s' * (len(names) != 1)} on {self.nproc} ranks in "
            f"{res.seconds:.1f} s, {self.startup_s:.1f} s of it starting up]"
        )
        outputs = sections(res.output)
        self.done.update({name: (texts[name], outputs.get(name, "")) for name in names})

    def __call__(self, name: str, echo: bool = True):
        stale = [n for n, (script, _, _) in self.runs.items() if self.done.get(n, ("",))[0] != script.read_text()]
        if name in stale:
            self._launch(stale if not self.done else [name])
        output, out = self.done[name][1], self.runs[name][2]
        if echo:
            print(output, end="")
        return output, (json.loads(out.read_text()) if out else None)


# Chapter 04's runs: those expected to finish share one launch; those that must fail get one each.
def pitfall_finishing(out="outputs/pitfalls"):
    """(script, arguments, the JSON it writes) for every pitfall run expected to finish."""
    out = Path(out)
    return [
        ("01_set_epoch.py", [], out / "01_set_epoch.json"),
        ("02_no_sampler.py", [], out / "02_no_sampler.json"),
        ("03_print_every_rank.py", [], None),
        ("04_save_wrapper.py", [], out / "04_save_wrapper.json"),
        ("05_shared_file.py", [], out / "05_shared_file.json"),
        ("06_eval_padding.py", [], out / "06_eval_padding.json"),
        ("07_uneven_inputs.py", ["--mode", "fixed"], out / "07_uneven_inputs_fixed.json"),
        ("08_no_sync.py", [], out / "08_no_sync.json"),
        ("09_one_rank_collective.py", ["--mode", "fixed"], out / "09_one_rank_collective_fixed.json"),
        ("10_nccl_backend.py", ["--mode", "fixed"], out / "10_nccl_backend_fixed.json"),
        ("11_unused_parameters.py", ["--mode", "fixed"], out / "11_unused_parameters_fixed.json"),
        ("12_batchnorm.py", [], out / "12_batchnorm.json"),
        ("13_lr_scaling.py", [], out / "13_lr_scaling.json"),
    ]


def pitfall_failing(hang_timeout_s: float):
    """(script, arguments) for every pitfall run that must fail; the hangs end after hang_timeout_s."""
    return [
        ("07_uneven_inputs.py", ["--mode", "broken", "--ddp_timeout", hang_timeout_s]),
        ("09_one_rank_collective.py", ["--mode", "broken", "--ddp_timeout", hang_timeout_s]),
        ("10_nccl_backend.py", ["--mode", "broken"]),
        ("11_unused_parameters.py", ["--mode", "broken"]),
    ]


def pitfall_launches(
    nproc: int, timeout_s: float | None, hang_timeout_s: float, folder="scripts/pitfalls", out="outputs/pitfalls"
):
    """Chapter 04's set-up in one call: (NP, the scripts' folder, their outputs' folder, the SharedLaunch of every run
    that finishes, the FailingRuns of those that must fail). Nothing starts until a section asks for its run. NP is
    one rank per GPU and at least 2: with one rank there is nothing to get wrong."""
    np_, folder, out = max(nproc, 2), Path(folder), Path(out)
    finished = SharedLaunch([(folder / s, a, o) for s, a, o in pitfall_finishing(out)], np_, timeout_s or 600)
    return np_, folder, out, finished, FailingRuns(folder, pitfall_failing(hang_timeout_s), np_, timeout_s)


def failing_limit(startup_s: float | None, launches: int, hang_timeout_s: float) -> float:
    """How long a run that must fail may take before the launcher stops it, from this machine's own start-up time.

    The failing runs start together, so on a CPU their start-ups share the cores: `launches` times one start-up
    (measured by a SharedLaunch), plus a few hang timeouts (a hang can wait out its timeout more than once), doubled
    for the noise of a busy machine. At least 60 s. A run that really hangs is still stopped."""
    startup_s = startup_s if startup_s is not None else 30.0
    return max(60.0, 2 * (launches * startup_s + 5 * hang_timeout_s))


def run_alone(script, out, nproc: int, timeout: float, *args):
    """torchrun `script` on its own (raises if it fails); return (the launch's result, the JSON it wrote to `out`)."""
    out = Path(out)
    out.unlink(missing_ok=True)  # never read a stale result
    res = torchrun(script, nproc, [str(a) for a in args], timeout=timeout, echo=False)
    return res, json.loads(out.read_text())


class FailingRuns:
    """Runs that must fail, one launch each. They spend most of their time waiting (on start-up, on their
    process group's timeout), so the first call starts every listed run at once, in the background.

    failing = FailingRuns("scripts/pitfalls", [("07_uneven_inputs.py", ["--mode", "broken"]), ...], nproc, timeout)
    res = failing("07_uneven_inputs.py", "--mode", "broken")   waits for that run; a script edited since runs again
    """

    def __init__(self, folder, runs, nproc: int, timeout: float | None = None):
        self.folder, self.runs, self.nproc, self.timeout = (
            Path(folder),
            list(runs),
            nproc,
            timeout,
        )  # set before the first call
        self.started = {}  # (script, *arguments) -> (its text when launched, the launch's future result)
        self.pool = ThreadPoolExecutor(max_workers=max(1, len(self.runs)))

    def _start(self, script, args):
        launch = lambda: torchrun(
            self.folder / script, self.nproc, [str(a) for a in args], timeout=self.timeout, check=False, echo=False
        )
        self.started[(script, *map(str, args))] = ((self.folder / script).read_text(), self.pool.submit(launch))

    def __call__(self, script, *args):
        if self.timeout is None:
            raise ValueError("FailingRuns: set .timeout (seconds a launch may run) before the first run")
        if not self.started:
            for name, argv in self.runs:
                self._start(name, argv)
        key = (script, *map(str, args))
        if key not in self.started or self.started[key][0] != (self.folder / script).read_text():  # new, or edited
            self._start(script, args)
        return self.started[key][1].result()


def results(output: str) -> list[dict]:
    """The RESULT lines of an output as dicts of strings: [{'rank': '0', 'mode': 'broken', ...}, ...]."""
    return [
        dict(re.findall(r"(\w+)=(\S+)", line.split("RESULT ", 1)[1]))
        for line in output.splitlines()
        if "RESULT rank=" in line
    ]


FIX_MARK = re.compile(r"#\s*(BUG|THE FIX|FIX\b|BOTH MODES)")


def show_fix(script, context: int = 1, echo: bool = True, exercise: str = "") -> str | None:
    """The lines of a pitfall script that make it broken or fixed: those whose comment says BUG (shown with
    '-') or FIX (shown with '+'), each with `context` lines before it, numbered as in the file; a line whose comment
    says BOTH MODES is shown unmarked (it runs either way: the fix is around it). Read from the file itself, so what
    the notebook shows is what runs. With `exercise` (e.g. "exercise 1"), the fix is that exercise's answer: only the
    BUG, BOTH MODES and FIX lines are shown, no other context, and of a FIX line only its comment, which names the
    API: the code around the fix stays on the page, the fix itself is the learner's."""
    lines = Path(script).read_text().splitlines()
    marked = [i for i, line in enumerate(lines) if FIX_MARK.search(line) and not line.lstrip().startswith(('"', "'"))]
    if exercise:
        context = 0
        for i in marked:
            if FIX_MARK.search(lines[i])[1] not in ("BUG", "BOTH MODES"):
                code = lines[i]
                lines[i] = code[: len(code) - len(code.lstrip())] + f"... ({exercise})  " + code[code.index("#") :]
    keep = sorted({j for i in marked for j in range(max(0, i - context), i + 1)})
    out, last = [f"{Path(script).as_posix()}"], None
    for i in keep:
        if last is not None and i > last + 1:
            out.append("     ...")
        m = FIX_MARK.search(lines[i]) if i in marked else None
        sign = " " if not m or m[1] == "BOTH MODES" else ("-" if m[1] == "BUG" else "+")
        out.append(f"{sign}{i + 1:>4} {lines[i]}")
        last = i
    text = "\n".join(out)
    if echo:  # in a notebook cell: print it (a returned string would be shown again, quoted)
        print(text)
        return None
    return text


def sections(output: str) -> dict[str, str]:
    """run_together's output per script: {'01_set_epoch.py': 'its lines', ...} (the last run of a name wins)."""
    out, name = {}, None
    for line in output.splitlines():
        line = line.rsplit("\r", 1)[-1]
        if line.startswith(MARKER):
            head = line[len(MARKER) :]
            name = None if head.startswith("done in ") else head.split()[0]
            if name:
                out[name] = ""
        elif name:
            out[name] += line + "\n"
    return out


def failure_story(res, width: int = 200) -> str:
    """The few lines of a failed launch that tell its story - each rank's error (what it measured, e.g. how
    long it waited), torchrun's verdict per rank (exit code, and the rank its "Root Cause" heading names: the
    earliest failure by a time stamp in whole seconds, so not always the rank that failed first) and how the launch
    ended - instead of every rank's traceback and torchrun's own."""
    errors, measured, verdicts, root = {}, {}, [], False
    for line in (raw.rsplit("\r", 1)[-1].rstrip() for raw in res.output.splitlines()):
        if m := re.match(r"^\[rank ?(\d+)\]:? (\w+(?:Error|Exception)\b.*)", line):  # a rank's report, or the
            errors[int(m[1])] = re.sub(r"\[/\S+:\d+\] ", "", m[2])  # last line of its traceback
        elif line.startswith("RESULT rank=") and " error=" in line:
            fields = dict(re.findall(r"(\w+)=(\S+)", line))
            measured[int(fields["rank"])] = " ".join(
                f"{k}={v}" for k, v in fields.items() if k not in ("rank", "mode", "error")
            )
        elif line.startswith(("Root Cause", "Failures:")):
            root = line.startswith("Root Cause")
        elif m := re.match(r"^\s*rank\s*: (\d+)", line):
            verdicts.append([int(m[1]), None, root])
        elif (m := re.match(r"^\s*exitcode\s*: (-?\d+)[^(]*\(pid: \d+\)\s*(\(\w+\))?", line)) and verdicts:
            verdicts[-1][1] = m[1] + (f" {m[2]}" if m[2] else "")
    story = []
    for rank in sorted(errors.keys() | measured.keys()):
        text = f"rank {rank}: {errors.get(rank, 'failed')}"
        text = text if len(text) <= width else text[: width - 3] + "..."
        story.append(text + (f"  [{measured[rank]}]" if rank in measured else ""))
    if verdicts:
        story.append(
            "torchrun: "
            + ", ".join(
                f"rank {r} exit code {code}" + (" (torchrun's Root Cause)" if first else "")
                for r, code, first in sorted(verdicts)
            )
        )
    if not story:  # not a shape we know: the last lines, as they are
        story = [line[:width] for line in res.output.strip().splitlines()[-5:]]
    story.append(
        f"launch ended by itself after {res.seconds:.1f} s with exit code {res.returncode}"
        if not res.timed_out
        else f"launch stopped at its time limit after {res.seconds:.1f} s"
    )
    return "\n".join(story)


if __name__ == "__main__":  # python -m distrinews_course.demo: the scripts must see THIS module's state, not a copy
    from distrinews_course import demo

    demo.run_together(sys.argv[1:])
