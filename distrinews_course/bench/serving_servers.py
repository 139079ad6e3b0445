"""The serving benchmarks' servers: `python -m distrinews_lib.serving` (or an older commit's) in a child process,
the checkpoints they serve, and what a run records about its machine and code."""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from distrinews_lib.errors import UserError
from distrinews_lib.serving.settings import serve_command
from distrinews_lib.training.config import RunConfig

from .. import ROOT
from .serving_load import http_health

REPO = ROOT  # the checkout: servers run from it, git describes it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_checkpoint(folder: Path) -> Path:
    """A tiny random DistilBERT checkpoint: the benchmark measures serving, not accuracy."""
    from distrinews_lib.checkpoint import save_checkpoint
    from distrinews_lib.data.texts import AG_NEWS_LABELS
    from distrinews_lib.models.build import build_model

    model, tokenizer, _ = build_model(RunConfig(model="tiny", seed=0), AG_NEWS_LABELS)
    return save_checkpoint(
        folder / "bench_tiny.pt",
        model,
        tokenizer,
        AG_NEWS_LABELS,
        {"data_source": "synthetic", "model": "tiny", "final_accuracy": 0.0, "world_size": 1},
        max_length=64,
    )


class Server:
    """`python -m distrinews_lib.serving` (or `cmd`, such as the LitServe competitor) in a child process of its own
    session, stopped on exit with every process it started."""

    def __init__(
        self,
        checkpoint: Path,
        port: int,
        extra: list[str],
        tree: Path = REPO,
        cmd: list[str] | None = None,
        ready_s: float = 300,
    ):
        self.cmd = cmd or serve_command(checkpoint, port, extra)
        self.port = port
        self.tree = tree  # the checkout whose distrinews_lib serves (--overload --before: an older commit's)
        self.ready_s = ready_s  # LitServe spawns processes that import torch again: minutes on a busy machine
        self.proc = None
        self.log = tempfile.TemporaryFile(mode="w+")

    def launch(self):
        env = dict(os.environ, PYTHONPATH=str(self.tree) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen(
            self.cmd, cwd=self.tree, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        return self

    def __enter__(self):
        if self.proc is None:
            self.launch()
        deadline = time.monotonic() + self.ready_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise UserError(
                    f"the server exited with code {self.proc.returncode} before it was ready: {self.log.read()[-1500:]}"
                )
            if asyncio.run(http_health(self.port)):
                return self
            time.sleep(0.2)
        raise UserError(f"the server did not answer GET /health within {self.ready_s:g} s")

    def _session(self) -> list[list[str]]:
        """/proc/PID/stat fields (after the name) of every live process of the server's session."""
        out = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == self.proc.pid:  # the session id: the server and all it started
                out.append(fields)
        return out

    def processes(self) -> int:
        """How many processes the server runs now (itself and all it started)."""
        return len(self._session())

    def cpu_seconds(self) -> float:
        """CPU seconds (user + system) of every live process of the server's session (Linux /proc)."""
        return sum(int(f[11]) + int(f[12]) for f in self._session()) / os.sysconf("SC_CLK_TCK")

    def __exit__(self, *exc):
        if self.proc is not None:
            # The whole group, even when the server itself has gone: LitServe's workers outlive it otherwise.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGCONT)  # a paused server (the race) cannot handle SIGTERM
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break  # nothing of it is left
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=15)
                time.sleep(0.5)  # the others of the group finish their shutdown, or get SIGKILL next
        self.log.close()


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_average():
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def git_commit() -> str:
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "distrinews_lib", "scripts/bench_serving.py"],
            cwd=REPO,
            capture_output=True,
            text=True,
        ).stdout.strip()
        return sha + ("+uncommitted-changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def model_description(checkpoint: Path) -> dict:
    from distrinews_lib.serving.inference import load_checkpoint

    loaded = load_checkpoint(checkpoint)
    return {
        "checkpoint": str(checkpoint),
        "type": loaded.model.config.model_type,
        "parameters": sum(p.numel() for p in loaded.model.parameters()),
        "max_length": loaded.max_length,
        "metadata_model": loaded.metadata.get("model"),
    }


def _versions(*names):
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def proc_cpu_seconds(pid: int) -> float:
    """user + system CPU time of a process (Linux /proc), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_idle(pid: int, settle_s: float = 1.0, limit_s: float = 900.0) -> float:
    """Wait until the process uses (almost) no CPU for `settle_s`; return its CPU seconds then."""
    deadline = time.monotonic() + limit_s
    last = proc_cpu_seconds(pid)
    while time.monotonic() < deadline:
        time.sleep(settle_s)
        now = proc_cpu_seconds(pid)
        if now - last < 0.03 * settle_s:
            return now
        last = now
    return proc_cpu_seconds(pid)


def make_checkpoint_with(tree: Path, folder: Path) -> Path:
    """A tiny random model (seed 0) saved by `tree`'s own distrinews_lib, in `tree`'s checkpoint format."""
    folder.mkdir(parents=True, exist_ok=True)
    # Both library layouts (before and after the reshape), so `--before` can point at an older tree.
    code = (
        "import sys\n"
        "try:\n"
        "    from distrinews_lib.data.texts import AG_NEWS_LABELS\n"
        "    from distrinews_lib.checkpoint import save_checkpoint\n"
        "    from distrinews_lib.training.config import RunConfig\n"
        "    from distrinews_lib.models.build import build_model\n"
        "    m, t, _ = build_model(RunConfig(model='tiny', seed=0), AG_NEWS_LABELS)\n"
        "except ImportError:\n"
        "    from distrinews_lib import AG_NEWS_LABELS\n"
        "    from distrinews_lib.checkpoint import save_checkpoint\n"
        "    from distrinews_lib.config import RunConfig\n"
        "    from distrinews_lib.model import build_model\n"
        "    m, t, _ = build_model(RunConfig(model='tiny', seed=0), AG_NEWS_LABELS)\n"
        "save_checkpoint(sys.argv[1], m, t, AG_NEWS_LABELS, {'data_source': 'synthetic', 'model': 'tiny', "
        "'final_accuracy': 0.0, 'world_size': 1}, max_length=64)"
    )
    path = folder / "bench_tiny.pt"
    env = dict(os.environ, PYTHONPATH=str(tree) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code, str(path)], cwd=tree, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise UserError(f"could not make a checkpoint with the code in {tree}: {r.stderr[-800:]}")
    return path


def commit_of(tree: Path) -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
