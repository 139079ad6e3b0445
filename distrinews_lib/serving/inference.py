"""Inference from a checkpoint: the function that turns texts into class probabilities, the same for a notebook, a
test and the server; the check that a checkpoint answers at all (finite probabilities over its labels); and the
classifier the server's batcher calls. A notebook loads and predicts from here alone (load_checkpoint, predict_proba);
the checkpoint is rebuilt from its file in rebuild.py.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import torch

from ..checkpoint import CheckpointError, read_checkpoint  # noqa: F401  (for a notebook: read_checkpoint, errors)
from ..data.tokenization import encode_texts
from .rebuild import LoadedCheckpoint, load_checkpoint  # noqa: F401  (for a notebook: load, then predict_proba)
from .schemas import CheckpointInfo


def model_accepts_token_type_ids(model) -> bool:
    return "token_type_ids" in inspect.signature(model.forward).parameters


@torch.inference_mode()
def predict_proba(loaded: LoadedCheckpoint, texts: list[str], batch_size: int = 64) -> torch.Tensor:
    """Class probabilities (N x C) for raw texts, the same way the server computes them."""
    device = next(loaded.model.parameters()).device
    keep_tt = model_accepts_token_type_ids(loaded.model)
    out = []
    # The hash tokenizer (it has cut_texts) cuts head_tail itself; a Hugging Face one is cut by encode_texts.
    head_tail = loaded.truncation == "head_tail" and not hasattr(loaded.tokenizer, "cut_texts")
    for i in range(0, len(texts), batch_size):
        if head_tail:  # the text's start and end, cut exactly as in training (tokenization.encode_texts)
            ids = encode_texts(loaded.tokenizer, texts[i : i + batch_size], loaded.max_length, "head_tail")
            enc = loaded.tokenizer.pad({"input_ids": ids}, padding=True, return_tensors="pt")
        else:
            enc = loaded.tokenizer(
                texts[i : i + batch_size],
                truncation=True,
                max_length=loaded.max_length,
                padding=True,
                return_tensors="pt",
            )
        if not keep_tt:
            enc.pop("token_type_ids", None)
        logits = loaded.model(**{k: v.to(device) for k, v in enc.items()}).logits
        out.append(torch.softmax(logits.float(), dim=-1).cpu())
    return torch.cat(out) if out else torch.empty(0, len(loaded.label_names))


def check_predictions(loaded: LoadedCheckpoint) -> torch.Tensor:
    """Classify a short text and one that fills the whole token window; CheckpointError unless every
    answer is a finite probability distribution over the checkpoint's labels. Returns the probabilities."""
    texts = ["Stocks rally as tech shares surge.", " ".join(["news"] * (2 * loaded.max_length))]
    try:
        probs = predict_proba(loaded, texts)
    except Exception as err:
        reason = (str(err).splitlines() or [""])[0][:200]
        raise CheckpointError(
            f"checkpoint {loaded.path} loaded but could not classify a text ({type(err).__name__}"
            f"{': ' + reason if reason else ''}). Its model and tokenizer may not belong together; retrain it."
        ) from None
    expected = (len(texts), len(loaded.label_names))
    if tuple(probs.shape) != expected:
        raise CheckpointError(
            f"checkpoint {loaded.path} answered with shape {tuple(probs.shape)} instead of {expected} "
            "(texts x labels); retrain it."
        )
    if not bool(torch.isfinite(probs).all()):
        raise CheckpointError(
            f"checkpoint {loaded.path} loaded but answers NaN or infinite probabilities; the model is "
            "broken (a diverged training run). Retrain it with a lower --lr, or with --amp off."
        )
    if bool((probs < 0).any()) or bool(((probs.sum(-1) - 1).abs() > 1e-3).any()):
        raise CheckpointError(
            f"checkpoint {loaded.path} answers values that are not probabilities "
            f"(row sums {probs.sum(-1).tolist()}); retrain it."
        )
    return probs


class Classifier:
    """The loaded checkpoint plus the one function the batcher calls: texts -> list of Prediction dicts."""

    def __init__(self, loaded: LoadedCheckpoint, device: str):
        self.loaded = loaded
        self.device = device
        self.labels = list(loaded.label_names)

    def predict(self, texts: list[str]) -> list[dict]:
        # predict_proba is the checkpoint's own prediction function (same tokenization, truncation to
        # max_length, softmax), so the API answers exactly what a notebook would compute.
        with torch.inference_mode():
            probs = predict_proba(self.loaded, texts, batch_size=max(len(texts), 1))
        best = probs.argmax(dim=-1).tolist()
        results = []
        for row, i in zip(probs.tolist(), best):
            results.append(
                {"label": self.labels[i], "confidence": row[i], "all_probabilities": dict(zip(self.labels, row))}
            )
        return results

    def info(self) -> CheckpointInfo:
        meta = self.loaded.metadata or {}

        def pick(key, kind):
            value = meta.get(key)
            try:
                return kind(value) if value is not None else None
            except (TypeError, ValueError):
                return None

        return CheckpointInfo(
            # The file name only: the folder it lives in is the server's business, not its clients'.
            file=Path(self.loaded.path).name,
            data_source=pick("data_source", str),
            final_accuracy=pick("final_accuracy", float),
            world_size=pick("world_size", int),
            preset=pick("preset", str),
            model=pick("model", str),
            created=pick("created", str),
            max_length=self.loaded.max_length,
            versions=meta.get("versions") if isinstance(meta.get("versions"), dict) else None,
        )
