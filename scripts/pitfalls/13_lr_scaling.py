"""Pitfall 13: the same learning rate with an N times larger global batch.

On one GPU you tuned lr for batch B. On N GPUs with the same per-GPU batch, DDP averages N per-rank
gradients: every optimizer step uses a global batch of N*B, and an epoch has N times fewer steps.
With the same lr the model moves about N times less per sample seen: it learns slower per epoch.
The linear scaling rule (Goyal et al., 2017, "Accurate, Large Minibatch SGD"): multiply lr by N
(global batch / the batch lr was tuned for), and warm it up over the first steps, because a large lr
from the very first step can diverge.
Measured on a small synthetic 4-class problem (a linear model, plain SGD): test accuracy and loss
against the number of training samples seen.
"""

import argparse

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from distrinews_course.demo import finish, result, start, write_json

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["broken", "fixed", "both"], default="both")
p.add_argument("--batch", type=int, default=32, help="per-GPU batch, and the batch lr was tuned for on one GPU")
p.add_argument("--lr", type=float, default=0.05, help="the learning rate tuned on one GPU")
p.add_argument("--epochs", type=int, default=1)
p.add_argument("--warmup_steps", type=int, default=3, help="steps of linear warm-up for the scaled lr")
p.add_argument("--out", default="outputs/pitfalls/13_lr_scaling.json")
args = p.parse_args()

ctx = start()
FEATURES, CLASSES = 32, 4
g = torch.Generator().manual_seed(0)  # the same data on every rank
teacher = torch.randn(FEATURES, CLASSES, generator=g)


def make_data(n):
    x = torch.randn(n, FEATURES, generator=g)
    return TensorDataset(x, (x @ teacher + 0.5 * torch.randn(n, CLASSES, generator=g)).argmax(1))


train_set, test_set = make_data(4096), make_data(2048)
x_test, y_test = (t.to(ctx.device) for t in test_set.tensors)


def fit(model, loader, lr, warmup_steps, global_batch, set_epoch=None):
    """Plain SGD; test loss and accuracy after every step, against the samples seen so far."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    warm = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup_steps) if warmup_steps else 1.0)
    curve, step = [], 0
    for epoch in range(args.epochs):
        if set_epoch:
            set_epoch(epoch)
        for x, y in loader:
            torch.nn.functional.cross_entropy(model(x.to(ctx.device)), y.to(ctx.device)).backward()
            opt.step()
            opt.zero_grad()
            warm.step()
            step += 1
            with torch.no_grad():
                logits = model(x_test)
                curve.append([step * global_batch, torch.nn.functional.cross_entropy(logits, y_test).item(),
                              (logits.argmax(1) == y_test).double().mean().item()])
    return curve


def linear_model():
    torch.manual_seed(0)
    return torch.nn.Linear(FEATURES, CLASSES).to(ctx.device)


# What you had: one process, batch B, the lr tuned for it (every rank computes it alone; no DDP).
one = fit(linear_model(), DataLoader(train_set, batch_size=args.batch, shuffle=True,
                                     generator=torch.Generator().manual_seed(1)), args.lr, 0, args.batch)
report = {"world_size": ctx.world, "batch_per_rank": args.batch, "global_batch": args.batch * ctx.world,
          "lr_one_process": args.lr, "n_train": len(train_set), "epochs": args.epochs, "one_process": one}
for mode in (["broken", "fixed"] if args.mode == "both" else [args.mode]):
    sampler = DistributedSampler(train_set, shuffle=True, seed=1)
    loader = DataLoader(train_set, batch_size=args.batch, sampler=sampler)
    lr, warmup = (args.lr, 0) if mode == "broken" else (args.lr * ctx.world, args.warmup_steps)  # THE FIX
    ddp = DDP(linear_model(), device_ids=ctx.device_ids)
    curve = fit(ddp, loader, lr, warmup, args.batch * ctx.world, sampler.set_epoch)
    report[mode] = {"lr": lr, "warmup_steps": warmup, "curve": curve}
    result(ctx, mode=mode, lr=lr, steps=len(curve), test_loss=f"{curve[-1][1]:.3f}", test_acc=f"{curve[-1][2]:.3f}")
    del ddp  # free the DDP model before the process group goes (see distrinews_course.demo.finish)
result(ctx, mode="one_process", lr=args.lr, steps=len(one), test_loss=f"{one[-1][1]:.3f}", test_acc=f"{one[-1][2]:.3f}")
write_json(args.out, report, ctx.rank)
finish()
