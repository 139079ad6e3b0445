"""Rung 4 of chapter 03's ladder, bucketed: gradients grouped, in reverse order, into buckets of --bucket_mb MiB (closed
once they hold at least that, as torch's DDP's are); a bucket leaves once complete, in the same order on every rank.

    torchrun --standalone --nproc_per_node=2 scripts/by_hand/bucketed.py --steps 20 --bucket_mb 1 [--no-broadcast]
"""
import torch
import torch.distributed as dist

from distrinews_course import by_hand
from distrinews_lib.distributed import run_and_end
from distrinews_lib.errors import UserError, main_guard


class DataParallel:
    """Average the gradients DURING backward(), a bucket at a time: fewer, larger messages, still overlapped."""

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
        self.register_hooks()

    def register_hooks(self):
        """What the hooks keep, and a hook per parameter."""
        self.bucket_of = {p: i for i, b in enumerate(self.buckets) for p in b}
        self.ready = [0] * len(self.buckets)  # how many of each bucket's gradients this backward has completed
        self.pending = []  # (flat buffer, work handle), launched in bucket order (0, 1, 2...) on every rank
        for p in self.params:  # autograd calls the hook once p.grad holds the whole gradient (tied: both uses summed)
            p.register_post_accumulate_grad_hook(lambda p: on_grad_ready(p, self))

    def launch(self, i):
        """Bucket i is complete: copy its gradients into one buffer and start averaging it."""
        flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[i]]).div_(self.world)  # divide first, as DDP
        work = dist.all_reduce(flat, async_op=True)
        self.pending.append((flat, self.timeline.comm(work, f"bucket {i}", flat.nbytes)))

    def sync_gradients(self):
        if len(self.pending) != len(self.buckets):  # a bad bookkeeping: say so on every rank instead of waiting forever
            raise UserError(f"bucket {len(self.pending)} was never launched: on_grad_ready must launch bucket i once "
                            "its last gradient is ready.")
        for i, (flat, work) in enumerate(self.pending):
            work.wait()
            offset = 0
            for p in self.buckets[i]:  # the averages back into the gradients
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        self.collectives += len(self.pending)
        self.pending, self.ready = [], [0] * len(self.buckets)

    def optimizer(self, lr, weight_decay):
        return torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=weight_decay)

    def step(self, optimizer):
        by_hand.stop_unless_every_rank_has(self, [p for p in self.params if p.grad is None])  # on every rank, not one
        self.sync_gradients()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


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
    if dp.ready[i] > len(dp.buckets[i]):  # more gradients than the bucket holds: a second backward before the step
        raise UserError(f"a second backward() before step(): bucket {i} had already been averaged. This rung averages "
                        "one backward per step: call step() after each backward().")
    while len(dp.pending) < len(dp.buckets) and dp.ready[len(dp.pending)] == len(dp.buckets[len(dp.pending)]):
        dp.launch(len(dp.pending))  # the next bucket in the fixed order is complete: launch it (the same on every rank)


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
