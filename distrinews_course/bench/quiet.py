"""Whether a measured run had this machine's cores to itself: chapter 05's speed claims are checked only on runs where
it did, and shown with a NOTE where it did not.

    quiet.others(run)                 # cores other programs kept busy during a run of scripts/bench_runs.py
    quiet.all_quiet(runs, gpus=0)     # every run under QUIET_CORES (always, on GPUs: the devices compute)
    quiet.busy_reason(runs)           # 'other programs used up to 0.61 cores during 1 of its 9 runs'
    with quiet.OtherPrograms(server_pid) as load: ...   # the same reading around a block of a notebook's own work

Each run of scripts/bench_runs.py records the machine's busy CPU time over its window (/proc/stat) and every rank's own
CPU time; the difference, per second, is what other programs used (perf_model.others_cores).
"""

from __future__ import annotations

import resource
import time

from ..perf_model import others_cores
from .timing import cpu_busy_seconds, foreign_cores, process_cpu_s

# A run is quiet when other programs used under 0.3 cores during it. On the 2-core machines this course is checked on,
# with one core per rank, 0.3 cores is 15% of the machine: the share the chapter's models are checked to. Where other
# programs took more, a right model could miss by more than its bound, so the run cannot check it either way.
QUIET_CORES = 0.3


def others(run: dict) -> float | None:
    """Cores other programs kept busy during one run (None where /proc/stat is missing, or the run has no ranks)."""
    if "ranks" not in run:
        return run.get("others_cores")
    return others_cores(run)


def all_quiet(runs, gpus: bool = False) -> bool:
    """Whether every run had the machine to itself: other programs under QUIET_CORES in each. On GPUs always: the
    devices compute, not the shared cores. A run with no reading (no /proc/stat) is not quiet: nothing says it was."""
    return bool(gpus) or all(x is not None and x < QUIET_CORES for x in map(others, runs))


def busiest(runs) -> float:
    """The most cores other programs used during any of the runs (0 where none was measured)."""
    return max((others(r) or 0.0 for r in runs), default=0.0)


def busy_reason(runs) -> str:
    """Why these runs cannot check a speed claim, in a few words for a NOTE."""
    runs = list(runs)
    unread = [r for r in runs if others(r) is None]
    if unread and len(unread) == len(runs):
        return "this machine has no /proc/stat to say whether other programs were busy"
    busy = [r for r in runs if (others(r) or 0.0) >= QUIET_CORES]
    if not busy and unread:
        return f"{len(unread)} of its {len(runs)} runs have no reading of what other programs used"
    return f"other programs used up to {busiest(runs):.2f} cores during {len(busy)} of its {len(runs)} runs"


class OtherPrograms:
    """How many cores other programs kept busy while the block ran: the machine's busy time (/proc/stat) less this
    process's own, that of every process it started and waited for, and that of the live processes `pids` (a server
    it started and still runs). `cores` is None where /proc/stat is missing.

        with OtherPrograms(server.proc.pid) as load:
            levels = latency_under_load(server.port)
        load.cores, load.quiet, load.why
    """

    cores: float | None = None

    def __init__(self, *pids: int):
        self.pids = pids

    def _own(self) -> float:
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # a pid reaped inside the block moves here: counted once
        return time.process_time() + kids.ru_utime + kids.ru_stime + sum(map(process_cpu_s, self.pids))

    def __enter__(self):
        self._busy, self._own0, self._t0 = cpu_busy_seconds(), self._own(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        seconds = time.perf_counter() - self._t0
        self.cores = foreign_cores(self._busy, cpu_busy_seconds(), self._own() - self._own0, seconds)

    @property
    def quiet(self) -> bool:
        """Other programs under QUIET_CORES for the whole block."""
        return self.cores is not None and self.cores < QUIET_CORES

    @property
    def why(self) -> str | None:
        """None when quiet; else the reason, in a few words for a NOTE."""
        if self.quiet:
            return None
        if self.cores is None:
            return "this machine has no /proc/stat to say whether other programs were busy"
        return f"other programs kept {self.cores:.2f} cores busy while it ran (more than {QUIET_CORES})"
