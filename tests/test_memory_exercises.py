"""Chapter 06's exercise checker (distrinews_course.memory_exercises): the reference partition passes every case,
and each wrong answer the checker claims to catch (a mutant per mistake) is caught with its own one-line reason."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from distrinews_course.attempt import grade
from distrinews_course.memory_exercises import SMALL_CASE, zero1_partition_cases, zero1_totals
from distrinews_lib.data.texts import AG_NEWS_LABELS
from distrinews_lib.models.build import build_model
from distrinews_lib.training.config import RunConfig

ROOT = Path(__file__).resolve().parent.parent


def _answer():
    spec = importlib.util.spec_from_file_location("answers06", ROOT / "notebooks/answers/06_memory_and_sharding.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.my_zero1_partition


@pytest.fixture(scope="module")
def cases():
    """The chapter's cases: the tiny model's tensors, and each rank's optimizer state from a real 2-rank launch."""
    model = build_model(RunConfig(model="tiny", seed=0), AG_NEWS_LABELS)[0]
    named = {n: p.numel() for n, p in model.named_parameters()}
    launch = json.loads((ROOT / "tests/data/memory_world2.json").read_text())
    state = [x["optimizer_state"] for x in launch["results"]["zero1"]["per_rank"]]
    return zero1_partition_cases(named, 2, state)


def _greedy(named, world, order, pick):
    owned, load = [[] for _ in range(world)], [0] * world
    for name, n in order(named):
        r = pick(load)
        owned[r].append(name)
        load[r] += n
    return owned


def _largest_first(named):
    return sorted(named.items(), key=lambda kv: kv[1], reverse=True)


def _first_min(load):
    return load.index(min(load))


def in_given_order(named, world):
    return _greedy(named, world, lambda d: list(d.items()), _first_min)


def smallest_first(named, world):
    return _greedy(named, world, lambda d: sorted(d.items(), key=lambda kv: kv[1]), _first_min)


def dealt_in_turn(named, world):
    owned = [[] for _ in range(world)]
    for i, (name, _) in enumerate(_largest_first(named)):
        owned[i % world].append(name)
    return owned


def to_the_fullest(named, world):
    return _greedy(named, world, _largest_first, lambda load: load.index(max(load)))


def ties_to_the_last(named, world):
    return _greedy(named, world, _largest_first, lambda load: len(load) - 1 - load[::-1].index(min(load)))


def counts_not_names(named, world):
    return [sum(named.values()) / world] * world  # ZeRO's idea without its whole tensors, as numbers


def forgets_a_tensor(named, world):
    owned = _greedy(named, world, _largest_first, _first_min)
    owned[-1] = owned[-1][:-1]
    return owned


def gives_one_twice(named, world):
    owned = _greedy(named, world, _largest_first, _first_min)
    owned[1].append(owned[0][0])
    return owned


def ddp_prefixed_names(named, world):
    return [[f"module.{n}" for n in ns] for ns in _greedy(named, world, _largest_first, _first_min)]  # DDP's names


def crashes(named, world):
    return sorted(named)[world]  # a string, where a list of lists belongs


MUTANTS = [
    (in_given_order, "in the order given; sort them largest first"),
    (smallest_first, "you sorted smallest first"),
    (dealt_in_turn, "you dealt the tensors out in turn"),
    (to_the_fullest, "to the rank holding the most parameters"),
    (ties_to_the_last, "on a tie you chose the last"),
    (counts_not_names, "return each rank's list of tensor names, not how many"),
    (forgets_a_tensor, "went to no rank: every tensor goes, whole, to exactly one rank"),
    (gives_one_twice, "went to 2 ranks: every tensor goes, whole, to exactly one rank"),
    (crashes, "return a list of 2 lists"),
    (ddp_prefixed_names, "is not a tensor of the model; use the names of named_sizes"),
]


def test_the_reference_passes_every_case(cases):
    result = grade(_answer(), cases, quiet=True)
    assert result.ok, result.failed
    assert zero1_totals(list(SMALL_CASE.values()), 2) == [12, 14]


@pytest.mark.parametrize("mutant,reason", MUTANTS, ids=[m.__name__ for m, _ in MUTANTS])
def test_each_mistake_is_named_in_one_line(cases, mutant, reason):
    result = grade(mutant, cases, quiet=True)
    assert not result.ok and reason in result.failed and "\n" not in result.failed, result.failed


