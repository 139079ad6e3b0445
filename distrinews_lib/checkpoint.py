"""Save and load the inference checkpoint: the *unwrapped* model, its tokenizer, labels and run metadata.

Layout:   checkpoints/distilbert_agnews.pt            state_dict + config + labels + metadata
          checkpoints/distilbert_agnews_tokenizer/    the tokenizer (save_pretrained)
Written by rank 0 only, atomically: a crash mid-write leaves the previous file intact.
Loaded with torch.load(weights_only=True): the file holds tensors and plain Python values only.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .errors import UserError

DEFAULT_CHECKPOINT = Path("checkpoints") / "distilbert_agnews.pt"
FORMAT_VERSION = 1


class CheckpointError(UserError):
    """The checkpoint is missing, truncated, or not one of ours."""


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The bare model inside DDP (`.module`) and/or torch.compile (`._orig_mod`)."""
    while True:
        if hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def tokenizer_dir(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path.with_name(path.stem + "_tokenizer")


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """torch.save to a temporary file in the same folder, fsync, then rename over the target."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _atomic_save_tokenizer(tokenizer, target: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent))
    tokenizer.save_pretrained(tmp)
    old = target.with_name(target.name + ".old")
    if target.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(target, old)
    os.replace(tmp, target)
    shutil.rmtree(old, ignore_errors=True)


def _plain(value):
    """Metadata as plain Python values, so weights_only=True can load it."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    for plain in (str, int, float):  # str subclasses such as torch's TorchVersion are not weights_only-safe
        if isinstance(value, plain):
            return plain(value)
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()
    return str(value)


def save_checkpoint(path, model, tokenizer, label_names, metadata: dict | None = None, max_length: int | None = None) -> Path:
    """Save the unwrapped model (no `module.` prefix) with its config, labels, metadata and tokenizer."""
    path = Path(path)
    bare = unwrap(model)
    state = {k: v.detach().cpu().clone() for k, v in bare.state_dict().items()}
    payload = {
        "format_version": FORMAT_VERSION,
        "model_type": bare.config.model_type,
        "model_config": _plain(bare.config.to_dict()),
        "state_dict": state,
        "label_names": list(label_names),
        "max_length": int(max_length or 128),
        "metadata": _plain(metadata or {}),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    if tokenizer is not None:
        _atomic_save_tokenizer(tokenizer, tokenizer_dir(path))
    atomic_torch_save(payload, path)
    return path


@dataclass
class LoadedCheckpoint:
    model: torch.nn.Module
    tokenizer: Any
    label_names: list
    metadata: dict
    max_length: int
    path: Path


def read_checkpoint(path) -> dict:
    """The raw payload, checked. Raises CheckpointError saying which path and why."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint {path} not found. Train one first (python scripts/train_single.py, or notebook 01/02), "
            "or point to it with --checkpoint / DISTRINEWS_CHECKPOINT."
        )
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated zip, random bytes, pickled code...
        raise CheckpointError(
            f"checkpoint {path} could not be read ({type(err).__name__}: {str(err).splitlines()[0][:150]}). "
            "It may be truncated or not a DistriNews checkpoint; retrain or restore it."
        ) from None
    missing = [k for k in ("model_type", "model_config", "state_dict", "label_names") if not isinstance(payload, dict) or k not in payload]
    if missing:
        raise CheckpointError(f"checkpoint {path} is not a DistriNews checkpoint (missing {', '.join(missing)}).")
    return payload


def load_checkpoint(path=DEFAULT_CHECKPOINT, device: str | torch.device = "cpu") -> LoadedCheckpoint:
    """A ready eval-mode model and its tokenizer from a checkpoint written by save_checkpoint."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    from .model import _quiet_transformers

    _quiet_transformers()
    path = Path(path)
    payload = read_checkpoint(path)
    cfg_dict = dict(payload["model_config"])
    model_type = cfg_dict.pop("model_type", payload["model_type"])
    config = AutoConfig.for_model(model_type, **cfg_dict)
    model = AutoModelForSequenceClassification.from_config(config)
    state = payload["state_dict"]
    if any(k.startswith("module.") for k in state):
        raise CheckpointError(f"checkpoint {path} holds a DDP wrapper's keys ('module.' prefix); save unwrap(model) instead.")
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise CheckpointError(f"checkpoint {path} does not match its own model config: {str(err).splitlines()[0][:200]}") from None
    model.to(device).eval()
    tok_path = tokenizer_dir(path)
    if not tok_path.is_dir():
        raise CheckpointError(f"the tokenizer folder {tok_path} that belongs to {path} is missing; retrain or copy it beside the checkpoint.")
    tokenizer = AutoTokenizer.from_pretrained(str(tok_path))
    return LoadedCheckpoint(model, tokenizer, list(payload["label_names"]), dict(payload.get("metadata", {})),
                            int(payload.get("max_length", 128)), path)


@torch.inference_mode()
def predict_proba(loaded: LoadedCheckpoint, texts: list[str], batch_size: int = 64) -> torch.Tensor:
    """Class probabilities (N x C) for raw texts, the same way the server computes them."""
    from .model import model_accepts_token_type_ids

    device = next(loaded.model.parameters()).device
    keep_tt = model_accepts_token_type_ids(loaded.model)
    out = []
    for i in range(0, len(texts), batch_size):
        enc = loaded.tokenizer(texts[i:i + batch_size], truncation=True, max_length=loaded.max_length,
                               padding=True, return_tensors="pt")
        if not keep_tt:
            enc.pop("token_type_ids", None)
        logits = loaded.model(**{k: v.to(device) for k, v in enc.items()}).logits
        out.append(torch.softmax(logits.float(), dim=-1).cpu())
    return torch.cat(out) if out else torch.empty(0, len(loaded.label_names))
