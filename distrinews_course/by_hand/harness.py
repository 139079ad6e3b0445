"""A rung script's main, the same for every rung: join the gloo group torchrun set up, build the model on this rank's
own seed and its share of the real texts, wrap it in the rung's class (NaiveDP, BucketedDP, ...), train, then check
that every rank ends with the same weights (distributed.max_param_difference). A rung's file holds only its class and
ends with `harness.run(NaiveDP, __doc__)`."""

from __future__ import annotations

import argparse
from datetime import timedelta

import torch
import torch.distributed as dist

from distrinews_lib.distributed import max_param_difference, run_and_end, torchrun_env
from distrinews_lib.errors import main_guard

from . import models


def parse_args(doc: str, argv=None):
    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    p.add_argument("--model", default="tiny", choices=models.MODELS)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight_decay", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--bucket_mb", type=float, default=1.0)
    p.add_argument("--timeout_s", type=float, default=30, help="a collective that waits longer fails (never a hang)")
    p.add_argument(
        "--no-broadcast",
        dest="broadcast",
        action="store_false",
        help="skip the broadcast of rank 0's initial weights (to see what goes wrong)",
    )
    return p.parse_args(argv)


def init(timeout_s: float = 30, store=None) -> tuple[int, int]:
    """Join the gloo process group torchrun set up (or meet in `store`), one thread per rank, with a short timeout: a
    rank that skips a collective makes the others fail with a message after `timeout_s`, instead of hanging. A
    convenience: a rung needs only an initialized group, whoever made it."""
    rank, _, world, init_method = torchrun_env()
    torch.set_num_threads(1)  # one core per rank: the two ranks share a 2-core machine
    where = {"store": store} if store is not None else {"init_method": init_method}
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s), **where)
    return rank, world


def weights_of(dp, model) -> list:
    """Every rank's full weights: ZeRO-3 gathers them (full_weights), the other rungs hold them."""
    return dp.full_weights() if hasattr(dp, "full_weights") else list(model.parameters())


def train(rung_cls, doc: str, argv=None) -> float:
    """Train `rung_cls` as its script's command line says; returns the largest weight difference between ranks."""
    args = parse_args(doc, argv)
    rank, world = init(args.timeout_s)
    model = models.build_model(args.model, seed=args.seed + rank)  # each rank its own random init, on purpose
    batches = models.batches(args.model, rank, world, args.steps, args.batch_size)  # its own share of the texts
    dp = rung_cls(model, args.bucket_mb, args.broadcast)
    optimizer = dp.optimizer(args.lr, args.weight_decay)
    if not args.broadcast:  # where each rank starts, to tell the initial difference from the moves the steps make
        start = [w.detach().clone() for w in weights_of(dp, model)]
        before = max_param_difference(start)
    for step, batch in enumerate(batches, 1):
        loss = model(**batch).loss
        loss.backward()
        dp.step(optimizer)
        if step in (1, args.steps) and rank == 0:
            print(f"step {step:3d} | loss {loss.item():.4f}")
    weights = weights_of(dp, model)
    diff = max_param_difference(weights)
    if not args.broadcast:
        moved = max_param_difference([w.detach() - s for w, s in zip(weights, start)])
        if rank == 0:
            print(
                f"no broadcast: the ranks started {before:.6g} apart and end {diff:.6g} apart; their moves differ by "
                f"{moved:.3g} | lr {args.lr:g}, weight decay {args.weight_decay:g}"
            )
    if rank == 0:
        print(
            f"after {args.steps} steps: max weight difference between the ranks {diff:.3g} | "
            f"{dp.collectives / args.steps:.0f} collectives per step"
        )
    dist.destroy_process_group()
    return diff


def run(rung_cls, doc: str) -> None:
    """A rung script's entry point: train, a mistake in one paragraph, and an end without the interpreter's teardown
    (where gloo's threads can abort a finished rank)."""

    @main_guard
    def main():
        train(rung_cls, doc)

    run_and_end(main)
