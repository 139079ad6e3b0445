"""Concept 1: one process per rank, and the all-reduce that averages across them.

torchrun starts WORLD_SIZE copies of this script. Each copy (a rank) reads who it is from the environment, joins
the process group, and takes part in collectives: an all-reduce adds up a tensor held by every rank and gives
every rank the total. Dividing by the world size gives the mean: exactly how DDP averages gradients.
"""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from distrinews_course.demo import finish, report
from distrinews_lib.distributed import choose_backend

rank = int(os.environ["RANK"])              # 0 .. WORLD_SIZE-1, unique over all machines
local_rank = int(os.environ["LOCAL_RANK"])  # 0 .. (processes on THIS machine)-1: picks the GPU
world = int(os.environ["WORLD_SIZE"])       # how many processes in total

backend, why = choose_backend("auto")       # nccl if every rank has its own GPU, else gloo
device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
if backend == "nccl":
    torch.cuda.set_device(device)
dist.init_process_group(backend, timeout=timedelta(seconds=60))

# 1. all-reduce: rank r holds r + 1; SUM gives every rank the total.
mine = torch.tensor([float(rank + 1)], device=device)
total = mine.clone()
dist.all_reduce(total, op=dist.ReduceOp.SUM)

# 2. Why that is gradient averaging: each rank computes the gradient of its local mean loss on its shard of
#    one global batch. The mean of those gradients is the gradient of the loss on the WHOLE batch.
torch.manual_seed(0)                                        # every rank builds the same global batch...
X, y = torch.randn(4 * world, 3), torch.randn(4 * world)
w = torch.zeros(3, requires_grad=True)
torch.nn.functional.mse_loss(X[rank::world] @ w, y[rank::world]).backward()   # ...and uses its own shard
local_grad = w.grad.clone()
averaged = local_grad.clone().to(device)
dist.all_reduce(averaged)                                   # SUM over the ranks...
averaged /= world                                           # ...then the mean
w.grad = None
torch.nn.functional.mse_loss(X @ w, y).backward()           # one process, the whole batch

sys.stdout.write(f"[rank {rank}] holds {mine.item():.0f}; all-reduce SUM -> {total.item():.0f}\n")
# for the notebook: every rank's facts, gathered; rank 0 writes them
report("outputs/concepts/01_hello_allreduce.json", why, rank=rank, local_rank=local_rank, world_size=world,
       device=device, value=mine.item(), sum=total.item(),
       local_grad=local_grad, averaged_grad=averaged, full_batch_grad=w.grad)
finish()  # every rank waits, then leaves the process group (dist.destroy_process_group()) and exits
