"""Rung 6 of chapter 03's ladder, ZeRO-2 by hand: the bucketed rung, but each bucket is reduce-scattered as it fills
during backward: a rank keeps only its shard of every bucket's gradient (the full gradients are freed), updates only
that shard of the weights, then one all-gather gives every rank every updated weight.

    torchrun --standalone --nproc_per_node=2 scripts/by_hand/zero2.py --steps 20 --bucket_mb 1 [--no-broadcast]
"""
import torch
import torch.distributed as dist

from distrinews_course import by_hand
from distrinews_lib.distributed import run_and_end
from distrinews_lib.errors import UserError, main_guard


class DataParallel:
    """Reduce-scatter the gradients DURING backward(), a bucket at a time; a rank keeps and updates its shard only."""

    def __init__(self, model, bucket_mb=None, broadcast=True, timeline=None):
        self.model, self.world = model, dist.get_world_size()
        self.params = [p for p in model.parameters() if p.requires_grad]  # a tied weight is listed once
        self.names = by_hand.param_names(model)
        self.timeline = timeline or by_hand.Timeline()
        self.collectives = 0  # collectives launched so far
        if broadcast:  # every rank starts from rank 0's weights (the ranks seeded differently)
            for t in [*model.parameters(), *model.buffers()]:
                dist.broadcast(t.data, src=0)
        self.buckets = make_buckets(self.params, (bucket_mb or 25) * 2**20)
        self.dtype = by_hand.one_dtype(self.params)
        # Each bucket padded to a multiple of the world size; rank r owns elements [r * s, (r + 1) * s) of each.
        self.shard_sizes = [-(-sum(p.numel() for p in b) // self.world) for b in self.buckets]
        rank = dist.get_rank()
        self.shards = [torch.nn.Parameter(self.flatten(i, [p.detach() for p in b])[rank * s:(rank + 1) * s].clone())
                       for i, (b, s) in enumerate(zip(self.buckets, self.shard_sizes))]
        self.register_hooks()

    def register_hooks(self):
        """What the hooks keep, and a hook per parameter."""
        self.bucket_of = {p: i for i, b in enumerate(self.buckets) for p in b}
        self.ready = [0] * len(self.buckets)  # how many of each bucket's gradients this backward has completed
        self.arrived = set()  # the parameters that got a gradient in this step (theirs are freed once sent)
        self.launched = 0  # buckets launched in this backward, in bucket order (0, 1, 2...) on every rank
        self.pending = []  # (bucket index, this rank's shard of its average, work handle)
        for p in self.params:  # autograd calls the hook once p.grad holds the whole gradient (tied: both uses summed)
            p.register_post_accumulate_grad_hook(lambda p: on_grad_ready(p, self))

    def flatten(self, i, tensors):
        """Bucket i's tensors in one buffer, padded to world x shard."""
        flat = torch.zeros(self.shard_sizes[i] * self.world, dtype=self.dtype)
        torch.cat([t.reshape(-1) for t in tensors], out=flat[:sum(t.numel() for t in tensors)])
        return flat

    def optimizer(self, lr, weight_decay):
        return torch.optim.AdamW(self.shards, lr=lr, weight_decay=weight_decay)  # state for the shards only

    def launch(self, i):
        """Bucket i is complete: reduce-scatter it (this rank receives the sum of its shard only); free the grads."""
        flat = self.flatten(i, [p.grad for p in self.buckets[i]]).div_(self.world)  # divide first, as DDP
        for p in self.buckets[i]:
            p.grad = None  # from now on this rank holds only its shard of these gradients
        mine = torch.empty(self.shard_sizes[i], dtype=self.dtype)
        work = dist.reduce_scatter_tensor(mine, flat, async_op=True)
        self.pending.append((i, mine, self.timeline.comm(work, f"bucket {i}", flat.nbytes)))

    def sync_gradients(self):
        if self.launched:  # a bad bookkeeping: say so on every rank instead of waiting forever
            raise UserError(f"bucket {self.launched} was never launched: launch bucket i once its last gradient is "
                            "ready.")
        for shard in self.shards:
            shard.grad = None
        for i, mine, work in self.pending:
            work.wait()
            shard = self.shards[i]  # a second backward's shard adds to the first's: accumulation comes free
            shard.grad = mine if shard.grad is None else shard.grad.add_(mine)
        self.collectives += len(self.pending)
        self.pending, self.arrived = [], set()

    def step(self, optimizer):
        by_hand.stop_unless_every_rank_has(self, [p for p in self.params if p not in self.arrived])  # on every rank
        self.sync_gradients()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mine = torch.cat([s.detach() for s in self.shards])  # this rank's shard of every bucket: one message
        everyone = torch.empty(self.world * mine.numel(), dtype=self.dtype)
        with self.timeline.span("comm_sync", "all-gather"):
            dist.all_gather_into_tensor(everyone, mine)
        self.collectives += 1
        everyone, offset = everyone.view(self.world, -1), 0
        for b, s in zip(self.buckets, self.shard_sizes):  # every rank's shard of bucket b, in rank order: bucket b
            flat, start = everyone[:, offset:offset + s].reshape(-1), 0
            for p in b:
                p.data.copy_(flat[start:start + p.numel()].view_as(p))
                start += p.numel()
            offset += s


def make_buckets(params, cap):
    """The parameters in reverse (the order backward usually completes them), cut into buckets: a bucket closes once
    it holds at least `cap` bytes (torch's DDP's rule, and chapter 00's)."""
    buckets, size = [[]], 0
    for p in reversed(params):
        buckets[-1].append(p)
        size += p.numel() * p.element_size()
        if size >= cap:
            buckets.append([])
            size = 0
    return [b for b in buckets if b]


def on_grad_ready(param, dp):
    """Called by autograd as soon as param.grad is complete: count it; launch every bucket now complete, in order."""
    i = dp.bucket_of[param]
    dp.ready[i] += 1
    dp.arrived.add(param)
    while dp.launched < len(dp.buckets) and dp.ready[dp.launched] == len(dp.buckets[dp.launched]):
        dp.launch(dp.launched)  # the next bucket in the fixed order is complete: launch it (the same on every rank)
        dp.launched += 1
    if dp.launched == len(dp.buckets):  # every bucket has left: a second backward starts a new round
        dp.launched, dp.ready = 0, [0] * len(dp.buckets)


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
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
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
