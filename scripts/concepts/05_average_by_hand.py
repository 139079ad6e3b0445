"""Exercise 1 of chapter 00: average the gradients across ranks by hand, in ONE all-reduce, and compare with DDP.

    torchrun --nproc_per_node=2 scripts/concepts/05_average_by_hand.py --solution A.py [--solution B.py] --out R.json

Each A.py defines average_gradients(model, world). Every rank computes its local gradients on its own data,
calls the function (its dist.all_reduce calls counted), and compares the .grad it leaves with what DDP computed
from the same data and weights. distrinews_course.averaging_exercise reads the report and names the mistake.
"""

import argparse
import runpy

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from distrinews_course.demo import finish, gather, start, write_json

p = argparse.ArgumentParser()
p.add_argument("--solution", action="append", required=True, help="a .py file defining average_gradients")
p.add_argument("--out", default="outputs/concepts/05_average_by_hand.json")
args = p.parse_args()
ctx = start(timeout_s=15)  # a collective the function calls on one rank only fails in seconds, not minutes


def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)).to(ctx.device)


def grads(model):
    return [q.grad.detach().clone() if q.grad is not None else None for q in model.parameters()]


def max_diff(got, want):
    return float(max((a - b).abs().max() for a, b in zip(got, want)))


torch.manual_seed(100 + ctx.rank)  # each rank: its own data
x = torch.randn(6, 8, device=ctx.device)
ddp = DDP(make(), device_ids=ctx.device_ids)
ddp(x).pow(2).mean().backward()
want = grads(ddp)  # what DDP averaged
reports, real_all_reduce = [], dist.all_reduce
for solution in args.solution:
    plain = make()
    plain(x).pow(2).mean().backward()
    local = grads(plain)
    summed = [g.clone() for g in local]
    for g in summed:
        real_all_reduce(g)
    calls, error = [], None

    def counted(tensor, *a, **k):
        calls.append(tensor.numel())
        return real_all_reduce(tensor, *a, **k)

    dist.all_reduce = counted  # the learner's `dist.all_reduce` is this module attribute
    try:
        runpy.run_path(solution)["average_gradients"](plain, ctx.world)
    except Exception as err:  # reported to the notebook in one line
        error = f"{type(err).__name__}: {err}"
    finally:
        dist.all_reduce = real_all_reduce
    got = grads(plain)
    report = {"rank": ctx.rank, "error": error, "all_reduce_numels": calls, "none": sum(g is None for g in got),
              "n_params": len(got), "total_numel": sum(g.numel() for g in want)}
    if not report["none"]:
        flat = lambda gs: torch.cat([g.reshape(-1) for g in gs])
        report.update(vs_ddp=max_diff(got, want), vs_sum=max_diff(got, summed), vs_local=max_diff(got, local),
                      each_vs_ddp=[max_diff([a], [b]) for a, b in zip(got, want)],
                      each_vs_local=[max_diff([a], [b]) for a, b in zip(got, local)],
                      sorted_vs_ddp=float((flat(got).sort().values - flat(want).sort().values).abs().max()))
    reports.append(gather(report))
write_json(args.out, {"world_size": ctx.world, "solutions": args.solution, "reports": reports}, ctx.rank)
del ddp
finish()
