"""Chapter 12's runs: each scenario launched with the tools it needs, read by those tools while it hangs, and kept.

    lab = HangLab(nproc=2, hang_s=3, out="outputs/hangs")
    lab.add(Scenario("skip", "scripts/pitfalls/07_uneven_inputs.py", ["--mode", "broken"], debug_server=True,
                     probe="hung"))
    run = lab.get("skip")      the first get() starts every scenario, a few at a time; this one's run, once it ended
    run.result                 the launch (distrinews_course.launch.LaunchResult)
    run.fr, run.stacks         what the debug server showed while it hung: Flight Recorder entries, stacks, per rank
    run.pyspy                  {rank: (frames, text, why it failed or None)} from `py-spy dump` while it hung
    run.doctor                 the hang doctor's verdict (its hang.json), or None

A scenario's collectives wait `hang_s` (the doctor reports then) plus the doctor's grace: the process group's timeout.
The debug server's port, the doctor's folder and torchrun's --log-dir are the run's own. Probes:
  "hung"             once a rank has waited in a collective for a second, every rank past its first step (not
                     DDP's start-up): the debug server's pages, then py-spy
  ("collectives", n) once every rank completed n collectives (a straggler, which never hangs)
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import random
import re
import shutil
import socket
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from distrinews_lib.hang_doctor import grace_s

from . import hang_reading, leftovers
from .launch import torchrun

PAGE_S = 5.0  # how long a probe waits for a page of the debug server (it waits FETCH_S for each rank itself)
PORT_ATTEMPTS = 3  # a debug server whose port was taken before it could bind it: the scenario runs again
CONCURRENT = 3  # launches at a time: they wait more than they compute, but two cores start only so many ranks
# The scenarios run as CPU processes on gloo on every machine: the bugs and the tools are the same on NCCL, and the
# same backend everywhere makes what each tool shows the same on a laptop, in CI and on Kaggle.
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}


@dataclass
class Scenario:
    name: str
    script: str
    args: list
    debug_server: bool = False  # start torch's debug server in every rank (distrinews_course/attach_debug_server.py)
    doctor: bool = True  # run under the hang doctor (python -m distrinews_lib.hang_doctor)
    probe: object = None  # None | "hung" | ("collectives", n)
    pyspy_ranks: tuple = ()  # ranks to `py-spy dump` when the probe fires
    env: dict = field(default_factory=dict)
    nproc: int | None = None  # default: the lab's
    timeout_s: float | None = None  # the launcher's own limit; default: the lab's
    log_dir: bool = False  # torchrun --log-dir: where @record's error files stay
    module: bool = False  # script is a module (python -m), e.g. distrinews_course.demo running several scripts
    planted: int | None = None  # the rank the script plants its bug in (by its design and arguments)


@dataclass
class Run:
    scenario: Scenario
    folder: Path
    port: int | None = None
    result: object = None
    lines: list = field(default_factory=list)
    fr: dict = field(default_factory=dict)
    stacks: dict = field(default_factory=dict)
    pyspy: dict = field(default_factory=dict)
    probed_at: float | None = None  # seconds after the launch started
    read_ns: int | None = None  # when the debug server's pages were read (wall clock, ns: the recorder's clock)
    probe_error: str | None = None

    @property
    def output(self) -> str:
        return self.result.output if self.result is not None else "\n".join(self.lines)

    @property
    def doctor(self) -> dict | None:
        return hang_reading.doctor_verdict(self.folder / "doctor", "hang")

    @property
    def straggler(self) -> dict | None:
        return hang_reading.doctor_verdict(self.folder / "doctor", "straggler")

    @property
    def doctor_lines(self) -> list:
        return [line.split("[hang doctor] ", 1)[1] for line in self.output.splitlines() if "[hang doctor] " in line]

    def pids(self) -> dict:
        """{rank: pid}, from the line attach_debug_server prints in every rank."""
        return {int(r): int(p) for r, p in re.findall(r"RESULT rank=(\d+) pid=(\d+)", "\n".join(self.lines))}


class HangLab:
    def __init__(self, nproc: int, hang_s: float, out="outputs/hangs", timeout_s: float = 120.0):
        self.nproc, self.hang_s, self.out, self.timeout_s = nproc, float(hang_s), Path(out), timeout_s
        self.scenarios: dict = {}
        self.futures: dict = {}
        self.pool = ThreadPoolExecutor(max_workers=CONCURRENT)

    @property
    def group_timeout_s(self) -> float:
        """The process group's timeout of a hanging scenario: the doctor reports at hang_s, within its grace."""
        return self.hang_s + grace_s(self.hang_s)

    def add(self, scenario: Scenario) -> None:
        self.scenarios[scenario.name] = scenario

    def get(self, name: str) -> Run:
        if not self.futures:
            if any(s.debug_server for s in self.scenarios.values()):
                debug_server_problem(raise_it=True)
            for n in self.scenarios:
                self.futures[n] = self.pool.submit(self._run, self.scenarios[n])
        if name not in self.futures:
            raise KeyError(f"no scenario named {name!r}; the lab has {', '.join(self.scenarios)}")
        run = self.futures[name].result()
        if run.probe_error:
            tail = "\n".join(run.output.splitlines()[-15:])
            raise RuntimeError(f"run {name!r}: {run.probe_error}. Its last lines:\n{tail}")
        return run

    # ------------------------------------------------------------------------------------------------ one run
    def _command(self, s: Scenario, run: Run) -> tuple:
        """(script or module, arguments, is it a module) for torchrun: the wrappers, then the script."""
        chain = []
        if s.debug_server:
            run.port = debug_port()
            chain += ["-m", "distrinews_course.attach_debug_server", "--port", str(run.port)]
        if s.doctor:
            chain += [
                "-m",
                "distrinews_lib.hang_doctor",
                "--after",
                str(self.hang_s),
                "--out",
                str(run.folder / "doctor"),
            ]
        chain += (["-m"] if s.module else []) + [s.script, *map(str, s.args)]
        return (chain[1], chain[2:], True) if chain[0] == "-m" else (chain[0], chain[1:], False)

    def _run(self, s: Scenario) -> Run:
        for _ in range(PORT_ATTEMPTS):
            run = self._attempt(s)
            if not (s.debug_server and run.probe_error and "Address already in use" in run.output):
                return run
        return run

    def _attempt(self, s: Scenario) -> Run:
        folder = self.out / s.name
        shutil.rmtree(folder, ignore_errors=True)  # nothing of an earlier run is ever read
        folder.mkdir(parents=True)
        run = Run(s, folder)
        target, args, module = self._command(s, run)
        done = threading.Event()
        started = time.monotonic()

        def launch():
            try:
                run.result = torchrun(
                    target,
                    s.nproc or self.nproc,
                    args,
                    module=module,
                    timeout=s.timeout_s or self.timeout_s,
                    env={**CPU_ONLY, **s.env},
                    echo=lambda line: run.lines.append(line),  # kept, not shown: the cells show what they read
                    check=False,
                    torchrun_args=["--log-dir", str(folder / "torchrun")] if s.log_dir else (),
                )
            finally:
                done.set()

        thread = threading.Thread(target=launch, daemon=True)
        thread.start()
        if s.probe is not None:
            try:
                self._probe(run, done, started)
            except Exception as err:  # noqa: BLE001 (a probe that fails is reported by the cell that reads it)
                run.probe_error = f"{type(err).__name__}: {err}"
        thread.join()
        if s.probe is not None and not run.fr and not run.probe_error:
            run.probe_error = f"the run ended before the debug server showed what the probe waits for ({s.probe})"
        return run

    def _page(self, run: Run, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{run.port}/{path}", timeout=PAGE_S) as resp:
            return resp.read().decode()

    def _probe(self, run: Run, done: threading.Event, started: float) -> None:
        s = run.scenario
        while not done.wait(0.1):
            try:
                fr = hang_reading.flight_recorder(self._page(run, "fr_trace_json"))
            except OSError:
                continue  # the server is not up yet
            if not self._ready(s.probe, fr, s.nproc or self.nproc):
                continue
            run.probed_at, run.read_ns = time.monotonic() - started, time.time_ns()
            run.stacks = hang_reading.stacks(self._page(run, "stacks"))
            run.fr = hang_reading.flight_recorder(self._page(run, "fr_trace_json"))
            for rank in s.pyspy_ranks:
                pid = run.pids().get(rank)
                run.pyspy[rank] = hang_reading.pyspy(pid) if pid else ([], "", "no pid for this rank")
                _, text, why = run.pyspy[rank]
                (run.folder / f"pyspy_rank{rank}.txt").write_text(text if why is None else f"{why}\n{text}")
            for rank, entries in run.fr.items():  # the dumps, kept: the exercises read them
                (run.folder / f"fr_rank{rank}.json").write_text(json.dumps(entries))
            (run.folder / "stacks.json").write_text(json.dumps({r: f for r, f in run.stacks.items()}))
            return

    @staticmethod
    def _ready(probe, fr: dict, nproc: int) -> bool:
        if len(fr) < nproc:
            return False
        if probe == "hung":
            return hung_past_start(fr)
        kind, n = probe
        return all(sum(e["retired"] for e in es) >= n for es in fr.values())


def debug_port() -> int:
    """A free port for rank 0's debug page, below Linux's ephemeral range (32768 and up): the launch binds it seconds
    after it is chosen, and in the meantime every connection the machine opens draws its own port from that range."""
    for _ in range(100):
        port = random.randint(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port between 20000 and 32000 for the debug server: free some, then run again.")


def hung_past_start(fr: dict, now_ns: int | None = None) -> bool:
    """Has a rank waited in a collective for more than a second, once every rank is past its start-up? Past it: each
    rank completed an all-reduce (a training step), so that DDP's start-up broadcast, which waits for a rank that is
    still importing, is not read as the hang; and the waiting collective came after the last step's all-reduce."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    steps = {r: [e["time_created_ns"] for e in es if e["retired"] and e["profiling_name"].endswith("all_reduce")]
             for r, es in fr.items()}  # fmt: skip
    if not fr or not all(steps.values()):
        return False
    start = max(max(t) for t in steps.values())
    return any(
        not e["retired"] and e["time_created_ns"] >= start and now_ns - e["time_created_ns"] > 1e9
        for es in fr.values()
        for e in es
    )


def debug_server_problem(raise_it: bool = False) -> str | None:
    """Why torch's debug server cannot start here (a torch without torch.distributed.debug.start_debug_server, or a
    missing package), or None. raise_it: raise it as a RuntimeError, one paragraph, before any run starts."""
    import torch

    problem = None
    from .attach_debug_server import import_torch_debug

    if importlib.util.find_spec("torch.distributed.debug") is None or not hasattr(
        import_torch_debug(), "start_debug_server"
    ):
        problem = (
            f"this torch ({torch.__version__}) has no torch.distributed.debug.start_debug_server: chapter 12 needs "
            "the torch the course pins (pip install -r requirements.txt)."
        )
    else:
        missing = [m for m in ("jinja2", "aiohttp", "tabulate") if importlib.util.find_spec(m) is None]
        if missing:
            problem = (
                f"torch's debug server needs {', '.join(missing)}, which this Python lacks: "
                "pip install -r requirements.txt (or pip install Jinja2 aiohttp tabulate), then run again."
            )
    if problem and raise_it:
        raise RuntimeError(problem)
    return problem


def left_behind() -> list:
    """Processes this kernel's launches started (they carry its DISTRINEWS_LAUNCH marker) that are still alive: a
    rank, a debug server, a py-spy. Empty after every launch has ended, as it should be."""
    mine = os.environ.get(leftovers.MARKER)
    if not mine or not Path("/proc").is_dir():
        return []
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid() and leftovers._environ_marker(int(entry)) == mine:
            if leftovers.start_time(int(entry)) is not None:
                out.append(int(entry))
    return out
