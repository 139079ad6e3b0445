"""Worker (2 gloo ranks): what dcp.async_save's upload thread does to a process group it shares with training. The
thread gathers every rank's plan while the training thread all-reduces; rank 0's thread goes first, rank 1's training
does. On a group of its own (argv[1] == "own") each collective pairs with its like; on the training's group (argv[1]
== "shared") the ranks pair a gather with an all-reduce, and the collectives fail when the 5 s timeout runs out."""

import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=5))
rank = dist.get_rank()
group = dist.new_group(backend="gloo", timeout=timedelta(seconds=5)) if sys.argv[1] == "own" else None
grads, plans, errors = torch.full((1000,), float(rank + 1)), [None, None], []


def upload():  # what async_save's thread does first: gather the plans of every rank
    try:
        dist.all_gather_object(plans, {"rank": rank, "items": list(range(50))}, group=group)
    except RuntimeError as err:
        errors.append(f"plan gather: {str(err).splitlines()[0][:80]}")


thread = threading.Thread(target=upload)
try:
    if rank == 0:
        thread.start()
        time.sleep(0.5)
        dist.all_reduce(grads)
    else:
        dist.all_reduce(grads)
        thread.start()
except RuntimeError as err:
    errors.append(f"all-reduce: {str(err).splitlines()[0][:80]}")
thread.join()
ok = not errors and grads[0].item() == 3.0 and [p["rank"] for p in plans] == [0, 1]
print(f"[rank {rank}] {'paired' if ok else 'failed: ' + '; '.join(errors)}", flush=True)
