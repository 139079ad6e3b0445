"""Exercise: average the gradients across ranks by hand, as DDP does in backward(), and compare with DDP.

The notebook writes the learner's function average_gradients(model, world) to a file and launches:
    torchrun --nproc_per_node=2 scripts/concepts/05_average_by_hand.py --solution FILE.py --out OUT.json
Every rank computes its local gradients on its own data, calls average_gradients, and compares the result
with what DDP computed from the same data and weights: equal means the function did what DDP does.
"""

import argparse
import runpy

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from distrinews_course.demo import finish, gather, start, write_json

p = argparse.ArgumentParser()
p.add_argument("--solution", required=True, help="a .py file defining average_gradients(model, world)")
p.add_argument("--out", default="outputs/concepts/05_average_by_hand.json")
args = p.parse_args()

ctx = start(timeout_s=15)  # a collective the function calls on one rank only fails in seconds, not minutes
average_gradients = runpy.run_path(args.solution)["average_gradients"]


def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)).to(ctx.device)


torch.manual_seed(100 + ctx.rank)  # each rank: its own data
x = torch.randn(6, 8, device=ctx.device)
ddp = DDP(make(), device_ids=ctx.device_ids)
ddp(x).pow(2).mean().backward()
want = torch.cat([q.grad.reshape(-1) for q in ddp.parameters()])   # what DDP averaged
plain = make()
plain(x).pow(2).mean().backward()
local = torch.cat([q.grad.reshape(-1) for q in plain.parameters()])
summed = local.clone()
dist.all_reduce(summed)
error = None
try:
    average_gradients(plain, ctx.world)
except Exception as err:  # reported to the notebook in one line
    error = f"{type(err).__name__}: {err}"
got = (torch.cat([q.grad.reshape(-1) for q in plain.parameters()])
       if all(q.grad is not None for q in plain.parameters()) else None)
diff = lambda a: None if got is None else float((got - a).abs().max())
report = {"rank": ctx.rank, "error": error, "vs_ddp": diff(want), "vs_sum": diff(summed), "vs_local": diff(local)}
write_json(args.out, {"world_size": ctx.world, "ranks": gather(report)}, ctx.rank)
del ddp
finish()
