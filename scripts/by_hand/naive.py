"""Rung 1 of chapter 03's ladder, naive data parallelism: after backward(), one all-reduce per gradient.

    torchrun --standalone --nproc_per_node=2 scripts/by_hand/naive.py --steps 20 [--no-broadcast]
"""
import torch
import torch.distributed as dist

from distrinews_course import by_hand
from distrinews_lib.distributed import run_and_end
from distrinews_lib.errors import main_guard


class DataParallel:
    """Average every gradient over the ranks after backward(): one blocking all-reduce per parameter."""

    def __init__(self, model, bucket_mb=None, broadcast=True, timeline=None):
        self.model, self.world = model, dist.get_world_size()
        self.params = [p for p in model.parameters() if p.requires_grad]  # a tied weight is listed once
        self.names = by_hand.param_names(model)
        self.timeline = timeline or by_hand.Timeline()
        self.collectives = 0  # collectives launched so far
        if broadcast:  # every rank starts from rank 0's weights (the ranks seeded differently)
            for t in [*model.parameters(), *model.buffers()]:
                dist.broadcast(t.data, src=0)

    def optimizer(self, lr, weight_decay):
        return torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=weight_decay)

    def sync_gradients(self):
        for p in self.params:
            p.grad.div_(self.world)  # divide first, as torch's DDP does (by 2: exact in fp32)
            with self.timeline.span("comm_sync", self.names[p]):
                dist.all_reduce(p.grad)  # SUM over the ranks, in place; blocks until done
            self.collectives += 1

    def step(self, optimizer):
        by_hand.stop_unless_every_rank_has(self, [p for p in self.params if p.grad is None])  # on every rank, not one
        self.sync_gradients()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


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
