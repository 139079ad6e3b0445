"""Chapter 05's exercises: the learner's code, or prediction written before the run, against the reference and what
the run measured. Each grader returns None when the answer holds, else one line naming the mistake it shows
(tests/test_perf_exercises.py gives each mistake a wrong answer of its own).

    exercise_1(allreduce_ms, break_even_mbit, MY_4_NODE_MS, cost, after)   # lines to print: each function's verdict
    grade_break_even(break_even_mbit)                  # exercise 1's second function (the first: grade_allreduce_ms)
    ex2 = straggler_run(plan, 100); straggler_feedback({"added_ms": 100, "part": "forward"}, ex2)  # verdict + why
    ex3 = same_hardware_run(plan, cores); grade_same_hardware(1.2, **ex3.grading)
"""

from __future__ import annotations

from dataclasses import dataclass

from .bench import quiet
from .bench.dialed import Before
from .claims import Claim
from .link import PAYLOAD_SHARE
from .perf_model import grade_allreduce_ms

STRAGGLER_PARTS = ("data", "forward", "backward", "waiting", "transfer", "clip", "optimizer")


STRAGGLER_WHERE = {  # why the fast rank's wait lands in the part that grew most
    "forward": "DDP's forward starts with a collective (the buffers' broadcast from rank 0, broadcast_buffers=True by "
    "default), where the fast rank meets the straggler first",
    "waiting": "the first collective after the sleep is backward's all-reduce",
}


def straggler_feedback(guess: dict | None, run) -> str:
    """Exercise 2's verdict, then, once the learner has predicted, where the run put the wait and why: the answer is
    printed after the prediction, never on the page before it."""
    verdict = grade_straggler(guess, **run.grading)
    if not guess or guess.get("added_ms") is None or guess.get("part") is None:
        return verdict
    grew = run.grading["grew"]
    top = max(grew, key=grew.get)
    why = STRAGGLER_WHERE.get(top, "the part where this run's fast rank met the straggler")
    if verdict and why in verdict:  # the verdict already gave the place and its reason: said once
        return verdict
    return (verdict or "exercise 2: right") + f"\nwhy: the wait grew '{top}' most ({grew[top]:+.1f} ms): {why}"


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
        why = STRAGGLER_WHERE.get(top, f"the run put it in '{top}'")
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


# --------------------------------------------------------------------------- exercise 1: the break-even link

# (single_ms, pair_ms, own_ms, grad_bytes, n, alpha_ms): this chapter's kind of run at 2 and 4 ranks; one where DDP's
# own work and the latency are large (so that leaving either out shows); one where n processes lose on every link
BREAK_EVEN_CASES = [
    (914.0, 350.0, 4.0, 8.0e6, 2, 0.9),
    (914.0, 350.0, 4.0, 8.0e6, 4, 0.9),
    (1000.0, 300.0, 150.0, 4.0e7, 2, 30.0),
    (500.0, 480.0, 10.0, 8.0e6, 2, 20.0),
]


def reference_break_even_mbit(single_ms, pair_ms, own_ms, grad_bytes, n, alpha_ms) -> float | None:
    """What the grader expects: dialed.Before's break-even, the one section 4 predicted its rates from."""
    before = Before(single_ms / 1e3, pair_ms / 1e3, own_ms / 1e3, alpha_ms / 1e3, 1, grad_bytes, large=0, n=n)
    bits = before.break_even_bits()
    return None if bits is None else bits / 1e6


def _break_even_mistakes(single_ms, pair_ms, own_ms, grad_bytes, n, alpha_ms) -> dict:
    """The wrong answers the grader names, on one case: {why: the value that mistake gives}."""
    ring = 2 * (n - 1) / n * grad_bytes

    def mbit(budget_ms, nbytes=ring, share=PAYLOAD_SHARE):
        return 8 * nbytes / (budget_ms / 1e3) / share / 1e6 if budget_ms > 0 else None

    budget = single_ms - pair_ms - own_ms - alpha_ms
    return {
        "the ring factor is wrong: each rank sends 2(n-1)/n of the gradients (1x at n = 2, 1.5x at n = 4)": mbit(
            budget, grad_bytes
        ),
        "each rank sends 2(n-1)/n of the gradients, not 2x: 2x is the limit of many ranks": mbit(
            budget, 2 * grad_bytes
        ),
        "bits and bytes: a link's rate counts bits, 8 to a byte": mbit(budget, ring / 8),
        "the payload share: TCP carries 1448 bytes of payload in each 1514-byte frame, so the link must carry "
        "1514/1448 of the bytes": mbit(budget, share=1.0),
        "the payload share divides the rate, it does not multiply it (the link carries more than the payload)": mbit(
            budget, share=1 / PAYLOAD_SHARE
        ),
        "the compute of n processes is the pair's step (measured with the machine shared), not the 1 process's / n": (
            mbit(single_ms - single_ms / n - own_ms - alpha_ms)
        ),
        "DDP's own work (its hooks, the bucket copies) is part of the step too": mbit(budget + own_ms),
        "the all-reduce pays its latency alpha too, once per all-reduce": mbit(budget + alpha_ms),
        "the units: the answer is in Mbit/s": None if budget <= 0 else 1e6 * mbit(budget),
    }


