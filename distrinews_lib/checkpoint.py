"""The checkpoint file's entry point, below both the training and the serving side: save_checkpoint writes it
(the *unwrapped* model, its tokenizer's files, labels and run metadata in one file, written atomically by
rank 0); read_checkpoint reads and validates it (torch.load(weights_only=True)), with a version field and a message
that says what an older, newer, foreign or other-task file is; check_servable refuses a classifier's file that would
load but answer wrongly. The server (serving/rebuild.py rebuilds a classifier from it) and the language models (lm/)
only call it; it imports nothing of either, nor of training/. What the file must hold is checkpoint_format.py's; the
reading is checkpoint_reading.py's, imported on first use of its names here: a run that only saves never loads it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from .checkpoint_format import (  # noqa: F401  (the format's names, for the callers of this module)
    CLASSIFY_TASK,
    FORMAT_VERSION,
    LOADERS,
    CheckpointError,
    check_format,
    position_limit,
)
from .data.tokenization import truncation_of
from .files import atomic_torch_save

DEFAULT_CHECKPOINT = "checkpoints/distilbert_agnews.pt"  # where the trained model goes, and what the server loads
READING = ("read_checkpoint", "tokenizer_from_files", "check_servable")  # checkpoint_reading.py's, on first use


def __getattr__(name: str):
    """checkpoint.read_checkpoint (and `from .checkpoint import read_checkpoint`) as before: the reading side is
    imported when one of its names is first asked for, not by every run that imports this module to save."""
    if name in READING:
        from . import checkpoint_reading

        return getattr(checkpoint_reading, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The bare model inside DDP (`.module`) and/or torch.compile (`._orig_mod`)."""
    while True:
        if hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def tokenizer_files(tokenizer) -> dict:
    """The tokenizer as {file name: text}, from save_pretrained (every file it writes is text)."""
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        return {p.name: p.read_text(encoding="utf-8") for p in sorted(Path(tmp).iterdir()) if p.is_file()}


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


def payload_for(
    model,
    tokenizer,
    label_names,
    metadata: dict | None = None,
    max_length: int | None = None,
    truncation: str | None = None,
    with_state: bool = True,
) -> dict:
    """The checkpoint's payload for the unwrapped model (no `module.` prefix): config, labels, metadata, tokenizer and,
    with_state, the weights. with_state=False: the rest alone (a sharded checkpoint saves the weights itself)."""
    bare = unwrap(model)
    payload = {
        "format_version": FORMAT_VERSION,
        "model_type": bare.config.model_type,
        "model_config": _plain(bare.config.to_dict()),
        "label_names": list(label_names),
        "max_length": int(max_length or 128),
        "metadata": _plain(metadata or {}),
        "tokenizer_files": tokenizer_files(tokenizer),
        "truncation": truncation or truncation_of(tokenizer),
        "task": (metadata or {}).get("task", CLASSIFY_TASK),  # the task that trained it (training.task.Task.name)
    }
    if with_state:
        payload["state_dict"] = {k: v.detach().cpu().clone() for k, v in bare.state_dict().items()}
    return payload


def write_payload(payload: dict, path) -> Path:
    """Write a payload as a checkpoint file, atomically, once it passes the checks read_checkpoint applies."""
    path = Path(path)
    check_format(path, payload)
    atomic_torch_save(payload, path)
    return path


def save_checkpoint(
    path,
    model,
    tokenizer,
    label_names,
    metadata: dict | None = None,
    max_length: int | None = None,
    truncation: str | None = None,
) -> Path:
    """Save the unwrapped model (no `module.` prefix) with its config, labels, metadata and tokenizer."""
    return write_payload(payload_for(model, tokenizer, label_names, metadata, max_length, truncation), path)
