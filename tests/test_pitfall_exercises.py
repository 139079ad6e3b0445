"""Chapter 04's exercise checkers (distrinews_course.pitfall_exercises): the reference answers pass, every wrong answer
is caught and named in one line, and the stand-in DDP that grades exercise 2 all-reduces where a real DDP does."""

import importlib.util
import json

import pytest

from distrinews_course import pitfall_exercises as px
from distrinews_course.attempt import grade
from distrinews_course.launch import torchrun

from .helpers import ROOT
from .workers import accumulation_mutants as mutants

spec = importlib.util.spec_from_file_location("answers_04_test", ROOT / "notebooks" / "answers" / "04_pitfalls.py")
answers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(answers)


def _failed(fn, cases):
    result = grade(fn, cases, quiet=True)
    assert result.attempted
    return result.failed


def test_the_references_pass_every_case():
    assert _failed(answers.exact_accuracy, px.exact_accuracy_cases()) is None
    assert _failed(answers.accumulate_step, px.accumulation_cases()) is None


def test_an_untouched_stub_is_not_attempted_yet():
    def accumulate_step(model, optimizer, micro_batches, loss_fn):
        raise NotImplementedError

    assert not grade(accumulate_step, px.accumulation_cases, quiet=True).attempted


def _votes(per_rank):
    return {i: c for pr in per_rank for i, c in pr}


def _padded(per_rank):
    pairs = [p for pr in per_rank for p in pr]
    return sum(c for _, c in pairs) / len(pairs)


def _mean_of_ranks(per_rank):  # each rank holds as many pairs (the sampler pads): the same number as _padded
    return sum(sum(c for _, c in pr) / len(pr) for pr in per_rank) / len(per_rank)


def _deduped_over_pairs(per_rank):
    return sum(_votes(per_rank).values()) / sum(len(pr) for pr in per_rank)


def _percent(per_rank):
    return 100 * answers.exact_accuracy(per_rank)


def _drop_each_ranks_last(per_rank):
    kept = [p for pr in per_rank for p in pr[:-1]]
    return sum(c for _, c in kept) / len(kept)


def _none(per_rank):
    return None


@pytest.mark.parametrize(
    "fn, words",
    [
        (_padded, "padded duplicates were counted"),
        (_mean_of_ranks, "padded duplicates were counted"),
        (_deduped_over_pairs, "divided by the 10 pairs"),
        (_percent, "is a percentage"),
        (_drop_each_ranks_last, "every rank's last pair was dropped"),
        (_none, "returned None"),
    ],
    ids=lambda x: getattr(x, "__name__", "")[:30],
)
def test_exact_accuracy_mutants_each_named(fn, words):
    failed = _failed(fn, px.exact_accuracy_cases())
    assert failed and words in failed, failed
    assert "\n" not in failed


@pytest.mark.parametrize(
    "fn, words",
    [
        (mutants.no_no_sync, "all 4 backwards all-reduced"),
        (mutants.all_in_no_sync, "no backward ran outside model.no_sync()"),
        (mutants.off_by_one, "no backward ran outside model.no_sync()"),
        (mutants.first_synced, "was micro-batch 1 of 4, not the last"),
        (mutants.undivided, "4x too large"),
        (mutants.zero_grad_inside, "zero_grad() inside the loop"),
        (mutants.no_zero_grad, "leftover gradients"),
        (mutants.step_every_micro_batch, "optimizer.step() ran 4 times"),
        (mutants.one_big_forward, "1 forward pass(es) for 4 micro-batches"),
    ],
    ids=lambda x: getattr(x, "__name__", ""),
)
def test_accumulation_mutants_each_named(fn, words):
    failed = _failed(fn, px.accumulation_cases())
    assert failed and words in failed, failed
    assert "\n" not in failed


def test_the_batchnorm_prediction_names_each_mistake():
    small = {"broken": {"mean_diff_to_global": 0.245}, "fixed": {"mean_diff_to_global": 2e-7}}
    big = {"broken": {"mean_diff_to_global": 0.05}, "fixed": {"mean_diff_to_global": 3e-7}}
    right = {"closer_or_further": "closer", "sync_within_rounding": True}
    assert px.batchnorm_prediction(right, small, big) is None
    assert px.batchnorm_prediction({**right, "closer_or_further": "Closer "}, small, big) is None
    assert "a mean over 64 samples varies less" in px.batchnorm_prediction(
        {**right, "closer_or_further": "further"}, small, big
    )
    wrong = px.batchnorm_prediction({**right, "sync_within_rounding": False}, small, big)
    assert "it stays equal within float rounding (max difference 3.0e-07)" in wrong
    unsynced = {"broken": {"mean_diff_to_global": 0.05}, "fixed": {"mean_diff_to_global": 2e-3}}  # a sync that failed
    assert "ended 2.0e-03 from the global batch's" in px.batchnorm_prediction(right, small, unsynced)
    assert "write 'closer' or 'further'" in px.batchnorm_prediction({**right, "closer_or_further": "less"}, small, big)
    assert "fill in" in px.batchnorm_prediction({"closer_or_further": None, "sync_within_rounding": None}, small, big)
    assert "went further" in px.batchnorm_prediction(  # a run that went the other way is graded by the run
        {**right}, big, small
    )


def test_the_accumulation_prediction_names_each_mistake():
    r8 = {"broken": {"allreduce_per_step": 16.0}, "fixed": {"allreduce_per_step": 2.0}}
    assert px.accumulation_prediction({"without": 16, "with": 2}, r8, 2) is None
    assert "you counted backwards, not all-reduces" in px.accumulation_prediction({"without": 8, "with": 1}, r8, 2)
    assert "still all-reduces" in px.accumulation_prediction({"without": 16, "with": 0}, r8, 2)
    assert "but the run made 16" in px.accumulation_prediction({"without": 32, "with": 4}, r8, 2)
    assert "fill in" in px.accumulation_prediction({"without": None, "with": 2}, r8, 2)


def test_the_even_size_prediction_names_the_mistake():
    exact = {"broken": {"accuracy": 0.5}, "truth_accuracy": 0.5}
    assert px.even_size_prediction(False, exact) is None
    assert "needs no padding" in px.even_size_prediction(True, exact)
    assert "fill in" in px.even_size_prediction(None, exact)
    assert px.even_size_prediction(True, {"broken": {"accuracy": 0.6}, "truth_accuracy": 0.5}) is None


@pytest.mark.slow
def test_the_stand_in_ddp_syncs_where_a_real_ddp_does(tmp_path):
    """Exercise 2's checker grades with a stand-in DDP; two real gloo ranks run the reference and every mutant under
    DDP with a counting communication hook: the same backwards all-reduce, and the same optimizer steps."""
    out = tmp_path / "real.json"
    torchrun(ROOT / "tests" / "workers" / "accumulation_vs_ddp.py", 2, [out], timeout=180, echo=False)
    real = json.loads(out.read_text())
    assert len(real) == 2 * (1 + len(mutants.MUTANTS))
    for fn in [answers.accumulate_step, *mutants.MUTANTS]:
        for k in (4, 1):
            model, optimizer, batches, loss_fn = px._accumulation_case(k, 0)[1]
            fn(model, optimizer, batches, loss_fn)
            stand_in = {"synced": model.synced, "steps": optimizer.steps}
            assert stand_in == real[f"{fn.__name__}/{k}"], fn.__name__
    assert real["accumulate_step/4"] == {"synced": [False, False, False, True], "steps": 1}
    assert real["no_no_sync/4"]["synced"] == [True] * 4 and not any(real["all_in_no_sync/4"]["synced"])
