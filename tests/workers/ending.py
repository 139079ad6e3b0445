"""A 2-rank gloo DDP loop that ends one of several ways (tests/test_process_end.py):

ok          the loop finishes and the script simply returns (course/harden.py ends the rank)
raise       rank 1 raises after the loop: the launch must fail, with rank 1's traceback and a non-zero exit
user_error  rank 1 raises a UserError through main_guard: exit code 2 and its message
abort       rank 1 prints some lines, then dies by SIGABRT: the launcher must show rank 1's own last lines
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from distrinews_lib.errors import UserError, main_guard

mode = sys.argv[1]
rank = int(os.environ["RANK"])


@main_guard
def main():
    dist.init_process_group("gloo")
    try:
        model = DDP(torch.nn.Linear(8, 2))
        for _ in range(3):
            model(torch.randn(4, 8)).sum().backward()
        print(f"rank {rank}: loop done", flush=True)
        if rank == 1 and mode == "raise":
            raise ValueError("rank 1 failed on purpose after the loop")
        if rank == 1 and mode == "user_error":
            raise UserError("rank 1 stopped on purpose: a user's mistake")
        if rank == 1 and mode == "abort":
            for i in range(30):
                print(f"rank 1 last words {i}", flush=True)
            os.abort()
        dist.barrier()
    finally:
        if mode not in ("abort",):
            dist.destroy_process_group()


main()
