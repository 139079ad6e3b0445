"""Wrong answers to chapter 04's exercise 2 (one optimizer step over K micro-batches under DDP), one per mistake its
checker names; the reference is notebooks/answers/04_pitfalls.py. Used by tests/test_pitfall_exercises.py, and by
accumulation_vs_ddp.py, which runs each under a real 2-rank DDP."""

import contextlib

import torch


def _sync_last(model, i, k):
    return contextlib.nullcontext() if i == k - 1 else model.no_sync()


def no_no_sync(model, optimizer, micro_batches, loss_fn):
    optimizer.zero_grad()
    for x, y in micro_batches:
        (loss_fn(model(x), y) / len(micro_batches)).backward()
    optimizer.step()


def all_in_no_sync(model, optimizer, micro_batches, loss_fn):
    optimizer.zero_grad()
    for x, y in micro_batches:
        with model.no_sync():
            (loss_fn(model(x), y) / len(micro_batches)).backward()
    optimizer.step()


def off_by_one(model, optimizer, micro_batches, loss_fn):  # `last` is never true: no backward syncs
    optimizer.zero_grad()
    for i, (x, y) in enumerate(micro_batches):
        with contextlib.nullcontext() if i == len(micro_batches) else model.no_sync():
            (loss_fn(model(x), y) / len(micro_batches)).backward()
    optimizer.step()


def first_synced(model, optimizer, micro_batches, loss_fn):
    optimizer.zero_grad()
    for i, (x, y) in enumerate(micro_batches):
        with contextlib.nullcontext() if i == 0 else model.no_sync():
            (loss_fn(model(x), y) / len(micro_batches)).backward()
    optimizer.step()


def undivided(model, optimizer, micro_batches, loss_fn):
    optimizer.zero_grad()
    for i, (x, y) in enumerate(micro_batches):
        with _sync_last(model, i, len(micro_batches)):
            loss_fn(model(x), y).backward()
    optimizer.step()


def zero_grad_inside(model, optimizer, micro_batches, loss_fn):
    for i, (x, y) in enumerate(micro_batches):
        optimizer.zero_grad()
        with _sync_last(model, i, len(micro_batches)):
            (loss_fn(model(x), y) / len(micro_batches)).backward()
    optimizer.step()


def no_zero_grad(model, optimizer, micro_batches, loss_fn):
    for i, (x, y) in enumerate(micro_batches):
        with _sync_last(model, i, len(micro_batches)):
            (loss_fn(model(x), y) / len(micro_batches)).backward()
    optimizer.step()


def step_every_micro_batch(model, optimizer, micro_batches, loss_fn):
    optimizer.zero_grad()
    for i, (x, y) in enumerate(micro_batches):
        with _sync_last(model, i, len(micro_batches)):
            (loss_fn(model(x), y) / len(micro_batches)).backward()
        optimizer.step()


def one_big_forward(model, optimizer, micro_batches, loss_fn):
    optimizer.zero_grad()
    x, y = torch.cat([m[0] for m in micro_batches]), torch.cat([m[1] for m in micro_batches])
    loss_fn(model(x), y).backward()
    optimizer.step()


MUTANTS = [
    no_no_sync,
    all_in_no_sync,
    off_by_one,
    first_synced,
    undivided,
    zero_grad_inside,
    no_zero_grad,
    step_every_micro_batch,
    one_big_forward,
]
