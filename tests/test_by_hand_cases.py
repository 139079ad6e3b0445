"""The checker's cases (distrinews_course/by_hand/probes.py) on the one rung no exercise covers, ZeRO-2: each ends as
torch's DDP does, or in a clear error on every rank, its buckets follow DDP's rule and none of its collectives waits
inside backward. Every rung's own behaviour in these cases, against DDP after a bare init_process_group, is
tests/test_rung_edge_cases.py's; the exercises' reference answers meet every case in chapter 03's solution cell, and
below (also_in_notebook)."""

import importlib.util
from pathlib import Path

import pytest

from distrinews_course.by_hand import exercises, probes, report

ROOT = Path(__file__).resolve().parent.parent
EXERCISES = ("overlapped", "bucketed", "zero1", "zero3")

# case -> how ZeRO-2 must end: "as DDP" (weights equal to torch DDP's on the same case) or "clear error on every rank"
EXPECTED = {
    "accumulate": "as DDP",
    "dtype": "as DDP",
    "order": "as DDP",
    "unused_rank1": "clear error on every rank",
    "unused_all": "clear error on every rank",
}


@pytest.fixture(scope="module")
def race(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cases")
    args = ["--rungs", "zero2", "--models", "tiny", "--check_steps", 1, "--check_only", "--probes", "all"]
    return report.run_race([*args, "--timeout_s", 20], tmp / "cases.json", timeout=600)


@pytest.mark.slow
def test_zero2_meets_every_case_of_the_checker(race):
    got = race["probes"]["zero2"]
    assert list(got) == probes.probes_for("zero2"), got
    for case, want in EXPECTED.items():
        v = got[case]
        assert v["ok"], (case, v)
        if want == "clear error on every rank":
            assert "clear error on every rank" in v["summary"] or "refused on every rank" in v["summary"], v
        else:
            assert "max difference" in v["summary"] and "refused" not in v["summary"], v
    assert got["overlap"]["ok"] and "none waited for there" in got["overlap"]["summary"], got["overlap"]
    assert got["bucket_rule"]["ok"], got["bucket_rule"]


@pytest.mark.slow
@pytest.mark.also_in_notebook  # chapter 03's solution cell runs the same answers through the same checker
def test_the_reference_answers_pass_the_checker(tmp_path):
    spec = importlib.util.spec_from_file_location("answers_03", ROOT / "notebooks" / "answers" / "03_ddp_by_hand.py")
    answers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(answers)
    items = [(r, answers.write_solution(r, tmp_path / f"answer_{r}.py"), r) for r in EXERCISES]
    verdicts = exercises.check_exercises(items, tmp_path, timeout=1500, models="tiny", check_steps=1)
    for rung in EXERCISES:
        v = verdicts[rung]
        assert v["ok"] is True, (rung, v)
        assert len(v["passed"]) == 1 + len(probes.probes_for(rung)), (rung, v["passed"])