def test_a_partition_that_misses_the_measured_state_is_refused(cases):
    """Right on the small case, wrong on the model in a way no named mistake explains: the second case compares with
    what each rank measured and says so, rank by rank."""
    small, model_case = cases

    def moves_a_tensor(named, world):
        owned = _greedy(named, world, _largest_first, _first_min)
        if named != SMALL_CASE:
            owned[0].append(owned[1].pop(0))  # the largest tensor of rank 1 to rank 0
        return owned

    result = grade(moves_a_tensor, cases, quiet=True)
    assert not result.ok and result.failed.startswith(f"case '{model_case[0]}'") and "(rank order)" in result.failed


def test_the_stub_is_not_attempted_yet(cases):
    def my_zero1_partition(named_sizes, world):
        raise NotImplementedError

    result = grade(my_zero1_partition, cases, quiet=True)
    assert not result.attempted and not result.ok


# ------------------------------------------------------------------ exercise 2: graded against the MEASURED peak


def _launch():
    from distrinews_course.memory_runs import Launch

    return Launch(json.loads((ROOT / "tests/data/memory_world1.json").read_text()))


LONG = ("ddp@64x128", "ddp@64x128+ckpt")  # the recorded launch's long runs: activations set both peaks


def test_a_prediction_near_the_measured_peak_is_right_and_says_what_set_it():
    from distrinews_course.memory_exercises import judge_measured_peak

    run = _launch()
    for name in LONG:
        ok, why = judge_measured_peak(run.peak(name), run, name)
        assert ok and f"the {run.peak(name):.1f} MiB measured" in why and "the activations set it" in why, why
    ok, why = judge_measured_peak(run.peak("ddp@8x64"), run, "ddp@8x64")
    assert ok and "the optimizer step set it" in why, why


def test_the_grade_is_the_runs_not_the_calculators():
    import copy

    from distrinews_course.memory_exercises import judge_measured_peak

    run = _launch()
    calc = run.predicted(LONG[0]).peak_mb
    assert judge_measured_peak(calc, run, LONG[0])[0]  # the calculator is within 15% of this run
    moved = copy.deepcopy(run)  # a run that peaked 30% above: the calculator's figure is now wrong
    for x in moved.results[LONG[0]]["per_rank"]:
        x["peak_rss_above_start_mb"] *= 1.3
    ok, why = judge_measured_peak(calc, moved, LONG[0])
    assert not ok and why.startswith(f"{calc / moved.peak(LONG[0]) - 1:+.0%} from the") and "did not bear out" in why


@pytest.mark.parametrize(
    "slip, words",
    [
        (lambda run, n: run.predicted(n).peak_mb - run.runtime_mb, "you left out the runtime"),
        (lambda run, n: 1.5 * run.peak(n), "above the calculator"),
        (lambda run, n: "150", "write a positive number of MiB"),
    ],
)
def test_each_slip_is_named_against_the_measured_peak(slip, words):
    from distrinews_course.memory_exercises import judge_measured_peak

    run = _launch()
    ok, why = judge_measured_peak(slip(run, LONG[0]), run, LONG[0])
    assert not ok and words in why, why


def test_recomputation_counted_as_every_layer_is_named():
    from distrinews_course import memory as M
    from distrinews_course.memory_exercises import judge_measured_peak

    run = _launch()
    full = M.estimate(
        "tiny", 64, 128, overhead_mb=run.runtime_mb
    ).peak_mb  # no recomputation: every layer's activations
    ok, why = judge_measured_peak(full, run, LONG[1])
    assert not ok and "you counted every layer's activations" in why, why


def test_the_setter_follows_the_measured_peak():
    import copy

    from distrinews_course.memory_exercises import peak_setter

    run = _launch()
    assert peak_setter(run, LONG[0]).endswith("the activations set it")
    flat = copy.deepcopy(run)  # a long run whose peak rose only by the optimizer step's share: then it set the peak
    at_rest = sum(flat.fullest(LONG[0])[k] for k in ("params", "grads", "optimizer_state")) / 2**20
    for x in flat.results[LONG[0]]["per_rank"]:
        x["peak_rss_above_start_mb"] = at_rest + run.runtime_mb + run.predicted(LONG[0]).parts_mb["AdamW temporaries"]
    assert peak_setter(flat, LONG[0]).endswith("the optimizer step set it")
