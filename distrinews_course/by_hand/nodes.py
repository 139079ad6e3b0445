"""A world of N nodes x g ranks, as a two-level rung sees it (hierarchical.py, hsdp.py): which node a rank is on, and
the two side groups it talks in. Ranks are numbered node by node, as torchrun --nnodes=N --nproc_per_node=g and the
box number them: node k holds ranks k*g .. k*g+g-1, and rank r is local rank r % g of node r // g.

    nodes = Nodes()                  # the layout from torchrun's LOCAL_WORLD_SIZE (the box sets it too)
    nodes = Nodes(ranks_per_node=2)  # or said outright (a learner's own script, the tests)
    nodes.intra                      # this rank's node: the fast level (NVLink; the box's loopback)
    nodes.cross                      # the ranks with this rank's local rank, one per node: the slow level (the NIC)
"""

from __future__ import annotations

import os
import weakref

import torch
import torch.distributed as dist

from distrinews_lib.errors import UserError

from .rung import agreement_group, group_timeout


class Nodes:
    """This rank's place in N nodes x g ranks, and its two groups (made by every rank together on first use under the
    current default group, then reused: dist.new_group is a collective, and a rung is built many times in a race)."""

    def __init__(self, ranks_per_node: int | None = None):
        if not dist.is_initialized():
            raise UserError(
                "no process group: call torch.distributed.init_process_group (gloo) before wrapping the model, as "
                "torch's DistributedDataParallel needs (torchrun sets the environment it reads)"
            )
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.per_node = layout(self.world, ranks_per_node)
        self.n = self.world // self.per_node
        self.node, self.local = divmod(self.rank, self.per_node)
        self.intra, self.cross = groups(self.per_node)

    def intra_ranks(self, node: int | None = None) -> list[int]:
        node = self.node if node is None else node
        return list(range(node * self.per_node, (node + 1) * self.per_node))

    def cross_ranks(self, local: int | None = None) -> list[int]:
        local = self.local if local is None else local
        return [local + k * self.per_node for k in range(self.n)]


def layout(world: int, ranks_per_node: int | None = None) -> int:
    """Ranks per node: `ranks_per_node`, else torchrun's LOCAL_WORLD_SIZE; every rank must say the same, and the
    world must split into whole nodes. A clear error on every rank otherwise."""
    given = ranks_per_node if ranks_per_node is not None else os.environ.get("LOCAL_WORLD_SIZE")
    if given is None:
        raise UserError(
            "the node layout is unknown: launch with torchrun (--nnodes N --nproc_per_node g sets LOCAL_WORLD_SIZE on "
            "every node, as scripts/cluster/box.py --ranks-per-node does), or pass ranks_per_node=g to the rung"
        )
    try:
        g = int(given)
    except ValueError:
        g = 0
    said = torch.tensor([g], dtype=torch.int64)
    low, high = said.clone(), said.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN, group=agreement_group())
    dist.all_reduce(high, op=dist.ReduceOp.MAX, group=agreement_group())
    if int(low) != int(high):
        raise UserError(
            f"the ranks disagree on the ranks per node ({int(low)} to {int(high)}): a two-level rung needs nodes of "
            "equal size, numbered node by node (give every rank the same ranks_per_node)"
        )
    if g < 1 or world % g:
        raise UserError(
            f"{world} ranks do not split into nodes of {given!r} ranks: give ranks_per_node (or torchrun's "
            f"--nproc_per_node) a whole number that divides the world size {world}"
        )
    return g


_GROUPS = weakref.WeakKeyDictionary()  # default group -> {g: (this rank's node group, its cross-node group)}


def groups(per_node: int):
    """(this rank's node group, its cross-node group) for nodes of `per_node` ranks under the current default group.
    Every rank makes every group, in the same order (new_group requires it), and keeps the two it belongs to."""
    from torch.distributed.distributed_c10d import _get_default_group

    default = _get_default_group()
    made = _GROUPS.setdefault(default, {})
    if per_node not in made:
        world, rank, timeout = dist.get_world_size(), dist.get_rank(), group_timeout(default)
        n = world // per_node
        intra = cross = None
        for k in range(n):
            g = dist.new_group(list(range(k * per_node, (k + 1) * per_node)), backend="gloo", timeout=timeout)
            intra = g if rank // per_node == k else intra
        for local in range(per_node):
            g = dist.new_group([local + k * per_node for k in range(n)], backend="gloo", timeout=timeout)
            cross = g if rank % per_node == local else cross
        made[per_node] = (intra, cross)
    return made[per_node]
