"""2 gloo ranks: a reduce-scatter recorded on chapter 03's timeline, whose waiter thread (the Gantt chart's end of
the transfer) comes late, after the rung has waited and added to the result, as a second backward's gradient does.

gloo's reduce-scatter copies its result into the output inside wait(); the timeline's thread and the rung must share
one wait, or the late one copies again over the sum (tests/test_ddp_by_hand.py). Prints one line per rank."""

import threading
import time
import types

import torch
import torch.distributed as dist

from distrinews_course.by_hand import timeline as tl


class LateThread(threading.Thread):
    """The timeline's waiter, started 0.2 s late: a busy machine's scheduling, made certain."""

    def __init__(self, target, daemon=None):
        super().__init__(target=lambda: (time.sleep(0.2), target()), daemon=daemon)


tl.threading = types.SimpleNamespace(Thread=LateThread, Lock=threading.Lock)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
timeline, wrong = tl.Timeline(), 0
timeline.start()
for i in range(4):
    mine = torch.empty(1000)
    work = dist.reduce_scatter_tensor(mine, torch.full((1000 * world,), float(rank + 1)), async_op=True)
    handle = timeline.comm(work, f"bucket {i}", 4000 * world)
    handle.wait()
    mine.add_(100.0)  # the rung's own use of the result: shard.grad.add_(...) on a second backward
    deadline = time.monotonic() + 10
    while timeline.events[-1]["end"] is None and time.monotonic() < deadline:
        time.sleep(0.01)  # until the late thread has waited too
    assert timeline.events[-1]["end"] is not None, "the timeline never saw the transfer end"
    wrong += int(not torch.all(mine == sum(range(1, world + 1)) + 100.0))
print(f"rank {rank}: {wrong} of 4 results overwritten by a late wait", flush=True)
dist.destroy_process_group()
