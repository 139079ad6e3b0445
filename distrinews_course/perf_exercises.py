"""Chapter 05's exercises 2 and 3: the learner's prediction, written before the run, against what the run measured.
Each grader returns None when the prediction holds, else one line naming the mistake it shows
(tests/test_perf_exercises.py gives each mistake a wrong answer of its own). Exercise 1's grader is
perf_model.grade_allreduce_ms.

    grade_straggler({"added_ms": 20, "part": "forward"}, sleep_ms=20, added_ms=20.6, grew={...}, step_ms=75.0)
    grade_same_hardware(1.2, vs_one_core=1.9, vs_all_cores=1.15, n=2)
"""

from __future__ import annotations

STRAGGLER_PARTS = ("data", "forward", "backward", "waiting", "transfer", "clip", "optimizer")


def straggler_tolerance_ms(sleep_ms: float, step_ms: float) -> float:
    """How far a guess of the fast rank's added time may be off: a quarter of the sleep, and a twentieth of the step
    (its noise from run to run)."""
    return 0.25 * sleep_ms + 0.05 * step_ms


def grade_straggler(guess: dict | None, *, sleep_ms: float, added_ms: float, grew: dict, step_ms: float) -> str | None:
    """guess: {"added_ms": how much longer the FAST rank's step gets, "part": where its breakdown puts the time}.
    grew: how much each part of the fast rank's step grew (ms). None: the guess holds."""
    if not guess or guess.get("added_ms") is None or guess.get("part") is None:
        return "exercise 2: not attempted yet (fill in MY_STRAGGLER above, then run this cell)"
    ms, where = float(guess["added_ms"]), str(guess["part"])
    if where not in STRAGGLER_PARTS:
        return f"exercise 2: part {where!r} is not one of the breakdown's parts: {', '.join(STRAGGLER_PARTS)}"
    tol = straggler_tolerance_ms(sleep_ms, step_ms)
    if abs(ms - added_ms) > tol:
        if ms < 0.25 * sleep_ms:
            why = "the fast rank cannot run ahead: every collective waits for the slowest rank, so it waits too"
        elif abs(ms - 2 * sleep_ms) <= tol:
            why = "only the last rank sleeps, once per step: the fast rank waits for it once a step, not twice"
        elif abs(ms - sleep_ms / 2) <= 0.25 * sleep_ms:
            why = "not the average of the ranks: DDP's ranks move together, at the slowest rank's pace"
        else:
            why = f"the fast rank's step grows by about the straggler's sleep ({sleep_ms:g} ms a step)"
        return f"exercise 2: you predicted +{ms:.1f} ms, the fast rank measured {added_ms:+.1f} ms: {why}"
    top = max(grew, key=grew.get)
    if where != top:
        why = {
            "forward": "DDP's forward starts with a collective (the buffers' broadcast), where the fast rank meets the "
            "straggler first",
            "waiting": "the first collective after the sleep is backward's all-reduce",
        }.get(top, f"the run put it in '{top}'")
        return (
            f"exercise 2: the time is right, the place is not: '{where}' grew {grew.get(where, 0.0):+.1f} ms, "
            f"'{top}' {grew[top]:+.1f} ms: {why}"
        )
    return None


def grade_same_hardware(guess: float | None, *, vs_one_core: float, vs_all_cores: float, n: int) -> str | None:
    """guess: DDP's speedup (n processes of one core) over ONE process given every core (--threads). None: it holds
    (within 15% of the measurement)."""
    if guess is None:
        return "exercise 3: not attempted yet (fill in MY_SPEEDUP_VS_ALL_CORES above, then run this cell)"
    g = float(guess)
    if abs(g / vs_all_cores - 1) <= 0.15:
        return None
    if g >= 0.975 * n:
        why = f"{n}x would need the single process to leave the other cores idle; with --threads it does not"
    elif abs(g / vs_one_core - 1) <= 0.1:
        why = (
            f"that is the speedup over 1 process on 1 core ({vs_one_core:.2f}x); given every core, the single "
            "process is faster, so DDP gains less against it"
        )
    elif g < vs_all_cores:
        why = "too low: the threads of one process share its work less well than separate processes do"
    else:
        why = "too high: the single process's threads use the same cores DDP's processes use"
    return f"exercise 3: you predicted {g:.2f}x, measured {vs_all_cores:.2f}x: {why}"


def grade_four_nodes(guess_ms: float | None, *, measured_ms: float, two_node_ms: float) -> str | None:
    """Exercise 1's prediction: the all-reduce of the model's gradients on the box's 4 nodes (ms), against the time the
    box measured (not printed on the page) and the same message's time on 2 nodes. None: within 15%."""
    if guess_ms is None:
        return "exercise 1: no prediction yet (fill in MY_4_NODE_MS above)"
    g = float(guess_ms)
    if abs(g / measured_ms - 1) <= 0.15:
        return None
    close = lambda x: abs(g / x - 1) <= 0.1  # noqa: E731
    if close(two_node_ms):
        why = "that is about its time on 2 nodes: with 4, each rank sends 2(N-1)/N = 1.5x the message, not 1x"
    elif close(2 * two_node_ms):
        why = "each rank sends 2(N-1)/N of the message, 1.5x at 4 ranks: 2x is the limit of many ranks"
    elif any(close(measured_ms * k) for k in (8, 1 / 8)):
        why = "bits and bytes: the link's rate is in bits per second, 8 bits to a byte"
    elif any(close(measured_ms * k) for k in (1e3, 1e-3)):
        why = "the units: the answer is in milliseconds"
    else:
        why = "alpha once, plus what each rank sends over its own link's rate"
    return f"exercise 1: you predicted {g:.1f} ms, the 4 nodes measured {measured_ms:.1f} ms: {why}"
