"""What a checkpoint file must hold, checked when it is written (checkpoint.py) and when it is read
(checkpoint_reading.py): the format's version, the keys it holds, the error every refusal raises (CheckpointError),
the check both sides apply to a payload (check_format: a snapshot, bare weights, a DDP wrapper's keys, another
version) and how many token positions a model can embed (position_limit: a file's max_length must fit it).
"""

from __future__ import annotations

from pathlib import Path

import torch

from .errors import UserError

FORMAT_VERSION = 2  # 2: the tokenizer travels inside the file (1 kept it in a folder beside it)
CLASSIFY_TASK = "classify"  # what a classifier's file records as its task (and format 2 files from before --task)
LOADERS = (
    "classifiers load with distrinews_lib.serving.inference.load_checkpoint (the server), language models "
    "(--task clm, mlm) with distrinews_lib.lm.inference.load_lm (notebook 11)"
)
DDP_PREFIX = "module."  # what DistributedDataParallel puts before every weight name of the model it wraps
REQUIRED_KEYS = ("model_type", "model_config", "state_dict", "label_names")


class CheckpointError(UserError):
    """The checkpoint is missing, truncated, or not one of ours."""


def check_format(path: Path, payload) -> None:
    """A foreign file, or another version of the format, gets a message that says which."""
    if isinstance(payload, dict) and "snapshot_version" in payload:
        raise CheckpointError(
            f"{path} is a training snapshot (what --resume continues from), not a checkpoint: the "
            "checkpoint is the file a finished run saves at --checkpoint."
        )
    missing = [k for k in REQUIRED_KEYS if not isinstance(payload, dict) or k not in payload]
    if missing:
        bare = isinstance(payload, dict) and payload and all(torch.is_tensor(v) for v in payload.values())
        what = " It holds bare weights (a state_dict) without the model's config, labels or tokenizer." if bare else ""
        raise CheckpointError(f"checkpoint {path} is not a DistriNews checkpoint (missing {', '.join(missing)}).{what}")
    if any(str(k).startswith(DDP_PREFIX) for k in payload["state_dict"]):
        raise CheckpointError(
            f"checkpoint {path} holds a DDP wrapper's keys ('module.' prefix); save unwrap(model) instead."
        )
    version = payload.get("format_version", 1)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} was written by a newer DistriNews (format {version!r}); this one reads "
            f"format {FORMAT_VERSION}. Update distrinews_lib, or retrain it with this version."
        )
    if version < FORMAT_VERSION or not isinstance(payload.get("tokenizer_files"), dict):
        raise CheckpointError(
            f"checkpoint {path} was written by an older DistriNews (format {version}, "
            f"tokenizer in a separate folder); retrain it to get format {FORMAT_VERSION}."
        )


def position_limit(model: torch.nn.Module) -> int | None:
    """How many token positions the model can embed (None when it has no absolute position table)."""
    for name, module in model.named_modules():
        if name.endswith("position_embeddings") and isinstance(module, torch.nn.Embedding):
            # RoBERTa-style tables start counting after the padding index.
            pad = module.padding_idx
            return module.num_embeddings - (pad + 1 if pad is not None else 0)
    limit = getattr(model.config, "max_position_embeddings", None)
    return limit if isinstance(limit, int) and not isinstance(limit, bool) else None
