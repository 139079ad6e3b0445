"""The measuring half of chapter 00's scripts/concepts/04_checkpoint.py, kept out of the script so that it shows the
checkpoint: one writer, the unwrapped model, an atomic save, a barrier, and map_location on load.

    apart = Apart()                       apart("at_wrap", ddp): how far this rank's weights are from rank 0's, noted
    train_a_little(ddp, opt, steps=3)     a few steps on each rank's own random data: the weights move
    report(out, ctx, ckpt, apart, trained=ddp, loaded=fresh, optimizers=(opt, opt2))   rank 0 writes every rank's
                                          figures (the notebook checks)
"""

from __future__ import annotations

import os

import torch

from distrinews_lib.distributed import max_param_difference

from .demo import gather, write_json


class Apart:
    """The largest difference between this rank's weights and rank 0's (maxed over ranks: 0.0 means identical
    everywhere), noted under a name at each moment the script asks: before the wrap, right after it, after loading."""

    def __init__(self):
        self.seen: dict[str, float] = {}

    def __call__(self, name: str, model) -> float:
        self.seen[name] = max_param_difference(model)
        return self.seen[name]


def train_a_little(ddp, opt, steps: int = 3, batch: int = 8) -> None:
    """A few optimizer steps of cross-entropy on random data, different on each rank (the caller's seed): the
    weights move away from their start, so a checkpoint of them is not the initialisation."""
    module = ddp.module if hasattr(ddp, "module") else ddp
    first = next(m for m in module.modules() if isinstance(m, torch.nn.Linear))
    last = [m for m in module.modules() if isinstance(m, torch.nn.Linear)][-1]
    device = first.weight.device
    for _ in range(steps):
        x = torch.randn(batch, first.in_features, device=device)
        y = torch.randint(0, last.out_features, (batch,), device=device)
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        opt.zero_grad()


def optimizer_state(trained_opt, restored_opt) -> dict:
    """How many steps each optimizer has taken (AdamW's per-parameter `step`), and whether the restored one holds
    exactly the trained one's state (every step count and moment, exp_avg and exp_avg_sq, tensor for tensor). An
    optimizer that was never restored has no state: 0 steps, not the same."""

    def steps(opt) -> int:
        return max((int(st["step"]) for st in opt.state_dict()["state"].values()), default=0)

    a, b = trained_opt.state_dict()["state"], restored_opt.state_dict()["state"]
    same = (
        bool(a)
        and a.keys() == b.keys()
        and all(
            a[i].keys() == b[i].keys()
            and all(torch.equal(torch.as_tensor(a[i][k]), torch.as_tensor(b[i][k])) for k in a[i])
            for i in a
        )
    )
    return dict(opt_trained_steps=steps(trained_opt), opt_restored_steps=steps(restored_opt), opt_same=same)


def rank_report(ctx, ckpt: dict, apart: Apart, trained, loaded, optimizers=None) -> dict:
    """This rank's figures: its device and where the loaded tensors landed (map_location), whether the loaded weights
    equal the ones it trained (exactly), how far apart the ranks were at each moment `apart` noted, and (optimizers:
    the trained one and the one restored from the file) whether the optimizer's state came back."""
    module = trained.module if hasattr(trained, "module") else trained
    same = all(torch.equal(a, b) for a, b in zip(loaded.parameters(), module.parameters()))
    first = next(iter(ckpt["model"].values()))
    return dict(
        rank=ctx.rank,
        pid=os.getpid(),
        device=str(ctx.device),
        loaded_on=str(first.device),
        identical=same,
        **(optimizer_state(*optimizers) if optimizers else {}),
        **apart.seen,
    )


def report(out, ctx, ckpt: dict, apart: Apart, trained, loaded, optimizers=None) -> None:
    """Gather every rank's rank_report (with its PID); rank 0 writes them to `out` (JSON) with the checkpoint's keys,
    epoch and writer (the rank and PID the file itself records), and the keys of the DDP wrapper's own state_dict."""
    ranks = gather(rank_report(ctx, ckpt, apart, trained, loaded, optimizers))
    data = {"keys": list(ckpt["model"]), "epoch": ckpt["epoch"], "writer": ckpt.get("writer"), "ranks": ranks}
    write_json(out, {**data, "ddp_keys": list(trained.state_dict())}, ctx.rank)