def grade_break_even(fn) -> str | None:
    """The learner's break_even_mbit(single_ms, pair_ms, own_ms, grad_bytes, n, alpha_ms) on BREAK_EVEN_CASES, each
    within 1% of the reference (the payload share alone moves it by 4.4%): None if every case holds, else one line
    naming the mistake."""
    for case in BREAK_EVEN_CASES:
        want = reference_break_even_mbit(*case)
        try:
            yours = fn(*case)
        except Exception as err:  # noqa: BLE001  (a learner's bug: named, not a traceback)
            return f"exercise 1: break_even_mbit raised {type(err).__name__}: {err}"
        if want is None:
            if yours is not None:
                return (
                    f"exercise 1: break_even_mbit{case} = {yours}, expected None: the 1 process's step is no longer "
                    "than the pair's plus DDP's own work and alpha, so n processes lose on every link"
                )
            continue
        if yours is not None and abs(yours / want - 1) <= 0.01:
            continue
        if yours is None:
            return f"exercise 1: break_even_mbit{case} returned None; n processes win on a fast enough link here"
        why = next(
            (w for w, v in _break_even_mistakes(*case).items() if v is not None and abs(yours / v - 1) <= 0.01),
            "take it apart: what the all-reduce may cost (the 1 process's step less the rest of the DDP step), then "
            "the bits per second that carry each rank's bytes in that time",
        )
        return f"exercise 1: break_even_mbit{case} = {yours:.1f} Mbit/s, expected {want:.1f}: {why}"
    return None


def exercise_1(allreduce_ms, break_even_mbit, four_node_ms, cost, after=None) -> list[Claim]:
    """Exercise 1's verdicts: allreduce_ms against the fits at N = 2 and 4 (grade_allreduce_ms), break_even_mbit on
    its cases (grade_break_even), and the 4 nodes' prediction where the box ran (four_node_claim). A function left as
    its stub (returning None), or MY_4_NODE_MS left None, is 'not attempted yet', not a mistake."""
    out = []
    if allreduce_ms(2**20, 2, 0.0, 1.0) is None:
        out.append(Claim("exercise 1: allreduce_ms not attempted yet (write it above)", False, "not attempted"))
    else:
        sizes = [r["bytes"] for r in cost.rows2[-2:]]
        mistake = grade_allreduce_ms(allreduce_ms, {2: cost.fit, 4: cost.fit4}, sizes)
        out.append(
            Claim(mistake or "exercise 1: allreduce_ms matches the fitted model at N = 2 and at N = 4", not mistake)
        )
    if break_even_mbit(*BREAK_EVEN_CASES[0]) is None:
        out.append(Claim("exercise 1: break_even_mbit not attempted yet (write it above)", False, "not attempted"))
    else:
        mistake = grade_break_even(break_even_mbit)
        out.append(Claim(mistake or "exercise 1: break_even_mbit is right on every case", not mistake))
    if after is None:
        out.append(Claim("exercise 1: MY_4_NODE_MS is not judged here (no box ran)", False, "the box did not run here"))
    elif four_node_ms is None:
        out.append(Claim("exercise 1: MY_4_NODE_MS not attempted yet (fill it in above)", False, "not attempted"))
    else:
        out.append(four_node_claim(four_node_ms, after))
    return out


def four_node_claim(four_node_ms: float, after) -> Claim:
    """The prediction of the 4 nodes' all-reduce holds within 15% (grade_four_nodes). Checked where the box's dialed
    runs ran quiet: the 4 nodes' four ranks share this machine's cores."""
    measured = after.four_node_ms()
    two = 1000 * after.fit.seconds(after.before.grad_bytes)
    verdict = grade_four_nodes(four_node_ms, measured_ms=measured, two_node_ms=two)
    text = (
        verdict or f"exercise 1: {four_node_ms:.0f} ms predicted, the 4 nodes measured {measured:.0f} ms (within 15%)"
    )
    runs = [r["run"] for r in after.rows]
    return Claim(text, verdict is None, None if quiet.all_quiet(runs) else quiet.busy_reason(runs))


