"""Chapter 07's exercise 1 (pick_snapshot): the reference answer passes every case, and each usual mistake the
checker names is caught by one mutant, with the one line that names it."""

import os

import pytest
import torch

from distrinews_course import resume_demo
from distrinews_course.attempt import grade
from distrinews_course.notebook import answer
from distrinews_lib.training import snapshot


@pytest.fixture
def run_a(tmp_path):
    """A run folder as run A leaves it: a mid-epoch snapshot of epoch 2 and the epoch-end one, written in that order."""
    folder = tmp_path / "run_a" / "snapshots"
    folder.mkdir(parents=True)
    for i, name in enumerate(("snap_e002_b000048.pt", "snap_e003_b000000.pt")):
        torch.save({"snapshot_version": snapshot.SNAPSHOT_VERSION, "w": torch.randn(4096)}, folder / name)
        os.utime(folder / name, (1_700_000_000 + i,) * 2)
    return folder.parent


def cases(run_a, tmp_path):
    return lambda: resume_demo.pick_snapshot_cases(run_a, tmp_path / "cases")


def test_the_reference_pick_snapshot_passes_every_case(run_a, tmp_path):
    g = grade(answer("07_fault_tolerance", "pick_snapshot", True), cases(run_a, tmp_path), quiet=True)
    assert g.ok and len(g.passed) == 5, g.failed


@pytest.mark.parametrize("mistake", list(resume_demo.PICK_MISTAKES))
def test_each_mistake_is_caught_and_named_in_one_line(run_a, tmp_path, mistake):
    wrong, words = resume_demo.PICK_MISTAKES[mistake]
    g = grade(wrong, cases(run_a, tmp_path), quiet=True)
    assert not g.ok and words in g.failed and "\n" not in g.failed, (mistake, g.failed)


def test_the_mtime_trap_leaves_run_a_untouched(run_a, tmp_path):
    before = [p.stat().st_mtime for p in snapshot.list_snapshots(run_a)]
    resume_demo.pick_snapshot_cases(run_a, tmp_path / "cases")
    assert [p.stat().st_mtime for p in snapshot.list_snapshots(run_a)] == before
