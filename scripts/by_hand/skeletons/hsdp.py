"""Exercise of chapter 08: HSDP by hand, ZeRO-3 inside each node and replicated across the nodes.

N nodes x g ranks. The class is given: it is ZeRO-3 by hand (scripts/by_hand/zero3.py, rung 7) with two changes,
which you write. node_group(): the group each block is sharded over, the ranks of this rank's node, so that every
gather and reduce-scatter stays on the fast level. replicate(): after backward, each rank holds its shard of every
block's gradient summed over its own node; sum it across the nodes, where the same shard lives on the rank with the
same local rank: the only bytes on the slow link, 1/g of the gradients per rank. The checker runs your functions in a
copy of scripts/by_hand/hsdp.py on 2 nodes x 2 ranks against torch's DDP and torch's FSDP2 on a 2-D mesh
(replicate, shard), and names the first mistake it finds. Stuck? exercises.hint("hsdp", 1).
"""
import torch.distributed as dist  # noqa: F401  (for the code you write)
from zero3 import Zero3DP  # rung 7, unchanged (its folder is on the path of a script)

from distrinews_course.by_hand.nodes import Nodes  # noqa: F401  (for the code you write)


class HSDP(Zero3DP):
    """ZeRO-3 with its blocks sharded inside the node; the gradient shards all-reduced across the nodes."""

    def __init__(self, model, bucket_mb=None, broadcast=True, timeline=None, ranks_per_node=None, param_dtype=None,
                 reduce_dtype=None):
        self.ranks_per_node = ranks_per_node
        super().__init__(model, bucket_mb, broadcast, timeline, param_dtype, reduce_dtype)

    def shard_group(self):
        """The group each block is sharded over (Zero3DP asks once, in its constructor)."""
        return node_group(self)

    def sync_gradients(self):
        super().sync_gradients()  # each rank: its shard of every block's gradient, summed over its node only
        self.collectives += replicate(self)


def node_group(dp):
    """Shard each block over this rank's node, so that its gathers, frees and reduce-scatters never leave the node:
    make dp.nodes, the layout (Nodes(dp.ranks_per_node): this rank's node's group, dp.nodes.intra, and its group across
    the nodes, dp.nodes.cross), and return the node's group."""
    raise NotImplementedError


def replicate(dp) -> int:
    """After the reduce-scatters inside the node, each rank holds its shard of every block's gradient summed over its
    node (b.shard.grad, already divided by the world size). The ranks with the same local rank hold the same shard of
    their own node's sum: sum each shard's gradient over them, in place, every all-reduce launched before any is waited
    for. Returns how many it launched."""
    raise NotImplementedError
