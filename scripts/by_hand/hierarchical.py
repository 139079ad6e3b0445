"""A rung beside bucketed (chapter 08 builds it), hierarchical: the flat rung, for a cluster of N nodes x g ranks whose
ranks talk fast inside a node (NVLink; the box's loopback) and slowly between nodes (one NIC per node). One flat buffer
of every gradient, as flat; its all-reduce in three parts, so that each rank sends only 1/g of it over the slow link:
reduce-scatter inside the node (local rank l receives shard l, summed over its node), all-reduce of that shard across
the nodes (between the ranks with local rank l, one per node), all-gather of the node's shards inside the node.

    python scripts/cluster/box.py --nodes 2 --ranks-per-node 2 --link 300mbit -- scripts/by_hand/hierarchical.py
    torchrun --nnodes=2 --nproc_per_node=2 ... scripts/by_hand/hierarchical.py --steps 20   (on each node)

Within 1e-6 of torch's DDP in fp32 (in bfloat16, a weight may round to a neighbouring number), and not bit-identical,
because the order of the sums differs and floating-point addition is not associative: this rung adds each node's ranks
first and then the nodes' sums, ((g0 + g1) + (g2 + g3)); gloo's ring, under torch's DDP, adds the four around the ring
one after another, starting from a different rank for each chunk. With 2 ranks in all (2 nodes x 1, or 1 node x 2) the
sums are the same: bit-identical. The divide (by the world size, a power of 2 here) is exact
wherever it happens.
"""
import torch
import torch.distributed as dist

from distrinews_course.by_hand.nodes import Nodes
from distrinews_course.by_hand.rung import Rung, one_dtype


class HierarchicalDP(Rung):
    """One flat buffer of every gradient, averaged in two levels: inside the node, across the nodes, inside again."""

    def __init__(self, model, bucket_mb=None, broadcast=True, timeline=None, ranks_per_node=None):
        super().__init__(model, bucket_mb, broadcast, timeline)
        self.nodes = Nodes(ranks_per_node)  # this rank's node; its node's group (intra), its group across (cross)
        self.dtype = one_dtype(self.params)
        self.numel = sum(p.numel() for p in self.params)
        self.shard_size = -(-self.numel // self.nodes.per_node)  # padded: every rank of a node gets the same length

    def sync_gradients(self):
        flat = torch.zeros(self.shard_size * self.nodes.per_node, dtype=self.dtype)
        torch.cat([p.grad.reshape(-1) for p in self.params], out=flat[:self.numel])  # one message, as flat
        shard = torch.empty(self.shard_size, dtype=self.dtype)
        with self.timeline.span("comm_sync", "reduce-scatter inside the node"):
            dist.reduce_scatter_tensor(shard, flat, group=self.nodes.intra)  # shard l, summed over this node only
        across_nodes(self, shard, flat)
        self.collectives += 3
        offset = 0
        for p in self.params:  # the averages back into the gradients
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def across_nodes(dp, shard, flat):
    """shard holds this rank's shard of the gradients, summed over its node. Average it over every rank: divide it by
    the world size, sum it across the nodes (the ranks with this local rank hold the same shard of their own node's
    sum), then all-gather the node's averaged shards into flat, in local-rank order."""
    shard.div_(dp.world)  # divide, as torch's DDP does (by a power of 2 here: exact, before or after the sums)
    with dp.timeline.span("comm_sync", "all-reduce across the nodes"):
        dist.all_reduce(shard, group=dp.nodes.cross)  # the only bytes on the slow link: 1/g of the buffer per rank
    with dp.timeline.span("comm_sync", "all-gather inside the node"):
        dist.all_gather_into_tensor(flat, shard, group=dp.nodes.intra)


if __name__ == "__main__":
    from distrinews_course.by_hand import harness  # the run around the idea: data, loop, closing check

    harness.run(HierarchicalDP, __doc__)
