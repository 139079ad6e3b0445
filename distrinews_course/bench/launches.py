"""Chapter 05's launches of scripts/bench_runs.py: a plan in, its results out. Each launch's log goes to a file and its
last lines show only if it fails; launch_watched() also measures how many cores other programs kept busy around it.

    R, seconds = launches.launch("bench", 2, runs, OUT, timeout=1800, gpus=0, echo=loopback.run_line)
    R, seconds, others, quiet = launches.launch_watched(...)
    B, seconds = launches.box_launch("box2", 2, "400mbit", plan, OUT, timeout=1800)
"""

from __future__ import annotations

import json
from pathlib import Path

from .. import link, perf_model
from ..launch import LaunchError, torchrun
from .timing import wait_for_quiet

DRIVER = "scripts/bench_runs.py"


def _launched(name: str, plan: dict, out: Path, start):
    (out / f"{name}.json").unlink(missing_ok=True)
    (out / f"{name}_runs.json").write_text(json.dumps(plan))
    try:
        res = start([out / f"{name}.json", out / f"{name}_runs.json"])
    except LaunchError as e:
        (out / f"{name}.log").write_text(e.result.output)
        raise
    (out / f"{name}.log").write_text(res.output)
    return json.loads((out / f"{name}.json").read_text()), res.seconds


def launch(name: str, nproc: int, plan: dict, out: Path, timeout: float, gpus: int, echo=False):
    """One torchrun of the driver with `plan`; returns (results, seconds). echo: a line filter for what to show."""
    return _launched(
        name,
        plan,
        out,
        lambda args: torchrun(DRIVER, nproc, args, timeout=timeout, echo=echo, cpu_threads=None if gpus else 1),
    )


def launch_watched(name: str, nproc: int, plan: dict, out: Path, timeout: float, gpus: int, echo=False):
    """launch(), and the cores other programs kept busy just before, just after and during each run: speed claims
    are checked only when the machine was quiet (on a GPU the CPU's other users hardly matter)."""
    before = wait_for_quiet(max_foreign_cores=0.3, timeout_s=5)  # nothing of ours runs now: what others use
    res, secs = launch(name, nproc, plan, out, timeout, gpus, echo)
    after = wait_for_quiet(max_foreign_cores=0.3, timeout_s=2)
    during = [perf_model.others_cores(r) for r in res.values() if "ranks" in r]
    others = (
        before["foreign_cores"] or 0.0,
        after["foreign_cores"] or 0.0,
        max((x or 0.0 for x in during), default=0.0),
    )
    return res, secs, others, gpus > 0 or max(others) < 0.3


def box_launch(name: str, nodes: int, rate: str, plan: dict, out: Path, timeout: float):
    """One box of `nodes` nodes (scripts/cluster/box.py) running the driver, its links at `rate`."""
    return _launched(
        name, plan, out, lambda args: link.run_in_box(DRIVER, args, nodes=nodes, rate=rate, timeout=timeout)
    )
