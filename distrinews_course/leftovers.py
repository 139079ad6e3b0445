"""Ranks left over from an interrupted launch: mark every launch, find its survivors, stop them.

A notebook cell that launched torchrun can die in ways launch.py cannot clean up after (the kernel is
killed or restarted while ranks run in sessions of their own). The survivors keep their GPU memory and
their rendezvous port, and the next launch fails with CUDA out-of-memory or EADDRINUSE.

The registry is the environment of the processes themselves: each launch passes

    DISTRINEWS_LAUNCH=<launcher pid>:<launcher start time>:<launch id>

to torchrun, which hands its environment down to every rank (and every process a rank starts). A process
that carries such a marker while its launcher (that PID with that start time) is gone is a survivor of an
interrupted launch. Unlike a registry file, this survives re-parenting and new sessions, cannot go stale,
and never names a recycled PID: each PID is checked against its start time before it is signalled.

    leftovers.stop_leftovers()                    # the course's first cell: stop survivors of earlier launches...
    leftovers.mark_this_process_as_launcher()     # ...and mark everything this kernel starts from now on
    env = leftovers.before_launch(env)            # or per launch: stop survivors, then mark this launch's env

Linux only (/proc); elsewhere both are no-ops.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

MARKER = "DISTRINEWS_LAUNCH"


@dataclass
class Leftover:
    pid: int
    start: str  # start time in clock ticks since boot (/proc/PID/stat field 22)
    launcher_pid: int
    command: str


def _linux() -> bool:
    return sys.platform.startswith("linux") and Path("/proc/self/stat").exists()


def start_time(pid: int) -> str | None:
    """A process's start time (clock ticks since boot), or None when there is no such process (or a zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


def marker(launcher_pid: int | None = None) -> str:
    """The value of DISTRINEWS_LAUNCH for a launch started by this process (or `launcher_pid`)."""
    pid = os.getpid() if launcher_pid is None else launcher_pid
    return f"{pid}:{start_time(pid) or 0}:{uuid.uuid4().hex[:12]}"


def _environ_marker(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, or another user's process
        return None
    for item in raw.split(b"\0"):
        if item.startswith(MARKER.encode() + b"="):
            return item.split(b"=", 1)[1].decode(errors="replace")
    return None


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return "?"


def _ancestors() -> set:
    out, pid = set(), os.getpid()
    while pid > 1:
        out.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return out


def find_leftovers() -> list[Leftover]:
    """This user's processes marked by a launch whose launcher is gone."""
    if not _linux():
        return []
    mine, out = _ancestors(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine:
            continue
        pid = int(entry)
        value = _environ_marker(pid)
        if not value:
            continue
        try:
            launcher, launcher_start, _ = value.split(":", 2)
            launcher = int(launcher)
        except ValueError:
            continue
        if start_time(launcher) == launcher_start:
            continue  # its launch is still running (another cell, another test): not ours to stop
        started = start_time(pid)
        if started is not None:
            out.append(Leftover(pid, started, launcher, _command(pid)))
    return out


def stop_leftovers(grace_s: float = 3.0, log=print) -> list[Leftover]:
    """SIGTERM every survivor of an interrupted launch, SIGKILL those still there after `grace_s`.
    Returns what it stopped (and says so through `log`)."""
    found = find_leftovers()
    if not found:
        return []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [p for p in found if start_time(p.pid) == p.start]
        for p in alive:
            try:
                os.kill(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + grace_s
        while (
            sig == signal.SIGTERM and time.monotonic() < deadline and any(start_time(p.pid) == p.start for p in alive)
        ):
            time.sleep(0.1)
    if log:
        pids = ", ".join(str(p.pid) for p in found)
        log(
            f"stopped {len(found)} process(es) left over from an interrupted launch (PIDs {pids}; their launcher "
            f"{found[0].launcher_pid} is gone): they held GPU memory and a rendezvous port"
        )
    return found


def mark_this_process_as_launcher(environ=None) -> str:
    """Every process this one starts from now on (torchrun, its ranks, a server) carries this process's marker:
    if this process dies while they run, the next stop_leftovers() finds them. course.setup() calls it, so
    launches from a notebook are marked without launch.py knowing."""
    environ = os.environ if environ is None else environ
    if _linux():
        environ[MARKER] = marker()
    return environ.get(MARKER, "")


def before_launch(env: dict | None = None, log=print) -> dict:
    """Stop the survivors of earlier interrupted launches, then return `env` with this launch's marker added."""
    env = dict(env or {})
    if _linux():
        stop_leftovers(log=log)
        env[MARKER] = marker()
    return env
