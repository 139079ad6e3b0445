"""Launch a training script from a notebook cell or a test, and fail loudly when it fails.

`!torchrun ...` in a notebook does not fail the cell when torchrun fails; these helpers run
`python -m torch.distributed.run` as a subprocess, stream its output into the cell, and raise
LaunchError (naming the script and the exit code) when it exits non-zero or runs past its timeout.
"""

from __future__ import annotations

import os
import codecs
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .errors import UserError


class LaunchError(RuntimeError):
    """A launched script exited non-zero or timed out. `.result` holds its output."""

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

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def default_nproc() -> int:
    """Every GPU when there are any; else 2 CPU processes (enough to show real DDP)."""
    return gpu_count() or 2


def _run(cmd, *, timeout, env, cwd, echo, check, what) -> LaunchResult:
    full_env = dict(os.environ)
    full_env["PYTHONUNBUFFERED"] = "1"
    # Idle OpenMP threads sleep instead of spinning: on a shared CPU, spinning threads of one process
    # starve the others (a 2-thread run was seen going 7x slower under load).
    full_env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    full_env.update({k: str(v) for k, v in (env or {}).items()})
    start = time.time()
    # A new session, so a timeout can kill torchrun *and* every rank it started.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=full_env, cwd=cwd,
                            start_new_session=True)
    chunks: list[str] = []

    def pump():
        # Read whatever is there (not line by line), so tqdm's \r redraws reach the cell as they happen.
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        fd = proc.stdout.fileno()
        while True:
            data = os.read(fd, 65536)
            if not data:
                break
            text = decoder.decode(data)
            chunks.append(text)
            if echo:
                print(text, end="", flush=True)
        chunks.append(decoder.decode(b"", final=True))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
    except KeyboardInterrupt:
        _kill_group(proc)
        raise
    reader.join(timeout=5)
    output = "".join(chunks)
    result = LaunchResult(list(map(str, cmd)), proc.returncode if not timed_out else -9, output,
                          time.time() - start, timed_out, output.splitlines())
    if check and not result.ok:
        why = f"timed out after {timeout:.0f} s and was stopped" if timed_out else f"exited with code {result.returncode}"
        last = "\n".join(line.rsplit("\r", 1)[-1] for line in result.lines[-40:]).rstrip()
        raise LaunchError(f"{what} {why}.\n--- last lines of its output ---\n{last}", result)
    return result


def _kill_group(proc) -> None:
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


def _check_nccl_fits(nproc: int, args) -> None:
    args = [str(a) for a in args]
    if "--backend" in args and args[args.index("--backend") + 1:][:1] == ["nccl"]:
        if gpu_count() == 0:
            raise UserError("--backend nccl needs NVIDIA GPUs and this machine has none. Use --backend gloo (or auto).")
        if nproc > gpu_count():
            raise UserError(f"--backend nccl with {nproc} processes but only {gpu_count()} GPU(s): NCCL needs one GPU "
                            f"per rank. Use nproc={gpu_count()} or --backend gloo.")


def torchrun(script, nproc: int | str = "auto", args=(), *, timeout: float = 900, env: dict | None = None,
             cwd=None, echo: bool = True, check: bool = True, torchrun_args=(), standalone: bool = True,
             cpu_threads: int | None = 1) -> LaunchResult:
    """Run `python -m torch.distributed.run --nproc_per_node=N script args...`.

    nproc="auto" uses every GPU, or 2 CPU processes without one.  For several nodes pass
    standalone=False and torchrun_args=["--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=HOST:29500", ...].
    cpu_threads sets OMP_NUM_THREADS per rank (unless env sets it), so N ranks do not fight over cores.
    """
    nproc = default_nproc() if nproc == "auto" else int(nproc)
    _check_nccl_fits(nproc, args)
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    if standalone:
        cmd.append("--standalone")
    cmd += [*map(str, torchrun_args), f"--nproc_per_node={nproc}", str(script), *map(str, args)]
    env = dict(env or {})
    if cpu_threads and "OMP_NUM_THREADS" not in env and "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(cpu_threads)
    return _run(cmd, timeout=timeout, env=env, cwd=cwd, echo=echo, check=check,
                what=f"torchrun of {Path(str(script)).name} with {nproc} process(es)")


def run_python(script, args=(), *, timeout: float = 900, env: dict | None = None, cwd=None, echo: bool = True,
               check: bool = True) -> LaunchResult:
    """Run `python script args...` (the single-process baseline), streaming and raising like torchrun()."""
    cmd = [sys.executable, str(script), *map(str, args)]
    return _run(cmd, timeout=timeout, env=env, cwd=cwd, echo=echo, check=check, what=f"python {Path(str(script)).name}")
