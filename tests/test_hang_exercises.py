"""Chapter 12's exercise checks (distrinews_course/hang_exercises.py): the reference answer passes every case, and each
mistake the checks claim to catch, written as a wrong answer (a mutant), is caught and named in one line."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import pytest

from distrinews_course.attempt import grade
from distrinews_course.hang_exercises import culprit_cases, entry, hand_written_cases, judge, judge_mystery, truth_of

ANSWERS = Path(__file__).resolve().parent.parent / "notebooks" / "answers" / "12_diagnosing_hangs.py"


def reference():
    spec = importlib.util.spec_from_file_location("answers_12", ANSWERS)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.find_culprit


def slow_save_run():
    """What the debug server showed in section 2: rank 1 waits in barrier #9, rank 0 is still saving (nothing waits)."""
    done = [entry(s, "all_reduce") for s in range(1, 9)]
    return {0: done, 1: done + [entry(9, "barrier", retired=False, shape=())]}


def mystery_run():
    """Three ranks; rank 1 stopped early and waits in barrier #30, the others in broadcast #30."""
    fr = {r: [entry(s, "all_reduce") for s in range(1, 30)] for r in range(3)}
    fr[0].append(entry(30, "broadcast", retired=False))
    fr[2].append(entry(30, "broadcast", retired=False))
    fr[1].append(entry(30, "barrier", retired=False, shape=()))
    return fr


def cases():
    return culprit_cases({"slow save": (slow_save_run(), 0), "mystery": (mystery_run(), 1)})


def test_the_reference_answer_passes_every_case():
    result = grade(reference(), cases, quiet=True)
    assert result.ok, result.failed
    assert len(result.passed) == len(hand_written_cases()) + 2


def _waits(fr):
    out = {}
    for r, es in fr.items():
        pending = [e for e in es if not e["retired"]]
        if pending:
            out[r] = (pending[0]["profiling_name"].split(":")[-1], pending[0]["collective_seq_id"])
    return out


def names_a_waiting_rank(fr):
    """Mistake: the first rank that waits is taken for the culprit."""
    r = min(_waits(fr))
    return r, *_waits(fr)[r]


def last_completed(fr):
    """Mistake: the last collective every rank completed, instead of the first one that did not complete."""
    culprit, op, seq = reference()(fr)
    return culprit, op, seq - 1


def culprits_own_op(fr):
    """Mistake: what the culprit waits in, instead of what the others wait in."""
    culprit, op, seq = reference()(fr)
    return culprit, _waits(fr).get(culprit, (op,))[0], seq


def crashes_when_a_rank_waits_in_nothing(fr):
    """Mistake: every rank is assumed to wait in something."""
    waits = {r: [e for e in es if not e["retired"]][0] for r, es in fr.items()}
    (op, seq), _ = Counter(
        (e["profiling_name"].split(":")[-1], e["collective_seq_id"]) for e in waits.values()
    ).most_common(1)[0]
    return min(r for r, e in waits.items() if e["collective_seq_id"] != seq), op, seq


def returns_a_sentence(fr):
    return f"rank {reference()(fr)[0]}"


@pytest.mark.parametrize(
    "mutant, words",
    [
        (names_a_waiting_rank, "like the others: the culprit is the rank that never called it"),
        (last_completed, "completed on every rank; the hang is at the first collective that did not complete"),
        (culprits_own_op, "name the collective the OTHER ranks wait in"),
        (crashes_when_a_rank_waits_in_nothing, "raised IndexError"),
        (returns_a_sentence, "return (rank, op, seq)"),
    ],
    ids=lambda m: getattr(m, "__name__", "words"),
)
def test_each_mistake_is_caught_and_named(mutant, words):
    result = grade(mutant, cases, quiet=True)
    assert not result.ok and words in result.failed, result.failed


def test_the_recorders_own_op_names_are_accepted():
    fr = mystery_run()
    assert judge((1, "gloo:broadcast", 30), truth_of(fr, 1), fr) is None


def test_the_mystery_answer_is_judged_with_the_same_words():
    fr = mystery_run()
    truth = truth_of(fr, 1)
    assert truth == (1, "broadcast", 30)
    assert judge_mystery((1, "broadcast", 30), truth, fr) is None
    assert "no answer yet" in judge_mystery(None, truth, fr)
    assert "like the others" in judge_mystery((0, "broadcast", 30), truth, fr)
    assert "name the collective the OTHER ranks wait in" in judge_mystery((1, "barrier", 30), truth, fr)
    assert "#29 completed on every rank" in judge_mystery((1, "broadcast", 29), truth, fr)
    assert "not #31" in judge_mystery((1, "broadcast", 31), truth, fr)
    assert "not the culprit" in judge(("2", "broadcast", 30), truth, fr)


def test_the_mystery_bug_and_fix_pass_the_reference_and_name_each_mistake():
    from distrinews_course.hang_exercises import bug_lines, judge_mystery_bug

    spec = importlib.util.spec_from_file_location("answers_12_bug", ANSWERS)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert judge_mystery_bug(mod.MYSTERY_BUG_LINE, mod.MYSTERY_FIX) is None
    early_stop, leave = bug_lines()
    assert judge_mystery_bug(early_stop, "b") is None and leave == early_stop + 2
    assert "no answer yet" in judge_mystery_bug(None, "b")
    assert "runs on the culprit as on the others" in judge_mystery_bug(leave + 1, "b")  # the barrier: a symptom
    assert "past the end" in judge_mystery_bug(10_000, "b")
    assert "longer timeout only makes" in judge_mystery_bug(leave, "a")
    assert "DDP's all-reduce" in judge_mystery_bug(leave, "c")
    assert "one of" in judge_mystery_bug(leave, "z")


def test_section_1s_picture_is_drawn_from_the_scripts_own_shards_and_needs_uneven_ones(tmp_path):
    from distrinews_course.hang_figures import skipped_collective_picture
    from distrinews_course.hang_scenarios import skip_batches

    script = (Path(__file__).parents[1] / "scripts/pitfalls/07_uneven_inputs.py").read_text()
    assert (
        "N = 3 * args.batch_size * ctx.world + 1" in script
        and 'add_argument("--batch_size", type=int, default=4)' in script
    )
    assert skip_batches(world=2) == {0: 4, 1: 3} and skip_batches(world=3) == {0: 4, 1: 3, 2: 3}
    fig = skipped_collective_picture({0: 4, 1: 3}, save_to=tmp_path / "skip.png")
    shown = [t.get_text() for t in fig.axes[0].texts]
    assert "waits in step 4's all-reduce, which rank 1 never calls" in shown
    assert "waits in the barrier before the save, which rank 0 never reaches" in shown
    assert sum(t.startswith("step ") for t in shown) == 7 and (tmp_path / "skip.png").stat().st_size > 5000
    swapped = [t.get_text() for t in skipped_collective_picture({0: 3, 1: 4}).axes[0].texts]
    assert "waits in step 4's all-reduce, which rank 0 never calls" in swapped
    with pytest.raises(ValueError, match="no rank skips"):
        skipped_collective_picture({0: 3, 1: 3})
