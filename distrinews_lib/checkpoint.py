"""Save and load the inference checkpoint: the *unwrapped* model, its tokenizer, labels and run metadata.

One file, checkpoints/distilbert_agnews.pt: state_dict + config + labels + metadata + the tokenizer's
files (as text). Weights and tokenizer travel together, so a crash can never pair a new tokenizer
with old weights. Written by rank 0 only, atomically (a crash mid-write leaves the previous file
intact), with the usual umask-respecting permissions so a server running as another user can read it.
Loaded with torch.load(weights_only=True): the file holds tensors and plain Python values only.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .errors import UserError

DEFAULT_CHECKPOINT = Path("checkpoints") / "distilbert_agnews.pt"
FORMAT_VERSION = 2  # 2: the tokenizer travels inside the file (1 kept it in a folder beside it)


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


def umask_mode(mode: int = 0o666) -> int:
    """The permissions a plain open() would give: mkstemp/mkdtemp use 0600/0700, which another user can't read."""
    current = os.umask(0)
    os.umask(current)
    return mode & ~current


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
        os.chmod(tmp, umask_mode())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def tokenizer_files(tokenizer) -> dict:
    """The tokenizer as {file name: text}, from save_pretrained (every file it writes is text)."""
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        return {p.name: p.read_text(encoding="utf-8") for p in sorted(Path(tmp).iterdir()) if p.is_file()}


def tokenizer_from_files(files: dict):
    from .tokenization import HASH_FILE, HashTokenizer, is_hash_files

    if is_hash_files(files):  # the vocabulary-free hash tokenizer: its settings are all it needs
        import json

        return HashTokenizer.from_dict(json.loads(files[HASH_FILE]))
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        for name, text in files.items():
            (Path(tmp) / Path(name).name).write_text(text, encoding="utf-8")
        return AutoTokenizer.from_pretrained(tmp)


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


def save_checkpoint(path, model, tokenizer, label_names, metadata: dict | None = None, max_length: int | None = None,
                    truncation: str | None = None) -> Path:
    """Save the unwrapped model (no `module.` prefix) with its config, labels, metadata and tokenizer.
    truncation: how texts longer than max_length are cut (default: what the tokenizer was told, else head)."""
    from .tokenization import truncation_of

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
        "tokenizer_files": tokenizer_files(tokenizer),
        "truncation": truncation or truncation_of(tokenizer),
        "task": (metadata or {}).get("task", "classify"),  # clm / mlm: a language model (distrinews_lib.lm.load_lm)
    }
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
    truncation: str = "head"  # how texts longer than max_length are cut: head, or head_tail


def read_checkpoint(path) -> dict:
    """The raw payload, checked. Raises CheckpointError saying which path and why."""
    path = Path(path)
    if path.is_dir():
        found = sorted(p.name for p in path.glob("*.pt"))
        hint = (f"It holds {', '.join(found[:5])}{' ...' if len(found) > 5 else ''}: pass one of those files."
                if found else "Pass the .pt file itself, for example checkpoints/distilbert_agnews.pt.")
        raise CheckpointError(f"checkpoint {path} is a folder, not a checkpoint file. {hint}")
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint {path} not found. Train one first (python scripts/train_single.py, or notebook 01/02), "
            "or point to it with --checkpoint / DISTRINEWS_CHECKPOINT."
        )
    if path.stat().st_size == 0:
        raise CheckpointError(f"checkpoint {path} is empty (0 bytes): the copy or the write that made it was cut short. "
                              "Retrain it or restore a complete copy.")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated zip, random bytes, pickled code...
        reason = (str(err).splitlines() or [""])[0][:150]
        raise CheckpointError(
            f"checkpoint {path} could not be read ({type(err).__name__}{': ' + reason if reason else ''}). "
            "It may be truncated or not a DistriNews checkpoint; retrain or restore it."
        ) from None
    missing = [k for k in ("model_type", "model_config", "state_dict", "label_names") if not isinstance(payload, dict) or k not in payload]
    if missing:
        raise CheckpointError(f"checkpoint {path} is not a DistriNews checkpoint (missing {', '.join(missing)}).")
    if payload.get("format_version", 1) < FORMAT_VERSION or not isinstance(payload.get("tokenizer_files"), dict):
        raise CheckpointError(f"checkpoint {path} was written by an older DistriNews (format {payload.get('format_version', 1)}, "
                              f"tokenizer in a separate folder); retrain it to get format {FORMAT_VERSION}.")
    return payload


