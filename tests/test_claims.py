"""distrinews_course/claims.py and bench/quiet.py: a claim is checked (a false one fails the notebook with its text)
or shown with one NOTE that says why this run cannot check it; a run is quiet when other programs used under 0.3 cores
during it, and one with no reading is not quiet."""

import pytest

from distrinews_course.bench import quiet
from distrinews_course.claims import Claim, settle


def test_a_checked_claim_prints_checked_and_a_false_one_fails(capsys):
    settle(Claim("two is more than one", 2 > 1))
    assert capsys.readouterr().out == "checked: two is more than one\n"
    with pytest.raises(AssertionError, match="claim failed: one is more than two"):
        settle([Claim("fine", True), Claim("one is more than two", False)])


def test_an_unchecked_claim_is_a_note_whatever_it_says(capsys):
    settle([Claim("the model is within 15%", False, "other programs used up to 0.61 cores during 1 of its 3 runs")])
    out = capsys.readouterr().out
    assert out == (
        "NOTE: not checked on this run (other programs used up to 0.61 cores during 1 of its 3 runs): "
        "the model is within 15%\n"
    )


def run(*others_cores):
    """A run of scripts/bench_runs.py whose longest rank saw `others_cores[i]` cores of others (the other ranks' own CPU
    added, as the machine's busy time counts it)."""
    ranks = [{"seconds": 1.0, "steps": 1, "cpu_s": 1.0, "foreign_cores": f} for f in others_cores]
    for i, r in enumerate(ranks):  # what /proc/stat saw beyond this rank: the others' CPU and the other programs'
        if r["foreign_cores"] is not None:
            r["foreign_cores"] += sum(o["cpu_s"] for j, o in enumerate(ranks) if j != i)
    return {"ranks": ranks}


def test_quiet_is_under_0_3_cores_of_other_programs():
    assert quiet.others(run(0.1)) == pytest.approx(0.1)
    assert quiet.all_quiet([run(0.1), run(0.29)])
    assert not quiet.all_quiet([run(0.1), run(0.31)])
    assert quiet.all_quiet([run(0.9)], gpus=True), "on GPUs the devices compute: the cores' other users do not count"
    assert quiet.busy_reason([run(0.1), run(0.61), run(0.2)]) == (
        "other programs used up to 0.61 cores during 1 of its 3 runs"
    )


def test_a_run_without_a_reading_is_not_quiet():
    assert not quiet.all_quiet([run(None)])
    assert "no /proc/stat" in quiet.busy_reason([run(None)])
    assert quiet.busy_reason([run(0.1), run(None)]) == "1 of its 2 runs have no reading of what other programs used"
    assert quiet.others({"others_cores": 0.05}) == 0.05  # a collectives run records its own figure


def test_settle_folded_shows_one_line_where_all_hold_and_fails_unfolded_where_one_does(capsys, monkeypatch):
    from distrinews_course import claims

    shown = []
    monkeypatch.setattr(claims, "show", shown.append)
    facts = [Claim("the link reads back 383 Mbit/s", True), Claim("the 4-rank ring sends 1.5x", True)]
    claims.settle_folded(facts + [Claim("busy run", False, "other programs used 0.6 cores")], "facts of the box")
    assert capsys.readouterr().out == "NOTE: not checked on this run (other programs used 0.6 cores): busy run\n"
    (fold,) = shown
    visible, body = fold.split("<details>")
    assert visible.strip() == "checked: 2 of 2 facts of the box - details folded"
    assert "checked: the link reads back 383 Mbit/s\nchecked: the 4-rank ring sends 1.5x" in body
    shown.clear()
    with pytest.raises(AssertionError, match="claim failed: the 4-rank ring sends 1.5x"):
        claims.settle_folded([facts[0], Claim("the 4-rank ring sends 1.5x", False)], "facts of the box")
    assert capsys.readouterr().out == "checked: the link reads back 383 Mbit/s\n"  # unfolded, as settle prints it
    assert shown == []  # nothing folded
    with pytest.raises(ValueError):
        claims.checked_fold([Claim("false", False)], "facts")


def test_a_folded_section_fails_on_a_false_claim_unfolded(capsys, monkeypatch):
    from distrinews_course import claims
    from distrinews_course.bench import perf_story

    shown = []
    monkeypatch.setattr(claims, "show", shown.append)
    groups = {"a": [Claim("one", True)], "b": Claim("two", True)}
    perf_story.settle_section(groups, fold="checks of the box's runs")
    assert capsys.readouterr().out == "" and shown[0].startswith("checked: 2 of 2 checks of the box's runs")
    shown.clear()
    with pytest.raises(AssertionError, match="claim failed: two"):
        perf_story.settle_section({"a": [Claim("one", True)], "b": Claim("two", False)}, fold="checks")
    assert capsys.readouterr().out == "checked: one\n" and shown == []
