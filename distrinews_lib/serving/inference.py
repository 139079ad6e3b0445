"""Inference from a checkpoint: a ready model and tokenizer, rebuilt from the file and refused when it could not answer
correctly, and the function that turns texts into class probabilities, the same for a notebook, a test and the
server. The file's format and its checks are distrinews_lib/checkpoint.py's; a language model's checkpoint
(--task clm/mlm) loads with distrinews_lib.lm.inference.load_lm.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Optional

import torch

from .. import quick_imports
from ..checkpoint import (  # the format's one module
    CLASSIFY_TASK,
    DEFAULT_CHECKPOINT,
    CheckpointError,
    check_servable,
    read_checkpoint,
    tokenizer_from_files,
)
from ..data.hash_tokenizer import HashTokenizer
from ..data.tokenization import TRUNCATIONS, encode_texts, set_truncation
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


def _custom_config(d: dict):
    from ..models.custom import CustomConfig

    unknown = sorted(set(d) - {f.name for f in fields(CustomConfig)})
    if unknown:
        raise ValueError(f"unknown custom model settings: {', '.join(unknown)}")
    return CustomConfig(**d)


@quick_imports.paused()  # transformers loads here: with the garbage collector paused, then frozen
def load_classifier(path=DEFAULT_CHECKPOINT) -> tuple:
    """(eval-mode model on the CPU, tokenizer, payload) of a classifier's checkpoint: read and checked, its model
    rebuilt from its own config (transformers, or --model custom's plain PyTorch) with strict weights, refused when it
    would answer wrongly (check_servable), and its tokenizer cutting texts as in training."""
    from transformers import AutoConfig, AutoModelForSequenceClassification  # deferred: importing it costs seconds

    from ..models.build import quiet_transformers
    from ..models.custom import MODEL_TYPE as CUSTOM_MODEL_TYPE
    from ..models.custom import CustomClassifier

    quiet_transformers()
    path = Path(path)
    payload = read_checkpoint(path, task=CLASSIFY_TASK)  # another task's file refused
    cfg_dict = dict(payload["model_config"])
    model_type = cfg_dict.pop("model_type", payload["model_type"])
    if model_type == CUSTOM_MODEL_TYPE:  # --model custom: plain PyTorch, rebuilt from its own config
        try:
            model = CustomClassifier(_custom_config(cfg_dict))
        except (TypeError, ValueError) as err:
            raise CheckpointError(
                f"checkpoint {path} has a custom model config this version cannot build ({err}); retrain it."
            ) from None
    else:
        config = AutoConfig.for_model(model_type, **cfg_dict)
        model = AutoModelForSequenceClassification.from_config(config)
    try:
        model.load_state_dict(payload["state_dict"], strict=True)
    except RuntimeError as err:
        raise CheckpointError(
            f"checkpoint {path} does not match its own model config: {str(err).splitlines()[0][:200]}"
        ) from None
    check_servable(path, payload, model)
    tokenizer = tokenizer_from_files(payload["tokenizer_files"])
    truncation = payload.get("truncation", "head")
    if truncation not in TRUNCATIONS:
        raise CheckpointError(
            f"checkpoint {path} has truncation={truncation!r}; it must be one of {', '.join(TRUNCATIONS)}. Retrain it."
        )
    set_truncation(tokenizer, truncation)
    return model.eval(), tokenizer, payload


def load_checkpoint(path=DEFAULT_CHECKPOINT, device: str | torch.device = "cpu") -> LoadedCheckpoint:
    """A ready eval-mode model and its tokenizer from a checkpoint written by save_checkpoint."""
    model, tokenizer, payload = load_classifier(path)
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
