"""Launch a training script from a notebook cell or a test, fail loudly when it fails, leave nothing behind.

`!torchrun ...` in a notebook does not fail the cell when torchrun fails; these helpers run
`python -m torch.distributed.run` as a subprocess, stream its output into the cell, and raise
LaunchError (naming the script and the exit code) when it exits non-zero or runs past its timeout.

No rank outlives its launch. torchrun puts every rank in a session of its own, so killing torchrun's
process group does not reach them. Therefore:
- normal exit, timeout and interrupt: every process the launch started (tracked through /proc while it
  runs) that is still alive at the end is killed;
- the launcher itself dies (a kernel restart, a killed test): torchrun is started with a parent-death
  signal (SIGTERM), on which it stops its ranks; and every rank runs through course/harden.py, which asks for
  SIGKILL when torchrun dies, in case torchrun itself was killed.
"""

from __future__ import annotations

import codecs
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from distrinews_lib import distributed as D

from . import ROOT

HARDEN = "distrinews_course.harden"  # every rank runs through it (python -m): see course/harden.py
# What every launch gives its ranks (course/harden.py says why): gloo connects lazily, and each rendezvous round
# (each restart) builds a fresh store.
RANK_ENV = {"TORCH_GLOO_LAZY_INIT": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


class LaunchError(RuntimeError):
    """A launched script exited non-zero or timed out. `.result` holds its output."""

    # its text quotes the children's output: a rank's own timeout message there is not this process's collective
    from_children = True

    def __init__(self, message: str, result: "LaunchResult"):
        super().__init__(message)
        self.result = result


@dataclass
class LaunchResult:
    command: list
    returncode: int
    output: str
    seconds: float
    timed_out: bool = False
    lines: list = field(default_factory=list)
    ranks: int | None = None  # how many ranks really started (accelerate_launch counts them)
    rank_tails: dict = field(
        default_factory=dict
    )  # a failed launch: {rank: its own last lines}, ranks killed by a signal

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


# Started instead of the command itself: ask the kernel for SIGTERM when our parent (the launcher) dies,
# check that it has not died already, then become the command (the signal request survives exec).
_PARENT_DEATH_SHIM = (
    "import ctypes,os,signal,sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGTERM)\n"
    "os.getppid() == int(sys.argv[1]) or sys.exit(143)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])"
)


# How the course's launchers start what a learner would type: the module run as `python -m X`, and its typed name.
_TYPED = {"torch.distributed.run": "torchrun", "accelerate.commands.launch": "accelerate launch"}


def typed_command(command) -> str:
    """The command a learner types for a launch's `result.command`: without the parent-death shim and its pid, the
    interpreter's path and `-m distrinews_course.harden` (the course's wrapper around each rank), with `python -m
    torch.distributed.run` as `torchrun`, `python -m accelerate.commands.launch` as `accelerate launch`, and paths
    relative to the working directory."""
    cmd = [str(c) for c in command]
    if cmd[1:3] == ["-c", _PARENT_DEATH_SHIM]:
        cmd = cmd[4:]
    if cmd[1:2] == ["-m"] and cmd[2] in _TYPED:
        cmd = [_TYPED[cmd[2]], *cmd[3:]]
    else:
        cmd = ["python", *cmd[1:]]
    for i in range(len(cmd) - 1):
        if cmd[i : i + 2] == ["-m", HARDEN]:
            cmd = cmd[:i] + cmd[i + 2 :]
            break
    here = f"{Path.cwd()}/"
    return " ".join(c.replace(here, "") for c in cmd)


def default_nproc() -> int:
    """Every GPU when there are any; else 2 CPU processes (enough to show real DDP)."""
    return D.gpu_count() or 2


# torchrun's report of a failed rank: "rank : 1 (local_rank: 1)" then "exitcode : -6 (pid: 123)  (SIGABRT)"
_VERDICT = re.compile(r"^\s*rank\s*:\s*(\d+).*\n\s*exitcode\s*:\s*(-?\d+)[^\n]*?(?:\((SIG\w+)\))?\s*$", re.M)
RANK_TAIL_LINES = 15
# How often a running launch walks /proc for its processes (each walk reads every process's stat: milliseconds of CPU
# on a busy machine). Its end still sees every rank: the walk runs again before the kill, and a rank orphaned between
# two walks dies with torchrun anyway (course/harden.py's parent-death signal).
FAMILY_REFRESH_S = 1.0


def signalled_ranks(output: str) -> dict:
    """{rank: signal name} for every rank torchrun reports killed by a signal, the first failure first."""
    root = output.find("Root Cause")
    found = [
        (m.start() < root if root >= 0 else True, int(m[1]), m[3] or f"signal {-int(m[2])}")
        for m in _VERDICT.finditer(output)
        if int(m[2]) < 0
    ]
    ordered = [(rank, sig) for _, rank, sig in sorted(found)]  # the root cause (after "Root Cause") sorts first
    # SIGTERM after the first failure is torchrun stopping the others: only the root cause's is worth showing
    return {rank: sig for i, (rank, sig) in enumerate(ordered) if i == 0 or sig != "SIGTERM"}


def _rank_tails(output: str, logs: Path) -> dict:
    tails = {}
    for rank in signalled_ranks(output):
        log = logs / f"rank{rank}.log"
        if log.is_file():
            lines = log.read_text(errors="replace").splitlines()
            tails[rank] = [line.rsplit("\r", 1)[-1] for line in lines[-RANK_TAIL_LINES:]]
    return tails


ROOT_CAUSE = re.compile(r"^(?P<prefix>.*?)Root Cause \(first observed failure\):")


def root_causes(lines: list[str]) -> list[tuple[str, str]]:
    """torchrun's 'Root Cause (first observed failure)' blocks (the failing rank, its exit code or signal, its
    error) among `lines`, each with the prefix of the node that printed it (' of node1' for 'node1 | ...'): a long
    output pushes them out of the last lines a failure shows."""
    out = []
    for i, line in enumerate(lines):
        m = ROOT_CAUSE.match(line)
        if m:
            prefix = m.group("prefix")
            block = [l[len(prefix) :] for l in lines[i + 1 : i + 12] if l.startswith(prefix)]
            block = [l for l in block if l.strip("=- ")][:8]
            node = prefix.strip(" |")
            out.append((f" of {node}" if node else "", "\n".join(block)))
    return out


def _run(cmd, *, timeout, env, cwd, echo, check, what) -> LaunchResult:
    with tempfile.TemporaryDirectory(prefix="rank_logs_") as logs:
        return _run_logged(
            cmd,
            timeout=timeout,
            env={**(env or {}), "DISTRINEWS_RANK_LOGS": logs},
            cwd=cwd,
            echo=echo,
            check=check,
            what=what,
            logs=Path(logs),
        )


def _run_logged(cmd, *, timeout, env, cwd, echo, check, what, logs: Path) -> LaunchResult:
    full_env = dict(os.environ)
    full_env["PYTHONUNBUFFERED"] = "1"
    # Idle OpenMP threads sleep instead of spinning: on a shared CPU, spinning threads of one process
    # starve the others (a 2-thread run was seen going 7x slower under load).
    full_env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    full_env.update({k: str(v) for k, v in (env or {}).items()})
    start = time.time()
    if sys.platform.startswith("linux"):
        cmd = [sys.executable, "-c", _PARENT_DEATH_SHIM, str(os.getpid()), *map(str, cmd)]
    # A new session, so a timeout can signal torchrun and its helpers together.
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=full_env, cwd=cwd, start_new_session=True
    )
    family = _Descendants(proc.pid)
    chunks: list[str] = []

    def pump():
        # Read whatever is there (not line by line), so tqdm's \r redraws reach the cell as they happen.
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        fd = proc.stdout.fileno()
        partial = ""  # echo given as a function: the last line, until it is complete
        while True:
            data = os.read(fd, 65536)
            if not data:
                break
            text = decoder.decode(data)
            chunks.append(text)
            if callable(echo):  # a filter: each complete line it turns into text is shown, as it comes
                *done, partial = (partial + text).split("\n")
                for shown in filter(None, map(echo, done)):
                    print(shown, flush=True)
            elif echo:
                print(text, end="", flush=True)
        chunks.append(decoder.decode(b"", final=True))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        deadline, seen = time.monotonic() + timeout, 0.0
        while proc.poll() is None:  # poll, so the family of processes is known when it has to be stopped
            if time.monotonic() - seen >= FAMILY_REFRESH_S:
                family.refresh()
                seen = time.monotonic()
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(cmd, timeout)
            time.sleep(0.2)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
    except BaseException:  # KeyboardInterrupt (the notebook's stop button), SystemExit...
        _kill_group(proc)
        family.kill()
        raise
    reader.join(timeout=3)  # a rank's `tee` (course/harden.py) writes its last bytes as the rank ends
    family.kill()  # torchrun has exited; any rank it left behind goes too
    reader.join(timeout=5)
    output = "".join(chunks)
    result = LaunchResult(
        list(map(str, cmd)),
        proc.returncode if not timed_out else -9,
        output,
        time.time() - start,
        timed_out,
        output.splitlines(),
    )
    if not result.ok:
        result.rank_tails = _rank_tails(output, logs)
    if check and not result.ok:
        why = (
            f"timed out after {timeout:.0f} s and was stopped" if timed_out else f"exited with code {result.returncode}"
        )
        last = "\n".join(line.rsplit("\r", 1)[-1] for line in result.lines[-40:]).rstrip()
        own = "".join(
            f"\n--- rank {rank}'s own last lines (it was killed by {sig}) ---\n" + "\n".join(result.rank_tails[rank])
            for rank, sig in signalled_ranks(output).items()
            if rank in result.rank_tails
        )
        cause = "".join(
            f"\n--- torchrun's root cause{where} (above the last lines) ---\n{block}"
            for where, block in root_causes(result.lines[:-40])
        )
        raise LaunchError(f"{what} {why}.{cause}\n--- last lines of its output ---\n{last}{own}", result)
    return result


