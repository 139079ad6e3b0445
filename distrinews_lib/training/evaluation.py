"""Evaluation that is exact under DDP: each rank evaluates its shard and the results are gathered with their
dataset indices, so the examples DistributedSampler repeats count once. The task evaluates (Task.evaluate) and its
result type says how it is reported (epoch line, metrics.csv, tracker, checkpoint); classification's is here.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..checkpoint import unwrap
from ..process_group.collectives import gather_by_index
from .precision import AmpSettings


@dataclass
class ClassifierEval:
    loss: float
    accuracy: float
    n: int  # distinct examples evaluated (the sampler's padding dropped)
    indices: torch.Tensor  # dataset index of each prediction, sorted
    predictions: torch.Tensor
    labels: torch.Tensor

    def metric_line(self) -> str:
        return f"val acc {100 * self.accuracy:.2f}% ({self.n} texts)"

    def row(self) -> dict:
        """metrics.csv's validation columns."""
        accuracy = round(self.accuracy, 6) if self.n else None
        return {"val_loss": round(self.loss, 6), "val_accuracy": accuracy, "val_perplexity": None}

    def figures(self) -> dict:
        """What the experiment tracker plots."""
        return {"val/loss": self.loss, "val/accuracy": self.accuracy}

    def summary(self) -> dict:
        """What the inference checkpoint records about the final model."""
        # metrics.json's 6 decimals, so the checkpoint and the metrics hold the same number for any test size
        return {
            "final_accuracy": round(self.accuracy, 6),
            "final_val_loss": round(self.loss, 6),
            "eval_examples": self.n,
        }


def concat(xs: list, dtype) -> torch.Tensor:
    """One rank's per-batch tensors as one CPU tensor (an empty one of `dtype` for none)."""
    return torch.cat(xs).cpu() if xs else torch.zeros(0, dtype=dtype)


@torch.no_grad()
def evaluate(model, loader, *, device, task, amp: AmpSettings | None = None, gather: bool = True):
    """The task's evaluation of the bare model (task: the run's Task, run.task). Collective, unless gather=False
    (this rank's alone)."""
    bare = unwrap(model)  # no DDP forward: evaluation needs no gradient sync (and no buffer broadcast)
    was_training = bare.training
    bare.eval()
    try:
        return task.evaluate(bare, loader, device, amp, gather)
    finally:
        bare.train(was_training)


def classify(model, loader, device, amp, gather) -> ClassifierEval:
    """Classification's evaluation: loss and accuracy over every example once."""
    idx, preds, labels, losses = [], [], [], []
    for batch in loader:
        batch = {k: v.to(device) for k, v in batch.items()}
        with amp.autocast(device) if amp else contextlib.nullcontext():
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        losses.append(F.cross_entropy(logits.float(), batch["labels"], reduction="none").double())
        preds.append(logits.argmax(-1))
        labels.append(batch["labels"])
        idx.append(batch["index"])
    idx, preds, labels, losses = gather_by_index(
        concat(idx, torch.long),
        concat(preds, torch.long),
        concat(labels, torch.long),
        concat(losses, torch.float64),
        device=device,
        gather=gather,
    )
    n = int(idx.numel())
    acc = float((preds == labels).double().mean()) if n else float("nan")
    return ClassifierEval(float(losses.mean()) if n else float("nan"), acc, n, idx, preds, labels)
