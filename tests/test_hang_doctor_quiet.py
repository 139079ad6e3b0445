"""The hang doctor stays silent on the straggler script once its reads run ahead: a run of its own, on quiet cores.

Beside other launches on two shared cores, one rank can be starved of CPU for most of its steps; the doctor then
names it, truly (CI saw rank 0 make the other wait 15 ms of a 51 ms step in 79% of 34 steps). So this run is the
lab's only one, and tests/quiet_last.py runs this file last and alone; where other programs still kept the cores
busy while it ran, the test says so and skips instead of judging."""

from __future__ import annotations

import pytest

from distrinews_course import leftovers
from distrinews_course.bench.quiet import OtherPrograms
from distrinews_course.hang_lab import HangLab, Scenario, left_behind

pytestmark = pytest.mark.slow


def test_the_fixed_straggler_script_hears_nothing_from_the_doctor(tmp_path):
    leftovers.mark_this_process_as_launcher()
    lab = HangLab(nproc=2, hang_s=3.0, out=tmp_path / "hangs", timeout_s=120)
    args = ["--mode", "fixed", "--steps", 40, "--ddp_timeout", f"{lab.group_timeout_s:g}"]
    lab.add(Scenario("healthy_straggler_fixed", "scripts/hangs/straggler.py", args))
    with OtherPrograms() as load:
        run = lab.get("healthy_straggler_fixed")
    assert run.result.ok and not run.result.timed_out, run.output[-3000:]
    if not load.quiet:
        pytest.skip(f"not judged: {load.why}")
    assert not run.doctor_lines and run.doctor is None and run.straggler is None, run.doctor_lines
    assert left_behind() == []
