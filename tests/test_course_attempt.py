"""course/attempt.py: a learner's exercise code gets a one-line verdict, never a traceback or a hang."""

from __future__ import annotations

from distrinews_course.attempt import grade, is_stub, judge_prediction

CASES = [("two plus one", (2,), lambda got: None if got == 3 else f"returned {got!r}, expected 3")]


def not_written(x):
    # the learner's code goes here
    raise NotImplementedError


def right(x):
    return x + 1


def wrong(x):
    return x * 2


def crashes(x):
    return {}[x]


def loops(x):
    while True:
        pass


def test_a_stub_is_not_attempted_and_its_cases_are_not_built(capsys):
    built = []
    g = grade(not_written, lambda: built.append(1) or CASES)
    assert is_stub(not_written) and not is_stub(right)
    assert not g.attempted and not g.ok and built == []
    assert "not attempted yet" in capsys.readouterr().out


def test_right_code_passes_every_case():
    g = grade(right, CASES, quiet=True)
    assert g.ok and g.passed == ["two plus one"]


def test_wrong_code_gets_the_case_and_what_was_expected():
    g = grade(wrong, CASES, quiet=True)
    assert not g.ok and g.failed == "case 'two plus one': returned 4, expected 3"


def test_an_exception_is_one_line_naming_the_line_that_raised():
    g = grade(crashes, CASES, quiet=True)
    assert g.failed.startswith("case 'two plus one': crashes raised KeyError: 2") and "return {}[x]" in g.failed
    assert "\n" not in g.failed


def test_an_endless_loop_is_interrupted():
    g = grade(loops, CASES, timeout=0.5, quiet=True)
    assert "did not return within" in g.failed


def test_predictions(capsys):
    assert judge_prediction("steps", None, 1) is None
    assert judge_prediction("steps", 1, 1) is True
    assert judge_prediction("ppl", 3000, 4207, right=0.5 < 3000 / 4207 < 2) is True
    assert judge_prediction("steps", 2, 1) is False
    assert "no prediction written down" in capsys.readouterr().out
