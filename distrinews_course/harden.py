"""What the course's launchers do to every rank they start, so that nothing of a launch outlives it.

    torchrun --nproc_per_node=2 -m distrinews_course.harden scripts/train_ddp.py ARGS...
    torchrun --nproc_per_node=2 -m distrinews_course.harden -m distrinews_course.demo ARGS...

course.launch starts every script through this wrapper (the training scripts know nothing of it). Before it runs
the script, unchanged, as __main__:
- it asks Linux to SIGKILL this rank when its parent, the torchrun agent, dies: a killed agent (a notebook
  kernel restarted mid-launch, a test that kills it) never leaves ranks behind holding ports and GPU memory;
- it leaves a marker file in $DISTRINEWS_RANKS_DIR when the launcher asks for one, so that accelerate_launch can
  count the ranks that really started;
- it copies its own output to $DISTRINEWS_RANK_LOGS/rank<R>.log, so that the launcher can show a rank's last words;
- it loads every module with Python's garbage collector paused (distrinews_lib/quick_imports.py): a rank that
  imports torch and transformers starts about a CPU-second sooner;
- after the script, it ends the rank through distributed.end_process, with the script's own exit code: gloo's threads
  can abort a finished rank at interpreter exit, in a script that does not end that way itself.

The environment the launchers give torchrun does the rest (course.launch.RANK_ENV): TORCH_GLOO_LAZY_INIT=1 (gloo
connects each pair of ranks on first use: its eager full-mesh connect failed about half the time right after a
--max-restarts restart, pytorch#167288) and TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (every rendezvous round, and so
every restart, builds the ranks a fresh store instead of reusing the agent's, where the dead attempt's keys are
still found; a replacement node would wait for first-round keys, pytorch#135712).
"""

from __future__ import annotations

import ctypes
import os
import runpy
import shutil
import signal
import subprocess
import sys


def die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies. A no-op elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        parent = os.getppid()
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def mark_rank() -> None:
    """A file per rank in $DISTRINEWS_RANKS_DIR: the launcher counts the ranks that really started."""
    folder = os.environ.get("DISTRINEWS_RANKS_DIR")
    if folder:
        with open(os.path.join(folder, f"rank{os.environ.get('RANK', 0)}"), "w") as f:
            f.write(f"{os.getpid()} {os.environ.get('WORLD_SIZE', 1)}\n")


def keep_own_output(folder: str) -> None:
    """Everything this rank writes (stdout and stderr, its children's too) also goes to FOLDER/rank<R>.log, through a
    `tee` process: the ranks share one pipe, so when a rank dies by a signal the launcher can still show that rank's
    own last lines. A separate process, not a thread: this process may fork (scripts/memory_footprint.py)."""
    tee = shutil.which("tee")
    if not tee:
        return
    read, write = os.pipe()
    # torchrun stops a rank by signalling its whole process group, tee included: a tee that died with it would drop
    # the rank's last lines still in the pipe (the hang doctor's paragraph). It ignores SIGTERM and SIGINT and ends
    # at end of input, when the rank and its children are gone.
    quiet = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        subprocess.Popen(
            [tee, "-a", os.path.join(folder, f"rank{os.environ.get('RANK', 0)}.log")], stdin=read, close_fds=True
        )  # its stdout is ours: the launcher's pipe
    finally:
        for sig, previous in quiet.items():
            signal.signal(sig, previous)
    os.close(read)
    for fd in (1, 2):
        os.dup2(write, fd)
    os.close(write)


def apply() -> None:
    if "RANK" in os.environ:  # started by torchrun (or accelerate launch): its agent is our parent
        die_with_parent()  # first: the sooner it is tied to its parent, the smaller the window a parent can die in
    from distrinews_lib import quick_imports

    quick_imports.install()  # the script's torch and transformers load with the garbage collector paused
    mark_rank()
    if os.environ.get("DISTRINEWS_RANK_LOGS"):
        keep_own_output(os.environ["DISTRINEWS_RANK_LOGS"])


def run(argv: list[str]) -> None:
    if not argv or argv[:1] == ["-m"] and len(argv) < 2:
        sys.exit("usage: python -m distrinews_course.harden SCRIPT [ARGS...] | -m MODULE [ARGS...]")
    apply()
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))  # as `python SCRIPT` would
        runpy.run_path(argv[0], run_name="__main__")


def main(argv: list[str]) -> None:
    """Run the script, then end the rank through distributed.end_process with the script's exit code: a script
    that returns normally (a learner's, a test's worker) cannot abort at interpreter exit either."""
    from distrinews_lib.errors import exit_code_of

    code = exit_code_of(lambda: run(argv))
    from distrinews_lib.distributed import (
        end_process,  # imported after the script: torch is not loaded before the script runs
    )

    end_process(code)


if __name__ == "__main__":
    main(sys.argv[1:])
