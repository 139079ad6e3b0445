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

from distrinews_course.by_hand import harness
from distrinews_course.by_hand.nodes import Nodes


class HSDP(Zero3DP):
    """ZeRO-3 with its blocks sharded inside the node; the gradient shards all-reduced across the nodes."""

    def __init__(self, model, bucket_mb=None, broadcast=True, timeline=None, ranks_per_node=None):
        self.ranks_per_node = ranks_per_node
        super().__init__(model, bucket_mb, broadcast, timeline)

    def shard_group(self):
        """Shard each block over this rank's node: gather, free and reduce-scatter never leave the node."""
        self.nodes = Nodes(self.ranks_per_node)  # this rank's node (intra) and its group across the nodes (cross)
        return self.nodes.intra

    def sync_gradients(self):
        super().sync_gradients()  # each rank: its shard of every block's gradient, summed over its node only
        pending = []
        for b in self.blocks:
            if b.shard.grad is not None:  # the same shard on every node: sum it over the nodes, in place
                work = dist.all_reduce(b.shard.grad, group=self.nodes.cross, async_op=True)
                pending.append(self.timeline.comm(work, f"grads {b.name} across the nodes", b.shard.grad.nbytes))
        for work in pending:
            work.wait()
        self.collectives += len(pending)


if __name__ == "__main__":
    harness.run(HSDP, __doc__)
