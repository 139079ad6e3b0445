"""Rung 7 of chapter 03's ladder, ZeRO-3 by hand (what FSDP does): the weights themselves are sharded. The model is cut
into blocks (each transformer layer, and one block for everything outside the layers); a rank keeps only its shard
of each block's flat buffer. A block's full weights are all-gathered just before its forward (the next block's
gather already in flight), freed after it, gathered again before its backward, freed after it; its gradients are
reduce-scattered, so a rank keeps and updates only its shard of those too.

    torchrun --standalone --nproc_per_node=2 scripts/by_hand/zero3.py --steps 20 [--no-broadcast]
"""
import torch
import torch.distributed as dist

from distrinews_course import by_hand
from distrinews_lib.distributed import run_and_end
from distrinews_lib.errors import UserError, main_guard


class Block:
    """One block's parameters in one flat buffer, `full`, padded to world x shard: the parameters are views into it,
    and it holds memory only between gather() and free(). `shard` is this rank's slice, which the optimizer updates."""

    def __init__(self, name, params, world, rank, dtype):
        self.name, self.params = name, params
        numel = sum(p.numel() for p in params)
        size = -(-numel // world)  # rounded up: padding gives every rank the same length
        self.full = torch.zeros(size * world, dtype=dtype)
        offset = 0
        for p in params:
            self.full[offset:offset + p.numel()].copy_(p.detach().reshape(-1))
            p.data = self.full[offset:offset + p.numel()].view_as(p)  # the parameter now lives in the flat buffer
            offset += p.numel()
        self.shard = torch.nn.Parameter(self.full[rank * size:(rank + 1) * size].clone())
        self.ready = 0  # how many of its gradients this backward has completed
        self.gathering = None  # the work of its all-gather, when one is in flight (a prefetch)

    @property
    def nbytes(self) -> int:
        return self.full.numel() * self.full.element_size()

    def gathered(self) -> bool:
        return self.full.untyped_storage().nbytes() == self.nbytes


class DataParallel:
    """Shard the weights too: each block's full weights exist only while it computes (forward, then backward)."""

    def __init__(self, model, bucket_mb=None, broadcast=True, timeline=None):
        self.model, self.world = model, dist.get_world_size()
        self.params = [p for p in model.parameters() if p.requires_grad]  # a tied weight is listed once
        self.names = by_hand.param_names(model)
        self.timeline = timeline or by_hand.Timeline()
        self.collectives = 0  # collectives launched so far
        if broadcast:  # every rank starts from rank 0's weights (the ranks seeded differently)
            for t in [*model.parameters(), *model.buffers()]:
                dist.broadcast(t.data, src=0)
        rank, dtype, stack = dist.get_rank(), by_hand.one_dtype(self.params), by_hand.layers(model)
        inside = {p for layer in stack for p in layer.parameters()}
        self.blocks = [Block("the rest", [p for p in self.params if p not in inside], self.world, rank, dtype)]
        self.blocks += [Block(f"layer {i}", list(layer.parameters()), self.world, rank, dtype)
                        for i, layer in enumerate(stack)]
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

    def optimizer(self, lr, weight_decay):
        return torch.optim.AdamW([b.shard for b in self.blocks], lr=lr, weight_decay=weight_decay)

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
        work = gather(block, self)
        self.collectives += 1
        return self.timeline.comm(work, f"gather {block.name}", block.nbytes) if work is not None else None

    def free(self, block):
        free(block)
        if block.gathered():
            raise UserError(f"free() left {block.name}'s full weights in memory ({block.nbytes / 2**20:.2f} MiB): "
                            "free after use gives that memory back")

    def before_forward(self, i):
        self.use(i, then=i + 1 if i + 1 < len(self.blocks) else None)

    def after_forward(self, i, out):
        self.free(self.blocks[i])  # gathered again just before its backward
        t = by_hand.first_tensor_needing_grad(out)
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
        flat = torch.zeros_like(b.full)
        torch.cat([p.grad.reshape(-1) for p in b.params], out=flat[:sum(p.numel() for p in b.params)])
        for p in b.params:
            p.grad = None  # its gradients are in flat now...
        self.free(b)  # ...and its backward is over: both freed before the reduce-scatter needs memory of its own
        mine = torch.empty_like(b.shard)
        work = dist.reduce_scatter_tensor(mine, flat.div_(self.world), async_op=True)  # divide first, as DDP
        self.collectives += 1
        self.pending.append((b, mine, self.timeline.comm(work, f"grads {b.name}", flat.nbytes)))

    def sync_gradients(self):
        for b in self.blocks:
            b.shard.grad = None
        for b, mine, work in self.pending:
            work.wait()  # a second backward's shard adds to the first's: accumulation comes free
            b.shard.grad = mine if b.shard.grad is None else b.shard.grad.add_(mine)
        self.pending, self.arrived = [], set()

    def step(self, optimizer):
        by_hand.stop_unless_every_rank_has(self, [p for p in self.params if p not in self.arrived])  # on every rank
        self.sync_gradients()
        optimizer.step()  # the shards; the next forward gathers the updated weights
        optimizer.zero_grad(set_to_none=True)

    def full_weights(self) -> list:
        """Every parameter's full value (gathered, copied, freed again), in model.parameters() order: to compare."""
        out, collectives = {}, self.collectives  # these gathers are not the training's
        for b in self.blocks:
            work = self.gather(b)
            if work is not None:
                work.wait()
            out.update({id(p): p.detach().clone() for p in b.params})
            self.free(b)
        self.collectives = collectives
        return [out[id(p)] for p in self.model.parameters()]


def gather(block, dp):
    """Before block's forward or backward: give its flat buffer back its memory and all-gather every rank's shard into
    it, without waiting; returns the work (its wait() comes just before the block computes)."""
    block.full.untyped_storage().resize_(block.nbytes)
    return dist.all_gather_into_tensor(block.full, block.shard.detach(), async_op=True)


def free(block):
    """After block's forward or backward: give the memory of its full weights back (the shard stays). The parameters
    (and what autograd saved of them) keep pointing into the buffer; the next gather() refills it in place."""
    block.full.untyped_storage().resize_(0)


@main_guard
def main():
    args = by_hand.parse_args(__doc__)
    rank, world = by_hand.init(args.timeout_s)
    model = by_hand.build_model(args.model, seed=args.seed + rank)  # each rank its own random init, on purpose
    batches = by_hand.batches(args.model, rank, world, args.steps, args.batch_size)  # its own share of the texts
    dp = DataParallel(model, args.bucket_mb, args.broadcast)
    optimizer = dp.optimizer(args.lr, args.weight_decay)
    for step, batch in enumerate(batches, 1):
        loss = model(**batch).loss
        loss.backward()
        dp.step(optimizer)
        if step in (1, args.steps) and rank == 0:
            print(f"step {step:3d} | loss {loss.item():.4f}")
    flat = torch.cat([w.reshape(-1) for w in dp.full_weights()])
    rank0 = flat.clone()
    dist.broadcast(rank0, src=0)
    diff = (flat - rank0).abs().max()
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(f"after {args.steps} steps: max weight difference between the ranks {diff.item():.3g} | "
              f"{dp.collectives / args.steps:.0f} collectives per step")
    dist.destroy_process_group()


if __name__ == "__main__":
    run_and_end(main)  # end without the interpreter's teardown, where gloo's threads can abort a finished rank
