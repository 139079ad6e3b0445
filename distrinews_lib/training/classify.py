"""Classification, the core's task: the texts with their classes, a model with a classification head, accuracy."""

from __future__ import annotations

from dataclasses import replace

from ..checkpoint import CLASSIFY_TASK, position_limit
from ..data.texts import TextSplits
from ..data.tokenization import set_truncation, tokenize_splits
from ..errors import UserError
from ..models.build import build_model
from ..process_group.collectives import agree, local_main_first
from . import evaluation
from .task import PreparedRun, Task, tokenizer_name


class Classification(Task):
    name = CLASSIFY_TASK
    instance = "CLASSIFY"

    def prepare(self, plan, splits: TextSplits, log) -> PreparedRun:
        """The model with a head over the data's classes, and the texts tokenized for it (cached)."""
        cfg = plan.cfg

        def load():
            model, tokenizer, info = build_model(
                replace(cfg, model=plan.model_name, tokenizer=plan.tokenizer), splits.label_names, hub=plan.hub
            )
            limit = position_limit(model)
            if limit is not None and cfg.max_length > limit:
                raise UserError(
                    f"--max_length {cfg.max_length} is beyond what {info.resolved} can read: its position "
                    f"embeddings stop at {limit} tokens. Use --max_length {limit} or less; for long texts "
                    "add --truncation head_tail, which keeps their start and their end."
                )
            set_truncation(tokenizer, cfg.truncation)  # training, the checkpoint and the server cut texts the same way
            return model, tokenizer, info

        model, tokenizer, info = agree(load)
        log(splits.describe() + f" | fingerprint {splits.fingerprint()}")
        log(splits.balance())
        if splits.is_synthetic:
            log("NOTE: " + splits.detail)  # synthetic data's detail is its warning
        log(
            f"model: {info.resolved} ({info.kind}, {info.num_parameters / 1e6:.1f}M parameters"
            f"{', pretrained' if info.pretrained else ', random init'}) | tokenizer {tokenizer_name(tokenizer)} | "
            f"{cfg.max_length} tokens, truncation {cfg.truncation} | labels {', '.join(splits.label_names)}"
        )
        train_ds, val_ds = agree(local_main_first, tokenize_splits, splits, tokenizer, cfg.max_length)
        return PreparedRun(splits, model, tokenizer, info, train_ds, val_ds, self)

    def label_names(self, splits: TextSplits) -> list:
        return list(splits.label_names)

    def evaluate(self, model, loader, device, amp, gather: bool) -> evaluation.ClassifierEval:
        return evaluation.classify(model, loader, device, amp, gather)


CLASSIFY = Classification()
