"""Chapter 05's exercises 2 and 3 (distrinews_course/perf_exercises.py): the reference prediction holds, a blank one
is 'not attempted yet', and every mistake the graders claim to name is named on a wrong answer (a mutant) of its own."""

from types import SimpleNamespace

import pytest

from distrinews_course import perf_exercises as px

# One measured straggler run (the fast rank's figures, ms): the sleep lands in forward, at the buffers' broadcast.
STRAGGLER = dict(sleep_ms=20.0, added_ms=20.6, grew={"forward": 19.8, "waiting": 0.4, "backward": 0.3}, step_ms=75.0)


def test_straggler_reference_and_blank():
    assert px.grade_straggler({"added_ms": 20, "part": "forward"}, **STRAGGLER) is None
    assert "not attempted yet" in px.grade_straggler({"added_ms": None, "part": None}, **STRAGGLER)
    assert "not attempted yet" in px.grade_straggler(None, **STRAGGLER)


def test_straggler_feedback_gives_the_reason_only_after_a_prediction():
    run = SimpleNamespace(grading=STRAGGLER)
    right = px.straggler_feedback({"added_ms": 20, "part": "forward"}, run)
    assert right.startswith("exercise 2: right\nwhy: the wait grew 'forward' most (+19.8 ms)")
    assert "the buffers' broadcast from rank 0" in right
    wrong = px.straggler_feedback({"added_ms": 20, "part": "waiting"}, run)
    assert "the place is not" in wrong and "'forward' +19.8 ms" in wrong
    assert wrong.count("the buffers' broadcast") == 1  # the reason is said once, not again on a 'why:' line
    blank = px.straggler_feedback({"added_ms": None, "part": None}, run)
    assert "not attempted yet" in blank and "broadcast" not in blank  # no answer before a prediction
    # a run whose wait landed in 'waiting' gets that reason, not the buffers' broadcast
    late = SimpleNamespace(grading=dict(STRAGGLER, grew={"forward": 0.3, "waiting": 19.8}))
    said = px.straggler_feedback({"added_ms": 20, "part": "waiting"}, late)
    assert "backward's all-reduce" in said and "broadcast" not in said


@pytest.mark.parametrize(
    "guess, words",
    [
        ({"added_ms": 0, "part": "forward"}, "cannot run ahead"),  # the fast rank unaffected
        ({"added_ms": 40, "part": "forward"}, "once a step, not twice"),  # the sleep counted twice
        ({"added_ms": 10, "part": "forward"}, "not the average of the ranks"),  # averaged over the ranks
        ({"added_ms": 70, "part": "forward"}, "grows by about the straggler's sleep"),  # far off, no known mistake
        ({"added_ms": 20, "part": "waiting"}, "the place is not: 'waiting'"),  # the right time, the wrong part
        ({"added_ms": 20, "part": "idle"}, "not one of the breakdown's parts"),  # a part that does not exist
    ],
)
def test_straggler_mutants_each_named(guess, words):
    verdict = px.grade_straggler(guess, **STRAGGLER)
    assert verdict is not None and words in verdict and "\n" not in verdict


def test_straggler_tolerance_follows_the_step():
    # a slow machine's step is noisier: the same guess, 9 ms off, holds at a 300 ms step and not at a 40 ms one
    slow = {**STRAGGLER, "added_ms": 29.0, "step_ms": 300.0}
    assert px.grade_straggler({"added_ms": 20, "part": "forward"}, **slow) is None
    fast = {**STRAGGLER, "added_ms": 31.0, "step_ms": 10.0}
    assert px.grade_straggler({"added_ms": 20, "part": "forward"}, **fast) is not None


SAME = dict(vs_one_core=1.70, vs_all_cores=1.20, n=2)


def test_same_hardware_reference_and_blank():
    assert px.grade_same_hardware(1.25, **SAME) is None
    assert "not attempted yet" in px.grade_same_hardware(None, **SAME)


@pytest.mark.parametrize(
    "guess, words",
    [
        (1.7, "speedup over 1 process on 1 core"),  # the threads ignored
        (2.0, "leave the other cores idle"),  # the ideal N
        (0.8, "too low"),
        (1.5, "too high"),
    ],
)
def test_same_hardware_mutants_each_named(guess, words):
    verdict = px.grade_same_hardware(guess, **SAME)
    assert verdict is not None and words in verdict and "\n" not in verdict


