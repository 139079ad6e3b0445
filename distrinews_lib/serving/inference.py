"""Inference from a checkpoint: a ready model and tokenizer, refused when it could not answer correctly, and the
function that turns texts into class probabilities, the same for a notebook, a test and the server. The file's
format is distrinews_lib/checkpoint.py's; a language model's checkpoint (--task clm/mlm) loads with
distrinews_lib.lm.inference.load_lm.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from ..checkpoint import (  # the format's one module
    DEFAULT_CHECKPOINT,
    CheckpointError,
    load_classifier,
    read_checkpoint,  # noqa: F401  (read here by notebook 02 and the tests)
)
from ..data.tokenization import HashTokenizer, encode_texts
from ..errors import UserError
from .schemas import CheckpointInfo


def model_accepts_token_type_ids(model) -> bool:
    return "token_type_ids" in inspect.signature(model.forward).parameters


@dataclass
class LoadedCheckpoint:
    model: torch.nn.Module
    tokenizer: Any
    label_names: list
    metadata: dict
    max_length: int
    path: Path
    truncation: str = "head"  # how texts longer than max_length are cut: head, or head_tail
    precision: str = "fp32"  # what the model computes in: fp32, or int8 (quantize.quantize_int8)
    quantization: Optional[dict] = None  # int8: how (method, engine, layers, share, probe drift)


def load_checkpoint(path=DEFAULT_CHECKPOINT, device: str | torch.device = "cpu") -> LoadedCheckpoint:
    """A ready eval-mode model and its tokenizer from a checkpoint written by save_checkpoint."""
    model, tokenizer, payload = load_classifier(path)  # read, rebuilt and checked by the format's module
    return LoadedCheckpoint(
        model.to(device),
        tokenizer,
        list(payload["label_names"]),
        dict(payload.get("metadata", {})),
        int(payload.get("max_length", 128)),
        Path(path),
        payload.get("truncation", "head"),
    )


@torch.inference_mode()
def predict_proba(loaded: LoadedCheckpoint, texts: list[str], batch_size: int = 64) -> torch.Tensor:
    """Class probabilities (N x C) for raw texts, the same way the server computes them."""
    device = next(loaded.model.parameters()).device
    keep_tt = model_accepts_token_type_ids(loaded.model)
    out = []
    head_tail = loaded.truncation == "head_tail" and not isinstance(loaded.tokenizer, HashTokenizer)
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


def load_for_serving(path, device: str) -> LoadedCheckpoint:
    """load_checkpoint, with any failure turned into a CheckpointError that names the path (in fp32: int8 and the
    check that it answers are serving/loading.py's)."""
    try:
        return load_checkpoint(path, device=device)
    except CheckpointError as err:
        if Path(path).is_absolute():
            raise
        # A relative path is read from the working directory; say which one, it is a common surprise.
        raise CheckpointError(f"{err} (Relative paths are read from the working directory {Path.cwd()}.)") from None
    except UserError:
        raise
    except Exception as err:  # e.g. a damaged tokenizer: transformers raises its own errors
        first = (str(err).splitlines() or [""])[0][:200]
        raise CheckpointError(f"checkpoint {path} could not be loaded ({type(err).__name__}: {first}).") from None


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
