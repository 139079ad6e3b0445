"""Concept 1: one process per rank, and the all-reduce that averages across them.

torchrun starts WORLD_SIZE copies of this script. Each copy (a rank) reads who it is from
environment variables, joins the process group, and then takes part in collectives: an
all-reduce adds up a tensor held by every rank and gives every rank the total. Dividing by the
world size gives the mean - exactly how DDP averages gradients.
"""

import json
import os
import socket
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from distrinews_lib.distributed import choose_backend, end_process

rank = int(os.environ["RANK"])              # 0 .. WORLD_SIZE-1, unique over all machines
local_rank = int(os.environ["LOCAL_RANK"])  # 0 .. (processes on THIS machine)-1: picks the GPU
world = int(os.environ["WORLD_SIZE"])       # how many processes in total

backend, why = choose_backend("auto")       # nccl if every rank has its own GPU, else gloo
if backend == "nccl":
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
else:
    device = torch.device("cpu")
dist.init_process_group(backend, timeout=timedelta(seconds=60))
try:
    say = lambda text: sys.stdout.write(f"[rank {rank}] {text}\n")  # one write per line: ranks share the terminal
    say(f"pid={os.getpid()} local_rank={local_rank} world_size={world} host={socket.gethostname()} device={device}")

    # 1. all-reduce: every rank holds its own value; SUM gives every rank the total.
    mine = torch.tensor([float(rank + 1)], device=device)  # rank 0 holds 1, rank 1 holds 2, ...
    total = mine.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    mean = total / world

    # 2. Why that is gradient averaging: each rank takes its shard of one global batch and computes
    #    the gradient of its local mean loss. The mean of those gradients (all-reduce / world) equals
    #    the gradient of the loss on the WHOLE batch, as if one process had seen it all.
    torch.manual_seed(0)                            # every rank builds the same global batch...
    X, y = torch.randn(4 * world, 3), torch.randn(4 * world)
    w = torch.zeros(3, requires_grad=True)
    Xs, ys = X[rank::world].to(device), y[rank::world].to(device)   # ...and keeps its own shard
    wd = w.detach().to(device).requires_grad_()
    torch.nn.functional.mse_loss(Xs @ wd, ys).backward()
    local_grad = wd.grad.clone()
    avg_grad = local_grad.clone()
    dist.all_reduce(avg_grad)
    avg_grad /= world
    torch.nn.functional.mse_loss(X @ w, y).backward()                # one process, whole batch
    full_grad = w.grad.to(device)

    say(f"holds {mine.item():.0f}; all-reduce SUM -> {total.item():.0f}, /world -> {mean.item():.2f}; "
        f"local grad {[round(g, 3) for g in local_grad.tolist()]}")
    info = {"rank": rank, "local_rank": local_rank, "world_size": world, "pid": os.getpid(),
            "host": socket.gethostname(), "device": str(device), "backend": backend, "value": mine.item(),
            "sum": total.item(), "mean": mean.item(), "local_grad": local_grad.tolist(),
            "averaged_grad": avg_grad.tolist(), "full_batch_grad": full_grad.tolist(),
            "max_diff_avg_vs_full": float((avg_grad - full_grad).abs().max())}
    everyone = [None] * world
    dist.all_gather_object(everyone, info)          # collect every rank's facts on every rank
    if rank == 0:
        out = Path("outputs/concepts/01_hello_allreduce.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"backend_reason": why, "ranks": everyone}, indent=1))
finally:
    dist.destroy_process_group()
end_process(0)  # end without the interpreter's teardown, where gloo's threads can abort a finished rank