# --------------------------------------------------------------------------- exercises 2 and 3: their runs


@dataclass
class StragglerRun:
    sleep_ms: float
    step_ms: float  # a fast rank's step, normally
    added_ms: float  # how much longer it got with the straggler
    grew: dict  # how much each part of it grew (ms)
    drift_ms: float  # the straggler's own forward and backward, between the two runs: the machine, not the sleep
    runs: list

    @property
    def grading(self) -> dict:
        return dict(sleep_ms=self.sleep_ms, added_ms=self.added_ms, grew=self.grew, step_ms=self.step_ms)

    def line(self) -> str:
        return (
            f"rank 0 (fast): {self.step_ms:.1f} ms per step normally, {self.added_ms:+.1f} ms with a "
            f"{self.sleep_ms:g} ms straggler\nits parts grew by "
            + ", ".join(f"{p} {v:+.1f} ms" for p, v in self.grew.items())
        )


def straggler_run(plan, sleep_ms: float = 100) -> StragglerRun:
    """Exercise 2's launch (plan.straggler): plain DDP and DDP with a straggler, side by side in one launch."""
    ex = plan.straggler(sleep_ms)
    normal, slow = ex["ddp_normal"]["ranks"][0], ex["ddp_straggler"]["ranks"][0]  # rank 0 is a FAST rank
    step_ms = 1000 * normal["seconds"] / normal["steps"]
    last_n, last_s = ex["ddp_normal"]["ranks"][-1], ex["ddp_straggler"]["ranks"][-1]
    return StragglerRun(
        sleep_ms,
        step_ms,
        1000 * slow["seconds"] / slow["steps"] - step_ms,
        {p: 1000 * (slow["parts"][p] - normal["parts"][p]) for p in STRAGGLER_PARTS},
        1000 * sum(last_s["parts"][p] - last_n["parts"][p] for p in ("forward", "backward")),
        list(ex.values()),
    )


def straggler_claim(mine: dict, run: StragglerRun) -> Claim:
    """The reference prediction holds (grade_straggler). Checked where the launch ran quiet and the straggler's own
    forward and backward moved under a quarter of the sleep between the two runs: a host that slowed one run moves the
    difference by as much, with no program here to show it."""
    verdict = grade_straggler(mine, **run.grading)
    text = verdict or (
        f"the reference prediction holds: the fast rank's steps got about {run.sleep_ms:g} ms longer "
        f"({run.added_ms:+.1f} ms), in '{mine['part']}': it waits for the straggler at the first collective"
    )
    if not quiet.all_quiet(run.runs):
        why = quiet.busy_reason(run.runs)
    elif abs(run.drift_ms) > 0.25 * run.sleep_ms:
        why = (
            f"the straggler's own compute moved {run.drift_ms:+.1f} ms a step between the two runs: the host moved them"
        )
    else:
        why = None
    return Claim(text, verdict is None, why)


@dataclass
class SameHardwareRun:
    vs_one_core: float
    vs_all_cores: float
    n: int
    cores: int
    runs: list

    @property
    def grading(self) -> dict:
        return dict(vs_one_core=self.vs_one_core, vs_all_cores=self.vs_all_cores, n=self.n)

    def line(self) -> str:
        return (
            f"DDP {self.n} x 1 core against 1 process on 1 core: {self.vs_one_core:.2f}x; against 1 process on "
            f"{self.cores} cores: {self.vs_all_cores:.2f}x"
        )


def same_hardware_run(plan, cores: int) -> SameHardwareRun:
    """Exercise 3's launch (plan.same_hardware): 1 process on one core, on every core, and DDP, side by side."""
    ex = plan.same_hardware(cores)
    vs_one, vs_all = (ex[k]["seconds"] / ex["ddp"]["seconds"] for k in ("one_core", "all_cores"))
    return SameHardwareRun(vs_one, vs_all, plan.n, cores, list(ex.values()))


def same_hardware_claim(run: SameHardwareRun) -> Claim:
    """Against a process that already uses every core, DDP gains less than against one on one core. Checked where the
    launch ran quiet."""
    return Claim(
        f"against a process that already uses every core, DDP gains less ({run.vs_all_cores:.2f}x against "
        f"{run.vs_one_core:.2f}x): the cores were not new hardware",
        run.vs_all_cores < run.vs_one_core,
        None if quiet.all_quiet(run.runs) else quiet.busy_reason(run.runs),
    )
