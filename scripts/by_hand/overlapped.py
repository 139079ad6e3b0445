"""Rung 3 of chapter 03's ladder, overlapped: each gradient's all-reduce leaves as soon as backward has produced it
(and every one before it in a fixed order, the same on every rank).

    torchrun --standalone --nproc_per_node=2 scripts/by_hand/overlapped.py --steps 20 [--no-broadcast]
"""
import torch
import torch.distributed as dist

from distrinews_course import by_hand
from distrinews_lib.distributed import run_and_end
from distrinews_lib.errors import UserError, main_guard


class DataParallel:
    """Average every gradient over the ranks DURING backward(): a hook launches its async all-reduce once ready."""

    def __init__(self, model, bucket_mb=None, broadcast=True, timeline=None):
        self.model, self.world = model, dist.get_world_size()
        self.params = [p for p in model.parameters() if p.requires_grad]  # a tied weight is listed once
        self.names = by_hand.param_names(model)
        self.timeline = timeline or by_hand.Timeline()
        self.collectives = 0  # collectives launched so far
        if broadcast:  # every rank starts from rank 0's weights (the ranks seeded differently)
            for t in [*model.parameters(), *model.buffers()]:
                dist.broadcast(t.data, src=0)
        self.register_hooks()

    def register_hooks(self):
        """What the hooks keep, and a hook per parameter."""
        self.order = list(reversed(self.params))  # the launch order, the same on every rank: backward's usual one
        self.ready = set()  # the parameters whose gradient this backward has completed
        self.pending = []  # (parameter, work handle), launched in self.order's order
        for p in self.params:  # autograd calls the hook once p.grad holds the whole gradient (tied: both uses summed)
            p.register_post_accumulate_grad_hook(lambda p: on_grad_ready(p, self))

    def sync_gradients(self):
        if len(self.pending) != len(self.params):  # a bad hook: say so on every rank instead of waiting forever
            raise UserError(f"{len(self.params)} gradients, {len(self.pending)} all-reduces launched by the hook: "
                            "on_grad_ready must launch exactly one all-reduce per parameter and keep its handle.")
        for p, work in self.pending:
            work.wait()  # the step needs every average; most have arrived while backward ran
        self.collectives += len(self.pending)
        self.pending, self.ready = [], set()

    def optimizer(self, lr, weight_decay):
        return torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=weight_decay)

    def step(self, optimizer):
        by_hand.stop_unless_every_rank_has(self, [p for p in self.params if p.grad is None])  # on every rank, not one
        self.sync_gradients()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def on_grad_ready(param, dp):
    """Called by autograd as soon as param.grad is complete: launch, without waiting, every all-reduce now due in the
    fixed order. Not in readiness order: gloo pairs the ranks' n-th all-reduces, which must be the same tensor."""
    if param in dp.ready:  # its gradient completed twice: a second backward before the step
        raise UserError(f"a second backward() before step(): {dp.names[param]}'s gradient was already being averaged. "
                        "This rung averages one backward per step: call step() after each backward().")
    dp.ready.add(param)
    while len(dp.pending) < len(dp.order) and dp.order[len(dp.pending)] in dp.ready:
        p = dp.order[len(dp.pending)]  # the next one in the fixed order, and it is ready
        p.grad.div_(dp.world)  # divide first, as torch's DDP does (by 2: exact in fp32)
        work = dist.all_reduce(p.grad, async_op=True)  # returns at once; gloo's thread does the sending
        dp.pending.append((p, dp.timeline.comm(work, dp.names[p], p.grad.nbytes)))


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
