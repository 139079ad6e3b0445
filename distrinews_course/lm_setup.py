"""Chapter 11's set-up before training: the data, the vocabulary and the random model, built in the notebook's own
process exactly as scripts/train_ddp.py builds them from the same flags, and the untrained model validated.

    lm = untrained_lm(ARGS, OUT)     # lm.cfg, lm.run (blocks, vocabulary, model, task), lm.val_loader, lm.initial
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from distrinews_lib import plan
from distrinews_lib.training import config, evaluation


@dataclass
class UntrainedLM:
    cfg: object  # the parsed flags, as train_ddp.py parses them
    run: object  # plan.prepare's PreparedRun: run.train_ds, run.val_ds, run.tokenizer (the vocabulary), run.model
    val_loader: torch.utils.data.DataLoader  # every validation block once, in order, 128 a batch
    initial: object  # the untrained model's validation (LMEval: loss, perplexity, tokens, n)

    @property
    def vocab(self):
        return self.run.tokenizer

    @property
    def val_ds(self):
        return self.run.val_ds

    def line(self) -> str:
        i = self.initial
        return (
            f"untrained: validation loss {i.loss:.3f} per token, perplexity {i.perplexity:.0f}, over {i.tokens} "
            "predicted tokens"
        )


def untrained_lm(args: list, out) -> UntrainedLM:
    """train_ddp.py's flags (args, plus --output out, no resuming) parsed as the script parses them; the texts packed
    into blocks over the vocabulary and the random model built by plan.prepare (the same seed, so the same model the
    launch starts from); the untrained model validated on the CPU over every validation block. Prints the plan's and
    the data's lines, as the script does."""
    cfg = config.parse("chapter 11", [str(a) for a in [*args, "--output", Path(out), "--resume", "off"]], ddp=True)
    run = plan.prepare(plan.decide(cfg))
    loader = torch.utils.data.DataLoader(run.val_ds, batch_size=128, collate_fn=run.val_ds.collator_for(None))
    initial = evaluation.evaluate(run.model, loader, device=torch.device("cpu"), task=run.task)
    return UntrainedLM(cfg, run, loader, initial)
