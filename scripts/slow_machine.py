#!/usr/bin/env python
"""Run a command as if on a slower machine: busy-loop processes beside it, or fewer cores.

    python scripts/slow_machine.py -- .venv/bin/python -m pytest            # one busy loop per core: about half speed
    python scripts/slow_machine.py --busy 1 -- .venv/bin/python scripts/run_course.py --only 02
    python scripts/slow_machine.py --busy 0 --cores 1 -- .venv/bin/python -m pytest tests/test_ddp.py

Machines of the same kind differ by 2-3x in speed, and CI shares its cores with whatever else runs. A test whose
bound holds only on a fast, quiet machine passes here and fails there. Running the suite under contention finds
such a test before CI does: every bound must be derived from what the machine measures in the same run, or
assert what happened rather than how fast.

--busy N starts N processes that spin (`while True: pass`) at the same priority as the command, pinned round-robin
to the cores the command may use; the kernel shares each core between them, so a command that keeps every core
busy gets about half of each (the default: one busy loop per core). --cores K pins the command (and everything
it starts: torchrun, its ranks, notebook kernels) to K cores. The busy loops die with this script (and if it is
killed). Before the command starts, the script measures and prints how fast one core runs now against a
moment before, so the slowdown is a measurement, not a guess; with --report FILE it also writes that JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

SPIN = "while True: pass"


def usable_cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: no pinning
        return list(range(os.cpu_count() or 1))


def _die_with_parent_and_pin(cores):
    """preexec_fn: SIGKILL when this script dies (Linux), and run on `cores`."""

    def setup():
        try:
            import ctypes

            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
        if cores is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cores)

    return setup


def core_speed(seconds: float = 0.4) -> float:
    """Loop iterations per second of this process on the CPU it gets right now (wall clock, so contention counts)."""
    n, start = 0, time.perf_counter()
    while True:
        for _ in range(20000):
            n += 1
        if time.perf_counter() - start >= seconds:
            return n / (time.perf_counter() - start)


def parse(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--busy", type=int, default=None, help="busy-loop processes beside the command (default: one per core)"
    )
    p.add_argument("--cores", type=int, default=None, help="run the command on this many cores only (default: all)")
    p.add_argument(
        "--report", default=None, help="write the measured slowdown and the command's time to this JSON file"
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    a = p.parse_args(argv)
    if a.command[:1] == ["--"]:
        a.command = a.command[1:]
    if not a.command:
        p.error("give the command to run after --, e.g. -- .venv/bin/python -m pytest")
    cores = usable_cores()
    if a.cores is not None and not 1 <= a.cores <= len(cores):
        p.error(f"--cores {a.cores}: this machine lets us use {len(cores)} core(s)")
    if a.busy is not None and a.busy < 0:
        p.error("--busy must be 0 or more")
    return a


def main(argv=None) -> int:
    a = parse(argv)
    cores = usable_cores()
    pinned = cores[: a.cores] if a.cores else None
    target = pinned or cores
    n_busy = len(target) if a.busy is None else a.busy
    before = core_speed()
    spinners = [
        subprocess.Popen([sys.executable, "-c", SPIN], preexec_fn=_die_with_parent_and_pin([target[i % len(target)]]))
        for i in range(n_busy)
    ]

    def stop_spinners(*_):
        for s in spinners:
            if s.poll() is None:
                s.kill()

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: (stop_spinners(), sys.exit(128 + signum)))
    try:
        time.sleep(0.3)  # let the spinners start
        # Measured as one of the command's processes would see it: on a core beside that core's busy loop.
        mine = usable_cores()
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, [target[0]])
        after = core_speed() if n_busy else before
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, mine)
        share = after / before if before else 1.0
        where = f"{len(pinned)} of {len(cores)} cores" if pinned else f"all {len(cores)} cores"
        print(
            f"[slow_machine] {n_busy} busy loop(s) on {where}: one core now runs at {100 * share:.0f}% of its speed "
            f"a moment ago; running: {' '.join(a.command)}",
            flush=True,
        )
        started = time.perf_counter()
        proc = subprocess.Popen(a.command, preexec_fn=(lambda: os.sched_setaffinity(0, pinned)) if pinned else None)
        try:
            rc = proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            rc = proc.wait()
        took = time.perf_counter() - started
        print(
            f"[slow_machine] the command exited with code {rc} after {took:.0f} s ({n_busy} busy loop(s), "
            f"{100 * share:.0f}% core speed)",
            flush=True,
        )
        if a.report:
            with open(a.report, "w") as f:
                json.dump(
                    {
                        "command": a.command,
                        "busy": n_busy,
                        "cores": len(target),
                        "core_speed_share": round(share, 3),
                        "seconds": round(took, 1),
                        "returncode": rc,
                    },
                    f,
                    indent=1,
                )
        return rc
    finally:
        stop_spinners()


if __name__ == "__main__":
    sys.exit(main())
