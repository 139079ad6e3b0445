"""HSDP by hand (chapter 08 builds it): ZeRO-3 inside each node, replicated across the nodes. A cluster of N nodes x g
ranks; each block of the model is sharded over the g ranks of a node only (rung 7, zero3.py, with its shard group
the node's), so its all-gathers and reduce-scatters stay on the fast level; each node holds a whole copy of the model,
and after backward each rank all-reduces its shard of the gradients with the ranks that hold the same shard on the
other nodes (the same local rank): the only bytes on the slow link, 1/g of the gradients per rank.
What FSDP2 calls hybrid sharding: fully_shard on a 2-D mesh (replicate, shard).

    python scripts/cluster/box.py --nodes 2 --ranks-per-node 2 --link 300mbit -- scripts/by_hand/hsdp.py --steps 20
"""
import torch.distributed as dist
from zero3 import Zero3DP  # rung 7, unchanged (its folder is on the path of a script)

from distrinews_course.by_hand.nodes import Nodes


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
    dp.nodes = Nodes(dp.ranks_per_node)
    return dp.nodes.intra


def replicate(dp) -> int:
    """After the reduce-scatters inside the node, each rank holds its shard of every block's gradient summed over its
    node (b.shard.grad, already divided by the world size). The ranks with the same local rank hold the same shard of
    their own node's sum: sum each shard's gradient over them, in place, every all-reduce launched before any is waited
    for. Returns how many it launched."""
    pending = []
    for b in dp.blocks:
        if b.shard.grad is not None:  # a block whose parameters are all frozen has none
            work = dist.all_reduce(b.shard.grad, group=dp.nodes.cross, async_op=True)
            pending.append(dp.timeline.comm(work, f"grads {b.name} across the nodes", b.shard.grad.nbytes))
    for work in pending:
        work.wait()
    return len(pending)

if __name__ == "__main__":
    from distrinews_course.by_hand import harness  # the run around the idea: data, loop, closing check

    harness.run(HSDP, __doc__)
