"""Evaluation that is exact under DDP: each rank evaluates its shard and the results are gathered with their
dataset indices, so the examples DistributedSampler repeats count once. Each task's result type says how it is
reported (epoch line, metrics.csv, tracker, checkpoint).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import distributed as D
from ..models.lm import token_losses
from .checkpoint import unwrap
from .precision import AmpSettings


@dataclass
class ClassifierEval:
    loss: float
    accuracy: float
    n: int                  # distinct examples evaluated (the sampler's padding dropped)
    indices: torch.Tensor   # dataset index of each prediction, sorted
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
        return {"final_accuracy": self.accuracy, "final_val_loss": self.loss, "eval_examples": self.n}


@dataclass
class LMEval:
    loss: float          # mean loss per predicted token, over the whole validation set
    perplexity: float    # exp(loss)
    tokens: int          # predicted tokens counted (duplicates from the sampler's padding dropped)
    n: int               # blocks evaluated

    def metric_line(self) -> str:
        return f"val perplexity {self.perplexity:.1f} ({self.n} blocks)"

    def row(self) -> dict:
        return {"val_loss": round(self.loss, 6), "val_accuracy": None, "val_perplexity": round(self.perplexity, 4)}

    def figures(self) -> dict:
        return {"val/loss": self.loss, "val/perplexity": self.perplexity}

    def summary(self) -> dict:
        return {"final_perplexity": self.perplexity, "final_val_loss": self.loss, "eval_examples": self.n}


def _cat(xs: list, dtype) -> torch.Tensor:
    return torch.cat(xs).cpu() if xs else torch.zeros(0, dtype=dtype)


@torch.no_grad()
def evaluate(model, loader, *, device, amp: AmpSettings | None = None, task: str = "classify", gather: bool = True):
    """ClassifierEval, or LMEval for --task clm/mlm. Collective, unless gather=False (this rank's alone)."""
    bare = unwrap(model)  # no DDP forward: evaluation needs no gradient sync (and no buffer broadcast)
    was_training = bare.training
    bare.eval()
    try:
        if task == "classify":
            return _classifier(bare, loader, device, amp, gather)
        return _language_model(bare, loader, device, amp, task, gather)
    finally:
        bare.train(was_training)


def _classifier(model, loader, device, amp, gather) -> ClassifierEval:
    idx, preds, labels, losses = [], [], [], []
    for batch in loader:
        batch = {k: v.to(device) for k, v in batch.items()}
        with (amp.autocast(device) if amp else contextlib.nullcontext()):
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        losses.append(F.cross_entropy(logits.float(), batch["labels"], reduction="none").double())
        preds.append(logits.argmax(-1))
        labels.append(batch["labels"])
        idx.append(batch["index"])
    idx, preds, labels, losses = D.gather_by_index(_cat(idx, torch.long), _cat(preds, torch.long), _cat(labels, torch.long),
                                                   _cat(losses, torch.float64), device=device, gather=gather)
    n = int(idx.numel())
    acc = float((preds == labels).double().mean()) if n else float("nan")
    return ClassifierEval(float(losses.mean()) if n else float("nan"), acc, n, idx, preds, labels)


def _language_model(model, loader, device, amp, task, gather) -> LMEval:
    idx, sums, counts = [], [], []
    for batch in loader:
        batch = {k: v.to(device) for k, v in batch.items()}
        with (amp.autocast(device) if amp else contextlib.nullcontext()):
            s, c = token_losses(model, batch, task)
        idx.append(batch["index"])
        sums.append(s)
        counts.append(c)
    idx, sums, counts = D.gather_by_index(_cat(idx, torch.long), _cat(sums, torch.float64), _cat(counts, torch.long),
                                          device=device, gather=gather)
    tokens = int(counts.sum())
    loss = float(sums.sum()) / max(tokens, 1)
    return LMEval(loss, math.exp(min(loss, 50.0)), tokens, int(idx.numel()))
