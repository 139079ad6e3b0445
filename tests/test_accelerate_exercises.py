"""Chapter 09's exercise checkers (distrinews_course.accelerate_exercises): the reference answers pass, and each
mistake a checker claims to catch (one mutant per mistake) is caught with its own one-line reason."""

from __future__ import annotations

import contextlib
import importlib.util
import re
from pathlib import Path

import pytest
import torch.distributed as dist

from distrinews_course.accelerate_exercises import accumulation_test, scalars_test
from distrinews_course.attempt import NotYet, try_exercise

ROOT = Path(__file__).resolve().parent.parent


def _answers():
    spec = importlib.util.spec_from_file_location("answers09", ROOT / "notebooks/answers/09_accelerate_and_tracking.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _step(model, micro_batches, optimizer, loss_fn, *, divide=True, sync="last", zero="once", step="once"):
    """The reference step with one thing changed: the mutants below."""
    if zero == "once":
        optimizer.zero_grad(set_to_none=True)
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        if zero == "each":
            optimizer.zero_grad(set_to_none=True)
        no_sync = {"last": i < k - 1, "never": False, "always": True}[sync]
        with model.no_sync() if no_sync else contextlib.nullcontext():
            loss = loss_fn(model(x), y) / (k if divide else 1)
            loss.backward()
        if step == "each":
            optimizer.step()
    if step == "once":
        optimizer.step()


MUTANTS = {
    "no_division": (dict(divide=False), "4 times too large: divide each micro-batch's loss"),
    "all_reduce_every_micro_batch": (dict(sync="never"), "all-reduced 4 times in one step"),
    "no_sync_on_the_last_too": (dict(sync="always"), "DDP never all-reduced"),
    "zero_between_micro_batches": (dict(zero="each"), "only the last micro-batch's gradients reached the step"),
    "never_zeroed": (dict(zero="never"), "the first step's gradients were still there"),
    "no_step": (dict(step="never"), "the weights did not move"),
    "step_per_micro_batch": (dict(step="each", sync="never"), "stepped 4 times"),
}


def test_the_reference_accumulation_step_passes():
    accumulation_test(_answers().my_accumulation_step)  # raises on a mistake
    assert not dist.is_initialized(), "the checker leaves no process group behind"


@pytest.mark.parametrize("name", list(MUTANTS))
def test_each_accumulation_mistake_is_named(name, capsys):
    changes, reason = MUTANTS[name]

    def my_accumulation_step(model, micro_batches, optimizer, loss_fn):
        _step(model, micro_batches, optimizer, loss_fn, **changes)

    with pytest.raises(AssertionError, match=reason):
        accumulation_test(my_accumulation_step)
    assert not try_exercise(accumulation_test, my_accumulation_step)  # one line, no traceback
    out = capsys.readouterr().out
    assert out.startswith("not yet: ") and reason in out and out.count("\n") == 1, out
    assert not dist.is_initialized()


def test_one_backward_over_all_micro_batches_is_named():
    """The right gradients and one all-reduce, but every micro-batch's activations alive at once."""

    def my_accumulation_step(model, micro_batches, optimizer, loss_fn):
        optimizer.zero_grad(set_to_none=True)
        loss = sum(loss_fn(model(x), y) for x, y in micro_batches) / len(micro_batches)
        loss.backward()
        optimizer.step()

    with pytest.raises(AssertionError, match="activations were all alive at once"):
        accumulation_test(my_accumulation_step)


def test_the_accumulation_stub_is_not_yet_and_a_crash_is_one_line(capsys):
    def my_accumulation_step(model, micro_batches, optimizer, loss_fn):
        raise NotImplementedError

    with pytest.raises(NotYet):
        accumulation_test(my_accumulation_step)

    def crashing(model, micro_batches, optimizer, loss_fn):
        return model(micro_batches)  # a list where a tensor belongs

    assert not try_exercise(accumulation_test, crashing)
    assert "'crashing' raised" in capsys.readouterr().out and not dist.is_initialized()


METRICS = {"epochs": [{"val_accuracy": 0.5, "optimizer_steps": 3}, {"val_accuracy": 0.625, "optimizer_steps": 3}]}
EVENTS = {"val/accuracy": [(3, 0.5), (6, 0.625)], "train/loss_step": [(s, 1.0 / s) for s in range(1, 7)]}


def reads(transform):
    def my_scalars(run_dir, tag):
        return transform(list(EVENTS[tag]), tag)

    return my_scalars


SCALAR_MUTANTS = {
    "right": (lambda pairs, tag: pairs, None),
    "unsorted": (lambda pairs, tag: pairs[::-1], "not in step order"),
    "values_only": (lambda pairs, tag: [v for _, v in pairs], "return a list of (step, value) pairs"),
    "percent": (lambda pairs, tag: [(s, 100 * v) for s, v in pairs], "val/accuracy: expected [0.5, 0.625]"),
    "one_run_only": (lambda pairs, tag: pairs[:3], "expected 6 points, one per optimizer step, got 3"),
}


@pytest.mark.parametrize("name", list(SCALAR_MUTANTS))
def test_each_scalars_mistake_is_named(name):
    transform, reason = SCALAR_MUTANTS[name]
    test = scalars_test("run", METRICS)
    if reason is None:
        test(reads(transform))
    else:
        with pytest.raises(AssertionError, match=re.escape(reason)):
            test(reads(transform))
