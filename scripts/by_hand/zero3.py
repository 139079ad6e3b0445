"""Rung 7 of chapter 03's ladder, ZeRO-3 by hand (what FSDP does): the weights themselves are sharded. The model is cut
into blocks (each transformer layer, and one block for everything outside the layers); a rank keeps only its shard
of each block's flat buffer. A block's full weights are all-gathered just before its forward (the next block's
gather already in flight), freed after it, gathered again before its backward, freed after it; its gradients are
reduce-scattered, so a rank keeps and updates only its shard of those too.

Mixed precision, as FSDP2's MixedPrecisionPolicy: param_dtype=torch.float16 (or bfloat16) gathers each block in that
dtype and runs forward and backward in it, while the shard a rank keeps stays in the model's own dtype (the fp32
master, what the optimizer steps); the gradients are reduce-scattered in reduce_dtype (default: the master's, fp32)
and land on the shard in fp32. Half the bytes per gather, half the memory of a gathered block.

    torchrun --standalone --nproc_per_node=2 scripts/by_hand/zero3.py --steps 20 [--no-broadcast]
"""
import torch
import torch.distributed as dist

from distrinews_course.by_hand.models import layers
from distrinews_course.by_hand.rung import Rung, first_tensor_needing_grad, one_dtype
from distrinews_lib.errors import UserError


