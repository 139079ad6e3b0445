"""Pitfall 11: a parameter that does not take part in every step (find_unused_parameters).

DDP all-reduces a bucket once every gradient in it is ready. A branch skipped on some steps (an
auxiliary head used every other step, a layer dropped at random, an expert no token chose) gets no
gradient, so its bucket never becomes ready: that step's gradients are never averaged, and the NEXT
forward stops with "Expected to have finished reduction in the prior iteration...", naming the
parameters that got no gradient.
Fixes: find_unused_parameters=True - after every forward DDP walks the autograd graph to find the
parameters this step will not use and marks them ready (their zero gradients are all-reduced
anyway); or static_graph=True when the SAME parameters go unused on every step (DDP learns the set
in the first step; a set that changes from step to step is refused).
"""

import argparse
import os
import sys

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from distrinews_course.demo import finish, result, start, write_json
from distrinews_lib.distributed import max_param_difference

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["broken", "fixed"], required=True)
p.add_argument("--steps", type=int, default=8, help="training steps; the auxiliary head is used on odd steps")
p.add_argument("--out", default="outputs/pitfalls/11_unused_parameters_{mode}.json")
args = p.parse_args()

ctx = start()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU())
        self.head = torch.nn.Linear(64, 4)
        self.aux = torch.nn.Linear(64, 1)  # an auxiliary head (a second task), not used on every step

    def forward(self, x, use_aux=True):
        h = self.body(x)
        return self.head(h), (self.aux(h) if use_aux else None)


def counting_allreduce(numbers, bucket):
    numbers.append(bucket.buffer().numel())  # how many gradient numbers this bucket all-reduces
    return default_hooks.allreduce_hook(None, bucket)


def make(**ddp_kwargs):
    torch.manual_seed(0)
    ddp = DDP(Net().to(ctx.device), device_ids=ctx.device_ids, **ddp_kwargs)
    ddp.numbers = []                               # filled by the hook: numbers all-reduced, per bucket
    ddp.register_comm_hook(ddp.numbers, counting_allreduce)
    ddp.opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    ddp.data = torch.Generator().manual_seed(100 + ctx.rank)  # different data per rank
    return ddp


def train_step(ddp, use_aux):
    """One step; returns (numbers all-reduced, names of the parameters that got no gradient)."""
    x = torch.randn(16, 16, generator=ddp.data).to(ctx.device)
    y = torch.randint(0, 4, (16,), generator=ddp.data).to(ctx.device)
    n0 = len(ddp.numbers)
    out, aux = ddp(x, use_aux=use_aux)
    loss = torch.nn.functional.cross_entropy(out, y) + (aux.pow(2).mean() if aux is not None else 0)
    loss.backward()
    no_grad = [name for name, p_ in ddp.module.named_parameters() if p_.grad is None]
    ddp.opt.step()
    ddp.opt.zero_grad(set_to_none=True)
    return sum(ddp.numbers[n0:]), no_grad


aux_on = lambda step: step % 2 == 1               # the auxiliary head: skipped on step 0, 2, 4, ...
if args.mode == "broken":
    ddp = make()                                   # BUG: plain DDP, but aux is not used on every step
    no_grad = []
    try:
        for step in range(args.steps):
            _, no_grad = train_step(ddp, aux_on(step))
        result(ctx, mode="broken", finished=True)
    except RuntimeError as err:                    # raised by the forward AFTER the step that skipped aux
        result(ctx, mode="broken", error=type(err).__name__, failed_at_step=step, no_grad_on_previous_step=no_grad)
        text = " ".join(str(err).split())
        which = text[text.find("Parameter indices"):].split(" In addition")[0] if "Parameter indices" in text else ""
        print(f"[rank {ctx.rank}] {type(err).__name__}: {text.split('. ')[0]}. ... {which}".rstrip(), flush=True)
        sys.stdout.flush()
        os._exit(1)  # exit at once with an error code, as the uncaught error would
else:
    net = Net()
    n_params, n_aux = sum(p_.numel() for p_ in net.parameters()), sum(p_.numel() for p_ in net.aux.parameters())
    ddp = make(find_unused_parameters=True)        # FIX 1: a branch used on some steps only
    unused = [train_step(ddp, aux_on(step)) for step in range(args.steps)]
    unused_diff = max_param_difference(ddp)
    ddp = make(static_graph=True)                  # FIX 2: the same parameters unused on EVERY step
    static = [train_step(ddp, False) for step in range(args.steps)]
    static_diff = max_param_difference(ddp)
    # The walk's cost is time on every step, in proportion to the size of the graph: too little to time on
    # this tiny model, but PyTorch says so itself when the flag is on and nothing was unused (see the output).
    needless = make(find_unused_parameters=True)
    for step in range(2):
        train_step(needless, True)
    result(ctx, mode="fixed", find_unused_numbers=unused[0][0], static_numbers=static[0][0])
    write_json(args.out.format(mode="fixed"), {
        "world_size": ctx.world, "steps": args.steps, "n_params": n_params, "n_aux_params": n_aux,
        "aux_used": [aux_on(s) for s in range(args.steps)],
        "find_unused": {"numbers_per_step": [u[0] for u in unused], "no_grad": [u[1] for u in unused],
                        "max_param_diff": unused_diff},
        "static_graph": {"numbers_per_step": [u[0] for u in static], "max_param_diff": static_diff},
    }, ctx.rank)
    del ddp, needless  # free the DDP models before the process group goes (see distrinews_course.demo.finish)
    finish()