def position_limit(model: torch.nn.Module) -> int | None:
    """How many token positions the model can embed (None when it has no absolute position table)."""
    for name, module in model.named_modules():
        if name.endswith("position_embeddings") and isinstance(module, torch.nn.Embedding):
            # RoBERTa-style tables start counting after the padding index.
            pad = module.padding_idx
            return module.num_embeddings - (pad + 1 if pad is not None else 0)
    limit = getattr(model.config, "max_position_embeddings", None)
    return limit if isinstance(limit, int) and not isinstance(limit, bool) else None


def check_servable(path, payload: dict, model: torch.nn.Module) -> None:
    """Refuse a checkpoint that would load but answer wrongly: label names that do not match the model's
    outputs, a token window longer than its position table, or NaN/infinite weights."""
    labels = payload["label_names"]
    if (not isinstance(labels, (list, tuple)) or not labels
            or not all(isinstance(n, str) and n.strip() for n in labels)):
        raise CheckpointError(f"checkpoint {path} has label names {str(labels)[:120]}; they must be a non-empty list of "
                              "non-empty strings, one per model output. Retrain it.")
    outputs = int(model.config.num_labels)  # strict load_state_dict has checked the head against the config
    if len(labels) != outputs:
        raise CheckpointError(
            f"checkpoint {path} names {len(labels)} labels ({', '.join(map(str, labels))[:200]}) but its model has "
            f"{outputs} outputs, so its answers would carry the wrong names. Retrain it, or fix its label_names to "
            f"list exactly {outputs} classes in the order of the model's outputs.")
    repeated = sorted({n for n in labels if list(labels).count(n) > 1})
    if repeated:
        raise CheckpointError(
            f"checkpoint {path} names the label{'s' if len(repeated) > 1 else ''} {', '.join(map(repr, repeated))} more "
            "than once; each of the model's outputs needs its own name, or answers would lose classes. Retrain it, "
            "or fix its label_names.")
    max_length = payload.get("max_length", 128)
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 2:
        raise CheckpointError(f"checkpoint {path} has max_length={max_length!r}; it must be a whole number of tokens, "
                              "at least 2. Retrain it with a valid --max_length.")
    limit = position_limit(model)
    if limit is not None and max_length > limit:
        raise CheckpointError(
            f"checkpoint {path} cuts texts at max_length={max_length} tokens, but its model has position embeddings "
            f"for only {limit} tokens, so every longer text would fail. Retrain it with --max_length {limit} or less.")
    bad = [name for name, t in payload["state_dict"].items()
           if torch.is_tensor(t) and t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise CheckpointError(
            f"checkpoint {path} has NaN or infinite weights in {len(bad)} tensor{'s' if len(bad) > 1 else ''} "
            f"({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}): the training run that wrote it diverged. "
            "Retrain it with a lower --lr, or with --amp off.")


def load_checkpoint(path=DEFAULT_CHECKPOINT, device: str | torch.device = "cpu") -> LoadedCheckpoint:
    """A ready eval-mode model and its tokenizer from a checkpoint written by save_checkpoint."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from .model import _quiet_transformers

    _quiet_transformers()
    path = Path(path)
    payload = read_checkpoint(path)
    if payload.get("task", "classify") != "classify":
        raise CheckpointError(f"checkpoint {path} is a {payload['task']} language model, not a classifier: the classification "
                              "server cannot serve it. Load it with distrinews_lib.lm.load_lm (notebook 08 does).")
    cfg_dict = dict(payload["model_config"])
    model_type = cfg_dict.pop("model_type", payload["model_type"])
    from .custom_model import MODEL_TYPE as CUSTOM_MODEL_TYPE

    if model_type == CUSTOM_MODEL_TYPE:  # --model custom: plain PyTorch, rebuilt from its own config
        from .custom_model import CustomClassifier, CustomConfig

        try:
            model = CustomClassifier(CustomConfig.from_dict(cfg_dict))
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"checkpoint {path} has a custom model config this version cannot build ({err}); "
                                  "retrain it.") from None
    else:
        config = AutoConfig.for_model(model_type, **cfg_dict)
        model = AutoModelForSequenceClassification.from_config(config)
    state = payload["state_dict"]
    if any(k.startswith("module.") for k in state):
        raise CheckpointError(f"checkpoint {path} holds a DDP wrapper's keys ('module.' prefix); save unwrap(model) instead.")
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise CheckpointError(f"checkpoint {path} does not match its own model config: {str(err).splitlines()[0][:200]}") from None
    check_servable(path, payload, model)
    model.to(device).eval()
    tokenizer = tokenizer_from_files(payload["tokenizer_files"])
    from .tokenization import TRUNCATIONS, set_truncation

    truncation = payload.get("truncation", "head")
    if truncation not in TRUNCATIONS:
        raise CheckpointError(f"checkpoint {path} has truncation={truncation!r}; it must be one of {', '.join(TRUNCATIONS)}. "
                              "Retrain it.")
    set_truncation(tokenizer, truncation)
    return LoadedCheckpoint(model, tokenizer, list(payload["label_names"]), dict(payload.get("metadata", {})),
                            int(payload.get("max_length", 128)), path, truncation)


@torch.inference_mode()
def predict_proba(loaded: LoadedCheckpoint, texts: list[str], batch_size: int = 64) -> torch.Tensor:
    """Class probabilities (N x C) for raw texts, the same way the server computes them."""
    from .model import model_accepts_token_type_ids

    device = next(loaded.model.parameters()).device
    keep_tt = model_accepts_token_type_ids(loaded.model)
    out = []
    from .tokenization import HashTokenizer, encode_texts

    head_tail = loaded.truncation == "head_tail" and not isinstance(loaded.tokenizer, HashTokenizer)
    for i in range(0, len(texts), batch_size):
        if head_tail:  # the text's start and end, cut exactly as in training (tokenization.encode_texts)
            ids = encode_texts(loaded.tokenizer, texts[i:i + batch_size], loaded.max_length, "head_tail")
            enc = loaded.tokenizer.pad({"input_ids": ids}, padding=True, return_tensors="pt")
        else:
            enc = loaded.tokenizer(texts[i:i + batch_size], truncation=True, max_length=loaded.max_length,
                                   padding=True, return_tensors="pt")
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
            f"{': ' + reason if reason else ''}). Its model and tokenizer may not belong together; retrain it.") from None
    expected = (len(texts), len(loaded.label_names))
    if tuple(probs.shape) != expected:
        raise CheckpointError(f"checkpoint {loaded.path} answered with shape {tuple(probs.shape)} instead of {expected} "
                              "(texts x labels); retrain it.")
    if not bool(torch.isfinite(probs).all()):
        raise CheckpointError(f"checkpoint {loaded.path} loaded but answers NaN or infinite probabilities; the model is "
                              "broken (a diverged training run). Retrain it with a lower --lr, or with --amp off.")
    if bool((probs < 0).any()) or bool(((probs.sum(-1) - 1).abs() > 1e-3).any()):
        raise CheckpointError(f"checkpoint {loaded.path} answers values that are not probabilities "
                              f"(row sums {probs.sum(-1).tolist()}); retrain it.")
    return probs
