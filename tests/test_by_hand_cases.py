"""The exercises' reference answers meet every case of the checker (distrinews_course/by_hand/probes.py), as chapter
03's solution cell shows them doing: also_in_notebook, so deselected by default. ZeRO-2, the one rung no exercise
covers, is checked on the same cases in tests/test_by_hand_checker.py, in the mutants' launch; every rung's own
behaviour in these cases, against DDP after a bare init_process_group, is tests/test_rung_edge_cases.py's."""

import importlib.util
from pathlib import Path

import pytest

from distrinews_course.by_hand import exercises, probes

ROOT = Path(__file__).resolve().parent.parent
EXERCISES = ("overlapped", "bucketed", "zero1", "zero3")


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
