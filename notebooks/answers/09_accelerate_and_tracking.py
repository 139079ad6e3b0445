"""Chapter 09's reference answers (read only by its solution cells; see README.md here)."""

import contextlib
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def my_scalars(run_dir, tag):
    """[(step, value), ...] for `tag` from the TensorBoard event files under run_dir / "tensorboard"."""
    events = EventAccumulator(str(Path(run_dir) / "tensorboard"))
    events.Reload()
    return sorted((e.step, e.value) for e in events.Scalars(tag))


def my_accumulation_step(model, micro_batches, optimizer, loss_fn):
    """One optimizer step from several micro-batches on a DDP model, as accelerator.accumulate and
    accelerator.backward do it: one all-reduce per step, each micro-batch's loss divided by their number."""
    optimizer.zero_grad(set_to_none=True)
    for i, (inputs, labels) in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with contextlib.nullcontext() if last else model.no_sync():  # DDP all-reduces only on the last backward
            loss = loss_fn(model(inputs), labels) / len(micro_batches)
            loss.backward()
    optimizer.step()
