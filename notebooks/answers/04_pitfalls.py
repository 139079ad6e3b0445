"""Chapter 04's reference answers (read only by its solution cells; see README.md here)."""

import contextlib


def exact_accuracy(per_rank):
    """per_rank[r]: the (dataset index, correct) pairs rank r evaluated, padding included. Each sample counts once."""
    votes = {index: correct for pairs in per_rank for index, correct in pairs}  # a padded duplicate overwrites itself
    return sum(votes.values()) / len(votes)


def accumulate_step(model, optimizer, micro_batches, loss_fn):
    """One optimizer step over the micro-batches, all-reducing once (pitfall 8's fix)."""
    optimizer.zero_grad()  # the previous step may have left gradients behind
    for i, (x, y) in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with contextlib.nullcontext() if last else model.no_sync():  # only the last backward all-reduces
            loss = loss_fn(model(x), y) / len(micro_batches)  # the mean over the step's samples, not K times it
            loss.backward()
    optimizer.step()


# Exercises 3-5: the predictions, before the runs.
MY_BATCHNORM = {"closer_or_further": "closer", "sync_within_rounding": True}  # 64 vary less; sums in another order
MY_ALLREDUCES = {"without": 16, "with": 2}  # a backward all-reduces each of its 2 buckets (DDP's first one is 1 MiB)
MY_EVEN_SIZE_STILL_WRONG = False  # a size that divides by the ranks needs no padding: nothing counted twice
