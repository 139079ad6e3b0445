"""A classifier rebuilt from its checkpoint file on a device: the model from its own config (transformers, or --model
custom's plain PyTorch) with strict weights, refused when it would answer wrongly (checkpoint.check_servable), and its
tokenizer cutting texts as in training. The file's format and its checks are distrinews_lib/checkpoint.py's; a
language model's checkpoint (--task clm/mlm) loads with distrinews_lib.lm.inference.load_lm.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Optional

import torch

from .. import quick_imports
from ..checkpoint import CLASSIFY_TASK, DEFAULT_CHECKPOINT, CheckpointError  # the format's module
from ..checkpoint_reading import check_servable, read_checkpoint, tokenizer_from_files
from ..data.tokenization import TRUNCATIONS, set_truncation
from ..errors import UserError


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
