"""The machinery of scripts/train_sharded.py that is not its lesson: the command line, the padded tensors, the check
that a checkpoint comes from the same run, the held-out score, and the record of when each step and save ran
(OUTPUT/result.json, which chapter 07's save timeline and served score read).

    args = sharded_run.parse_args()
    ids, mask, labels = sharded_run.tensors(tokenizer, texts, labels, args.max_length)
    sharded_run.check_same_run(folder, train, args, len(labels))   # a UserError if the data or the batch differ
    timeline = sharded_run.Timeline(model, optimizer, start)   # hooks that time every step: the loop has no clock
    sharded_run.report(args, model, tokenizer, data, timeline, saves, start, resumed_from)  # score, result.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist

from . import distributed as D
from .data.tokenization import tokenize_texts
from .errors import UserError


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="FSDP2 training with sharded checkpoints (launch with torchrun).")
    p.add_argument("--output", required=True, help="the run folder: its checkpoints go to OUTPUT/step_SSSSSSSS/")
    p.add_argument("--steps", type=int, default=30, help="optimizer steps in all (global batches)")
    p.add_argument("--global_batch", type=int, default=32, help="examples per step, over all ranks together")
    p.add_argument("--save_every", type=int, default=10, help="a checkpoint every N steps, and at the end")
    p.add_argument(
        "--async_save",
        choices=("off", "on", "alternate"),
        default="off",
        help="on: dcp.async_save; alternate: every other save, to compare both in one run",
    )
    p.add_argument("--keep", type=int, default=2, help="committed checkpoints to keep")
    p.add_argument("--resume", default="auto", help="auto (the newest good one in --output), off, or a step_ folder")
    p.add_argument("--num_samples", type=int, default=3200)
    p.add_argument("--eval_samples", type=int, default=400)
    p.add_argument("--max_length", type=int, default=64)
    p.add_argument("--lr", type=float, default=4e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default=None, help="an AG News folder (default: $DISTRINEWS_DATA_DIR, else the sample)")
    return p.parse_args(argv)


def tensors(tokenizer, texts, labels, length):
    """Token ids padded to one length (the same shapes on any world size), their attention mask, the labels."""
    ids = torch.full((len(texts), length), tokenizer.pad_token_id)
    for i, row in enumerate(tokenize_texts(texts, tokenizer, length)):
        ids[i, : len(row)] = torch.tensor(row)
    return ids, (ids != tokenizer.pad_token_id).long(), torch.tensor(labels)


def check_same_run(folder, train: dict, args, num_samples: int) -> None:
    """A checkpoint continues only the run that saved it: the same global batch, seed and data, or a UserError that
    names what differs (the order of the global batches is drawn from these)."""
    saved = (train["global_batch"], train["seed"], train["num_samples"])
    if saved != (args.global_batch, args.seed, num_samples):
        raise UserError(
            f"{folder} was saved by a run with --global_batch {train['global_batch']}, --seed {train['seed']} and "
            f"{train['num_samples']} texts: resume with the same."
        )


@torch.no_grad()
def evaluate(model, ids, mask, labels, rank: int, world: int, batch: int = 100) -> dict:
    """Accuracy and mean loss on held-out texts: every rank scores an equal share (FSDP2's forward is collective)."""
    model.eval()
    per = len(labels) // world
    totals = torch.zeros(2)  # [correct, loss summed over texts]
    for i in range(rank * per, (rank + 1) * per, batch):
        j = min(i + batch, (rank + 1) * per)
        out = model(input_ids=ids[i:j], attention_mask=mask[i:j], labels=labels[i:j])
        totals += torch.stack([(out.logits.argmax(-1) == labels[i:j]).sum(), out.loss * (j - i)])
    dist.all_reduce(totals)
    model.train()
    n = per * world
    return {"val_accuracy": totals[0].item() / n, "val_loss": totals[1].item() / n, "val_texts": n}


class Timeline:
    """When each optimizer step ran on this rank, for chapter 07's save timeline, taken by hooks so that the training
    loop carries no clock: a step starts when the model's forward is called and ends when optimizer.step() returns.
    `steps` holds (step, start, end) with the step numbered from first_step + 1, as the checkpoints number it."""

    def __init__(self, model, optimizer, first_step: int):
        self.steps: list[tuple[int, float, float]] = []
        self._next, self._t0 = first_step + 1, None
        model.register_forward_pre_hook(self._started, prepend=True)  # before FSDP2's all-gather of the root
        optimizer.register_step_post_hook(self._stepped)

    def _started(self, module, args) -> None:
        self._t0 = time.time()

    def _stepped(self, optimizer, args, kwargs) -> None:
        self.steps.append((self._next, self._t0, time.time()))
        self._next += 1


def report(args, model, tokenizer, data, timeline: Timeline, saves: list, start: int, resumed_from) -> dict:
    """Score the held-out texts, print one line on rank 0, and write OUTPUT/result.json there: the score, the
    arguments, and every rank's step times and save times. Every rank calls it (the score and the gather are
    collective)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    score = evaluate(model, *tensors(tokenizer, data.test_texts, data.test_labels, args.max_length), rank, world)
    every = [None] * world
    dist.all_gather_object(every, {"rank": rank, "steps": timeline.steps, "saves": [s.times() for s in saves]})
    D.print0(
        f"step {args.steps} on {world} rank(s): val accuracy {100 * score['val_accuracy']:.2f}% "
        f"({score['val_texts']} texts), val loss {score['val_loss']:.4f}; saved at steps "
        f"{', '.join(f'{s.step} ({s.mode})' for s in saves)}"
    )
    if rank == 0:
        result = {
            "world_size": world,
            "steps": args.steps,
            "start_step": start,
            "resumed_from": resumed_from,
            **score,
            "args": {k: v for k, v in vars(args).items() if k != "label_names"},
            "ranks": every,
        }
        Path(args.output, "result.json").write_text(json.dumps(result))
    return score
