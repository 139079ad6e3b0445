"""The two side groups of N nodes x g ranks, made with dist.new_group: each node's ranks (the fast level) and, for each
local rank, the ranks that hold it on every node (the slow level). Each rank all-reduces 4 MiB in each of its two
groups and reads how many bytes its node's link (eth0) sent meanwhile.

    python scripts/cluster/box.py --nodes 2 --ranks-per-node 2 -- scripts/multinode/node_groups.py
"""

import json
import os

import torch
import torch.distributed as dist

from distrinews_course import link
from distrinews_lib.distributed import end_process

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
g = int(os.environ["LOCAL_WORLD_SIZE"])  # ranks per node: torchrun --nproc_per_node (the box sets it too)
n = world // g  # nodes
node, local = divmod(rank, g)  # torchrun numbers the ranks node by node

# new_group is a collective over the default group: EVERY rank makes EVERY group, in the same order, and keeps its own
by_node = [dist.new_group(list(range(k * g, (k + 1) * g))) for k in range(n)]  # node k: ranks k*g .. k*g+g-1
by_local = [dist.new_group([l + k * g for k in range(n)]) for l in range(g)]  # local rank l on every node
groups = {"within": by_node[node], "across": by_local[local]}

row = {"rank": rank, "node": node, "local": local}
for name, group in groups.items():
    x = torch.full((2**20,), float(rank))  # 4 MiB of this rank's number
    sent = link.link_bytes()["tx"]  # what this node's link has sent so far (both its ranks read the same counter)
    dist.barrier()  # every rank has read the counter before any all-reduce starts
    dist.all_reduce(x, group=group)  # SUM over this group's ranks only
    dist.barrier()  # every all-reduce has ended before any rank reads the counter again
    row[name] = {
        "ranks": dist.get_process_group_ranks(group),
        "sum": x[0].item(),
        "link_mib": (link.link_bytes()["tx"] - sent) / 2**20,
    }
print("[groups] " + json.dumps(row), flush=True)
end_process(0)  # end without the interpreter's teardown, where gloo's threads can abort a finished rank