def _kill_group(proc) -> None:
    """SIGTERM torchrun's group (torchrun then stops its ranks), SIGKILL after 5 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


class _Descendants:
    """Every process started under `root`, found through /proc (Linux), with its start time so that a
    recycled PID is never killed by mistake."""

    def __init__(self, root: int):
        self.root, self.known = root, {}

    @staticmethod
    def _stat(pid: int):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            return int(fields[1]), fields[19], fields[0]  # ppid, start time, state
        except (OSError, IndexError, ValueError):
            return None

    def refresh(self) -> None:
        if not sys.platform.startswith("linux"):
            return
        parents = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (st := self._stat(int(entry))):
                parents[int(entry)] = st
        family, frontier = set(), {self.root}
        while frontier:
            children = {pid for pid, st in parents.items() if st[0] in frontier and pid not in family}
            family |= children
            frontier = children
        for pid in family:
            self.known.setdefault(pid, parents[pid][1])

    def alive(self) -> list:
        out = []
        for pid, started in self.known.items():
            st = self._stat(pid)
            if st and st[1] == started and st[2] != "Z":
                out.append(pid)
        return out

    def kill(self) -> None:
        self.refresh()
        for pid in self.alive():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _check_nccl_fits(nproc: int, args) -> None:
    args = [str(a) for a in args]
    if "--backend" in args and args[args.index("--backend") + 1 :][:1] == ["nccl"]:
        D.choose_backend("nccl", local_world_size=nproc)  # the one rule, with its message


def _rank_env(env: dict | None, cpu_threads: int | None) -> dict:
    env = {**{k: v for k, v in RANK_ENV.items() if k not in os.environ}, **(env or {})}
    if cpu_threads and "OMP_NUM_THREADS" not in env and "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(cpu_threads)
    return env


def torchrun(
    script,
    nproc: int | str = "auto",
    args=(),
    *,
    timeout: float = 900,
    env: dict | None = None,
    cwd=None,
    echo=True,
    check: bool = True,
    torchrun_args=(),
    standalone: bool = True,
    module: bool = False,
    cpu_threads: int | None = 1,
) -> LaunchResult:
    """Run `python -m torch.distributed.run --nproc_per_node=N -m distrinews_course.harden script args...`.

    nproc="auto" uses every GPU, or 2 CPU processes without one. module=True: `script` is a module to run as
    `python -m`. For several nodes pass standalone=False and torchrun_args=["--nnodes=2", "--rdzv_backend=c10d",
    "--rdzv_endpoint=HOST:29500", ...]. cpu_threads sets OMP_NUM_THREADS per rank (unless env sets it), so N ranks
    do not fight over cores. echo: True streams the output as it comes, False shows none, a function (line -> text
    or None) shows what it makes of each line (one line per run of a long launch, say).
    """
    nproc = default_nproc() if nproc == "auto" else int(nproc)
    _check_nccl_fits(nproc, args)
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    if standalone:
        cmd.append("--standalone")
    cmd += [
        *map(str, torchrun_args),
        f"--nproc_per_node={nproc}",
        "-m",
        HARDEN,
        *(["-m"] if module else []),
        str(script),
        *map(str, args),
    ]
    what = f"torchrun of {Path(str(script)).name} with {nproc} process(es)"
    for attempt in range(1, PORT_ATTEMPTS + 1):
        try:
            result = _run(
                cmd, timeout=timeout, env=_rank_env(env, cpu_threads), cwd=cwd, echo=echo, check=check, what=what
            )
        except LaunchError as err:
            if not (standalone and attempt < PORT_ATTEMPTS and port_taken(err.result.output)):
                raise
            result = err.result
        if result.ok or not (standalone and attempt < PORT_ATTEMPTS and port_taken(result.output)):
            return result
        print(
            f"[launch] torchrun's port was taken by another process before its store could bind it; nothing ran "
            f"yet, so the launch starts again ({attempt + 1} of {PORT_ATTEMPTS})",
            flush=True,
        )
    return result


# torchrun --standalone picks a free port, releases it and binds it again for its rendezvous store; another process
# (any outgoing connection takes an ephemeral port) can take it in between: seen once in 240 launches beside other
# jobs. The agent fails before it starts a rank, so launching again is safe.
PORT_ATTEMPTS = 3


def port_taken(output: str) -> bool:
    """Did the launch fail because its rendezvous store could not bind its port (before any rank started)?"""
    return "EADDRINUSE" in output and "server socket has failed to listen" in output


ACCELERATE_CONFIG = ROOT / "configs" / "accelerate" / "multi_process.yaml"


def accelerate_launch(
    script,
    nproc: int | str = "auto",
    args=(),
    *,
    config_file=None,
    timeout: float = 900,
    env: dict | None = None,
    cwd=None,
    echo: bool = True,
    check: bool = True,
    cpu_threads: int | None = 1,
) -> LaunchResult:
    """`accelerate launch --config_file CONFIG --num_processes N script args...`, then check that N ranks really ran.

    On a machine without a GPU, `accelerate launch --cpu --num_processes 2` silently starts ONE process
    (accelerate 1.x: multi-process CPU runs need MPI there). The project's config (distributed_type
    MULTI_GPU) starts them through torchrun, which works on a CPU too; every rank of a distrinews_lib
    rank leaves a marker (course/harden.py), and fewer markers than N is an error.
    """
    nproc = default_nproc() if nproc == "auto" else int(nproc)
    _check_nccl_fits(nproc, args)
    env = _rank_env(env, cpu_threads)
    with tempfile.TemporaryDirectory(prefix="ranks_") as ranks_dir:
        env["DISTRINEWS_RANKS_DIR"] = ranks_dir
        cmd = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(config_file or ACCELERATE_CONFIG),
            "--num_processes",
            str(nproc),
            "-m",
            HARDEN,
            str(script),
            *map(str, args),
        ]
        what = f"accelerate launch of {Path(str(script)).name} with {nproc} process(es)"
        result = _run(cmd, timeout=timeout, env=env, cwd=cwd, echo=echo, check=check, what=what)
        ranks = sorted(p.name for p in Path(ranks_dir).glob("rank*"))
    if result.ok and len(ranks) != nproc:
        raise LaunchError(
            f"{what} ran {len(ranks)} rank(s) ({', '.join(ranks) or 'none'}), not {nproc}: accelerate "
            "launched fewer processes than asked. On a machine without a GPU do not pass --cpu to "
            "accelerate launch (it then starts one process); use configs/accelerate/multi_process.yaml "
            "(distributed_type MULTI_GPU), or torchrun.",
            result,
        )
    result.ranks = len(ranks)
    return result


def run(
    cmd,
    *,
    timeout: float = 900,
    env: dict | None = None,
    cwd=None,
    echo: bool = True,
    check: bool = True,
    what: str | None = None,
) -> LaunchResult:
    """Run any command (e.g. `bash scripts/run_ddp.sh 2 ...`), streaming, raising and cleaning up like torchrun()."""
    return _run(
        [str(c) for c in cmd],
        timeout=timeout,
        env=env,
        cwd=cwd,
        echo=echo,
        check=check,
        what=what or " ".join(map(str, cmd[:3])),
    )


def run_python(
    script, args=(), *, timeout: float = 900, env: dict | None = None, cwd=None, echo: bool = True, check: bool = True
) -> LaunchResult:
    """Run `python script args...` (the single-process baseline), streaming and raising like torchrun()."""
    cmd = [sys.executable, str(script), *map(str, args)]
    return _run(cmd, timeout=timeout, env=env, cwd=cwd, echo=echo, check=check, what=f"python {Path(str(script)).name}")