FOUR = dict(measured_ms=270.0, two_node_ms=180.0)  # 8 MiB over 400 Mbit links: 4 nodes 1.5x the 2 nodes' time


def test_four_nodes_reference_and_blank():
    assert px.grade_four_nodes(262.0, **FOUR) is None
    assert "no prediction yet" in px.grade_four_nodes(None, **FOUR)


@pytest.mark.parametrize(
    "guess, words",
    [
        (180.0, "about its time on 2 nodes"),  # the ring's factor left out
        (360.0, "2x is the limit of many ranks"),  # 2x the message instead of 2(N-1)/N
        (270.0 * 8, "bits and bytes"),
        (270.0 / 8, "bits and bytes"),
        (0.27, "the units"),
        (100.0, "alpha once"),
    ],
)
def test_four_nodes_mutants_each_named(guess, words):
    verdict = px.grade_four_nodes(guess, **FOUR)
    assert verdict is not None and words in verdict and "\n" not in verdict


# Exercise 1's second function: the link below which n processes lose to one. The reference, then one wrong answer
# per mistake the grader names (each a whole function, as a learner would write it).
PAYLOAD = 1448 / 1514


def reference(single_ms, pair_ms, own_ms, grad_bytes, n, alpha_ms):
    budget = single_ms - pair_ms - own_ms - alpha_ms
    if budget <= 0:
        return None
    return 8 * 2 * (n - 1) / n * grad_bytes / (budget / 1000) / PAYLOAD / 1e6


def mutant(*, ring=True, factor=None, bits=8, share=PAYLOAD, ideal=False, own=True, alpha=True, none=True, unit=1e6):
    def fn(single_ms, pair_ms, own_ms, grad_bytes, n, alpha_ms):
        compute = single_ms / n if ideal else pair_ms
        budget = single_ms - compute - (own_ms if own else 0) - (alpha_ms if alpha else 0)
        if budget <= 0 and none:
            return None
        sent = (factor if factor else 2 * (n - 1) / n if ring else 1) * grad_bytes
        return bits * sent / (budget / 1000) / share / unit

    return fn


def test_break_even_reference_and_blank():
    assert px.grade_break_even(reference) is None
    assert px.reference_break_even_mbit(*px.BREAK_EVEN_CASES[-1]) is None  # a case where DDP never pays
    blank = px.exercise_1(lambda *a: None, lambda *a: None, None, cost=None, after=object())
    assert [c.unchecked for c in blank] == ["not attempted"] * 3  # MY_4_NODE_MS left None says so too
    assert all("not attempted yet" in c.text for c in blank)
    no_box = px.exercise_1(lambda *a: None, lambda *a: None, 120.0, cost=None)
    assert no_box[-1].unchecked == "the box did not run here" and "MY_4_NODE_MS" in no_box[-1].text


@pytest.mark.parametrize(
    "fn, words",
    [
        (mutant(ring=False), "the ring factor is wrong"),  # shows at n = 4 only
        (mutant(factor=2), "not 2x: 2x is the limit of many ranks"),
        (mutant(bits=1), "bits and bytes"),
        (mutant(share=1.0), "the payload share: TCP carries 1448 bytes"),
        (mutant(share=1 / PAYLOAD), "divides the rate, it does not multiply it"),
        (mutant(ideal=True), "the pair's step (measured with the machine shared), not the 1 process's / n"),
        (mutant(own=False), "DDP's own work"),
        (mutant(alpha=False), "its latency alpha"),
        (mutant(none=False), "expected None"),
        (mutant(unit=1), "the units: the answer is in Mbit/s"),
        (lambda *a: 1 / 0, "raised ZeroDivisionError"),
        (lambda *a: 123.0, "take it apart"),  # wrong, and like no mistake the grader knows
    ],
)
def test_break_even_mutants_each_named(fn, words):
    verdict = px.grade_break_even(fn)
    assert verdict is not None and words in verdict and "\n" not in verdict, verdict