class Block:
    """One block's parameters in one flat buffer, `full`, padded to world x shard, in the dtype they compute in: the
    parameters are views into it, and it holds memory only between gather() and free(). `shard` is this rank's slice
    in the parameters' own dtype (the master copy), which the optimizer updates."""

    def __init__(self, name, params, world, rank, dtype, param_dtype):
        self.name, self.params = name, params
        numel = sum(p.numel() for p in params)
        size = -(-numel // world)  # rounded up: padding gives every rank the same length
        master = torch.zeros(size * world, dtype=dtype)
        self.full = torch.zeros(size * world, dtype=param_dtype)
        offset = 0
        for p in params:
            master[offset:offset + p.numel()].copy_(p.detach().reshape(-1))
            p.data = self.full[offset:offset + p.numel()].view_as(p)  # the parameter now lives in the flat buffer
            offset += p.numel()
        self.shard = torch.nn.Parameter(master[rank * size:(rank + 1) * size].clone())
        self.ready = 0  # how many of its gradients this backward has completed
        self.gathering = None  # the work of its all-gather, when one is in flight (a prefetch)

    @property
    def nbytes(self) -> int:
        return self.full.numel() * self.full.element_size()

    def gathered(self) -> bool:
        return self.full.untyped_storage().nbytes() == self.nbytes


class Zero3DP(Rung):
    """Shard the weights too: each block's full weights exist only while it computes (forward, then backward)."""

    def __init__(self, model, bucket_mb=None, broadcast=True, timeline=None, param_dtype=None, reduce_dtype=None):
        super().__init__(model, bucket_mb, broadcast, timeline)
        self.group = self.shard_group()  # the ranks each block is sharded over: every rank here
        rank, world = dist.get_rank(self.group), dist.get_world_size(self.group)
        dtype, stack = one_dtype(self.params), layers(model)
        # forward and backward compute in param_dtype; the gradients are summed in reduce_dtype (the master's own
        # unless said: FSDP2's default is param_dtype, whose 11 bits of fp16 lose what the sum of many ranks adds)
        self.param_dtype, self.reduce_dtype = floating(param_dtype, dtype), floating(reduce_dtype, dtype)
        if self.param_dtype != dtype:
            carried(self.param_dtype, self.group)
        inside = {p for layer in stack for p in layer.parameters()}
        groups = [("the rest", [p for p in self.params if p not in inside])]
        groups += [(f"layer {i}", [p for p in layer.parameters() if p.requires_grad]) for i, layer in enumerate(stack)]
        self.blocks = [Block(name, ps, world, rank, dtype, self.param_dtype) for name, ps in groups]  # frozen: whole
        self.block_of = {p: b for b in self.blocks for p in b.params}
        for b in self.blocks:
            self.free(b)  # from now on a rank holds its shards only
        # Block 0 (embeddings, head) is used first and last in forward; then the layers in order. Backward runs it
        # all in reverse: block 0's head first, the layers from last to first, block 0's embeddings last.
        model.register_forward_pre_hook(lambda m, a: self.before_forward(0))
        model.register_forward_hook(lambda m, a, out: self.after_forward(0, out))
        for i, layer in enumerate(stack, 1):
            layer.register_forward_pre_hook(lambda m, a, i=i: self.before_forward(i))
            layer.register_forward_hook(lambda m, a, out, i=i: self.after_forward(i, out))
        self.arrived = set()  # the parameters that got a gradient in this step (theirs are freed once sent)
        self.pending = []  # (block, this rank's shard of its averaged gradient, work handle)
        for p in self.params:
            p.register_post_accumulate_grad_hook(lambda p: self.on_grad_ready(p))

    def shard_group(self):
        """The group each block is sharded over: None, the default group (every rank). HSDP (chapter 08) shards
        inside a node."""
        return None

    def parameters(self):
        """What an optimizer steps: this rank's master shards (a peer's torch.optim.SGD(dp.parameters()) too)."""
        return iter(master_weights(self))

    def optimizer(self, lr, weight_decay):
        return torch.optim.AdamW(self.parameters(), lr=lr, weight_decay=weight_decay)

    def use(self, i, then=None):
        """Block i is about to compute: wait for its full weights (a prefetch may have them on the way already), and
        start gathering block `then`, the next to compute, so that it arrives while block i computes."""
        b = self.blocks[i]
        if b.gathering is None and not b.gathered():
            b.gathering = self.gather(b)
        if b.gathering is not None:
            b.gathering.wait()
            b.gathering = None
        if not b.gathered():
            raise UserError(f"{b.name} is about to compute, but gather() did not give its full weights their memory "
                            f"back ({b.full.untyped_storage().nbytes()} of {b.nbytes} bytes)")
        if then is not None and self.blocks[then].gathering is None and not self.blocks[then].gathered():
            self.blocks[then].gathering = self.gather(self.blocks[then])

    def gather(self, block):
        if not block.params:  # a block whose parameters are all frozen: nothing sharded, nothing to gather
            return None
        work = gather(block, self)
        self.collectives += 1
        return self.timeline.comm(work, f"gather {block.name}", block.nbytes) if work is not None else None

    def free(self, block):
        free(block)
        if block.params and block.gathered():
            raise UserError(f"free() left {block.name}'s full weights in memory ({block.nbytes / 2**20:.2f} MiB): "
                            "free after use gives that memory back")

    def before_forward(self, i):
        self.use(i, then=i + 1 if i + 1 < len(self.blocks) else None)

    def after_forward(self, i, out):
        self.free(self.blocks[i])  # gathered again just before its backward
        t = first_tensor_needing_grad(out)
        if t is not None:  # called when the gradient reaches the block's output: its backward is next
            t.register_hook(lambda grad: self.before_backward(i))

    def before_backward(self, i):
        # Backward's order: block 0 (the head) first, then the layers from last to first; block 0 stays gathered
        # until its embeddings' gradients, the last of all, so layer 1 prefetches nothing.
        then = {0: len(self.blocks) - 1, 1: None}.get(i, i - 1)
        self.use(i, then=then or None)

    def on_grad_ready(self, param):
        """Called by autograd once param.grad is complete; a block's last one reduce-scatters its gradients and frees
        both its gradients and its full weights (the block's backward is over)."""
        b = self.block_of[param]
        b.ready += 1
        self.arrived.add(param)
        if b.ready < len(b.params):
            return
        b.ready = 0
        self.free(b)  # its backward is over: its full weights go before the reduce-scatter needs memory of its own
        mine, work = reduce_scatter(b, self)
        for p in b.params:
            p.grad = None  # its gradients are in the reduce-scatter's buffer now
        self.collectives += 1
        sent = mine.numel() * mine.element_size() * dist.get_world_size(self.group)  # the whole buffer, as a gather's
        self.pending.append((b, mine, self.timeline.comm(work, f"grads {b.name}", sent)))

    def sync_gradients(self):
        for b in self.blocks:
            b.shard.grad = None
        for b, mine, work in self.pending:
            work.wait()  # a second backward's shard adds to the first's: accumulation comes free
            land(b, mine)
        self.pending, self.arrived = [], set()

    def missing(self):
        return [p for p in self.params if p not in self.arrived]  # theirs are freed once sent: None says nothing

    def full_weights(self) -> list:
        """Every parameter's full master value (every rank's shard gathered in the master's dtype), in
        model.parameters() order: to compare, or to save. Every rank must call it."""
        out = {}
        for b in self.blocks:
            if not b.params:
                continue
            whole = torch.empty(b.full.numel(), dtype=b.shard.dtype)
            dist.all_gather_into_tensor(whole, b.shard.detach(), group=self.group)
            offset = 0
            for p in b.params:
                out[id(p)] = whole[offset:offset + p.numel()].view(p.shape)
                offset += p.numel()
        return [out.get(id(p), p.detach()) for p in self.model.parameters()]  # a frozen one was never sharded


def floating(dtype, default):
    """A floating dtype for the rung's param_dtype or reduce_dtype (default where None); a clear error otherwise."""
    if dtype is None:
        return default
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise UserError(f"param_dtype and reduce_dtype take a floating torch.dtype (torch.float16, torch.bfloat16, "
                        f"torch.float32), not {dtype!r}")
    return dtype


def carried(dtype, group):
    """Every rank of `group` checks, with one element, that its backend all-gathers `dtype` (gloo carries float16 and
    bfloat16 in torch 2.13), and stops with a clear error if not, instead of failing in the first forward."""
    one = torch.zeros(dist.get_world_size(group), dtype=dtype)
    try:
        dist.all_gather_into_tensor(one, one[:1].clone(), group=group)
    except RuntimeError as err:
        raise UserError(f"this process group's backend ({dist.get_backend(group)}) cannot all-gather {dtype}: "
                        f"choose a param_dtype it carries ({' '.join(str(err).split())[:120]})") from None


def gather(block, dp):
    """Before block's forward or backward: give its flat buffer, `full`, back its memory, and all-gather into it every
    rank's shard (over dp.group, the ranks the blocks are sharded over), each cast to dp.param_dtype before it leaves,
    without waiting. Return the work: the rung waits for it just before the block computes."""
    block.full.untyped_storage().resize_(block.nbytes)
    low = block.shard.detach().to(dp.param_dtype)  # a copy only if the dtypes differ: what goes on the wire
    return dist.all_gather_into_tensor(block.full, low, group=dp.group, async_op=True)


def free(block):
    """After block's forward or backward: give the memory of its full weights back (the shard stays). The parameters
    (and what autograd saved of them) keep pointing into the buffer; the next gather() refills it in place."""
    block.full.untyped_storage().resize_(0)


def reduce_scatter(block, dp):
    """After block's backward: its gradients (p.grad of each of block.params, in dp.param_dtype) in one flat buffer of
    dp.reduce_dtype as long as `full` (the padding zeros), divided by dp.world first (as torch's DDP does: every rank
    counts, whatever group holds the shards), reduce-scattered over dp.group without waiting. Return (this rank's
    shard of the sum, the work)."""
    flat = torch.zeros(block.full.numel(), dtype=dp.reduce_dtype)
    torch.cat([p.grad.reshape(-1) for p in block.params], out=flat[:sum(p.numel() for p in block.params)])
    mine = torch.empty(block.shard.numel(), dtype=dp.reduce_dtype)
    work = dist.reduce_scatter_tensor(mine, flat.div_(dp.world), group=dp.group, async_op=True)
    return mine, work


def land(block, mine):
    """Before the optimizer step, once the reduce-scatter is done: `mine`, this rank's shard of the block's averaged
    gradient, becomes the master shard's .grad, in the master's dtype; a second backward of the same step adds to what
    the first left there."""
    grad = mine.to(block.shard.dtype)
    block.shard.grad = grad if block.shard.grad is None else block.shard.grad.add_(grad)


def master_weights(dp) -> list:
    """The tensors an optimizer must step for its update to reach the next forward (dp.parameters() returns them, for
    the rung's AdamW and a peer's own torch.optim.SGD alike)."""
    return [b.shard for b in dp.blocks]


if __name__ == "__main__":
    from distrinews_course.by_hand import harness  # the run around the idea: data, loop, closing check

    harness.run(Zero3DP, __doc__)
