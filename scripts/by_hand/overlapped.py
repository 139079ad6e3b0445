"""Rung 3 of chapter 03's ladder, overlapped: each gradient's all-reduce leaves as soon as backward has produced it.

    torchrun --standalone --nproc_per_node=2 scripts/by_hand/overlapped.py --steps 20 [--no-broadcast]
"""
import torch
import torch.distributed as dist

from distrinews_lib.course import by_hand
from distrinews_lib.distributed import run_and_end
from distrinews_lib.errors import UserError, main_guard


class DataParallel:
    """Average every gradient over the ranks DURING backward(): a hook launches its async all-reduce when it is ready."""

    def __init__(self, model, bucket_mb=None, broadcast=True, timeline=None):
        self.model, self.world = model, dist.get_world_size()
        self.params = [p for p in model.parameters() if p.requires_grad]  # a tied weight is listed once
        self.names = by_hand.param_names(model)
        self.timeline = timeline or by_hand.Timeline()
        self.collectives = 0  # collectives launched so far
        if broadcast:  # every rank starts from rank 0's weights (the ranks seeded differently)
            for t in [*model.parameters(), *model.buffers()]:
                dist.broadcast(t.data, src=0)
        self.pending = []  # (parameter, work handle) of the all-reduces launched during this backward
        for p in self.params:  # autograd calls the hook once p.grad holds the whole gradient (tied: both uses summed)
            p.register_post_accumulate_grad_hook(lambda p: on_grad_ready(p, self))

    def optimizer(self, lr, weight_decay):
        return torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=weight_decay)

    def sync_gradients(self):
        launched = [id(p) for p, _ in self.pending]
        missing = [self.names[p] for p in self.params if id(p) not in launched]
        if missing or len(launched) != len(self.params):  # a bad hook: say so on every rank instead of waiting forever
            raise UserError(f"{len(self.params)} gradients, {len(launched)} all-reduces launched by the hook"
                            + (f"; never launched: {', '.join(missing[:3])}" if missing else "; some more than once")
                            + ". on_grad_ready must launch exactly one all-reduce per parameter and keep its handle.")
        for p, work in self.pending:
            work.wait()  # the step needs every average; most have arrived while backward ran
        self.collectives += len(self.pending)
        self.pending = []

    def step(self, optimizer):
        self.sync_gradients()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def on_grad_ready(param, dp):
    """Called by autograd as soon as param.grad is complete: start averaging it, do not wait."""
    param.grad.div_(dp.world)  # divide first, as torch's DDP does (by 2: exact in fp32)
    work = dist.all_reduce(param.grad, async_op=True)  # returns at once; gloo's thread does the sending
    dp.pending.append((param, dp.timeline.comm(work, dp.names[param], param.grad.nbytes)))


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
