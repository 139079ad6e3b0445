"""Pitfall 12: BatchNorm without SyncBatchNorm.

BatchNorm normalises with the mean and variance of the batch it sees, and keeps running averages of
them for evaluation. Under DDP each rank sees only its own per-rank batch: every rank normalises
with statistics of a few samples (noisier still with the small per-GPU batches of detection or
segmentation), and keeps running statistics that differ from rank to rank and from the global
batch's. The model trains as if the batch were the per-rank batch. Fix:
nn.SyncBatchNorm.convert_sync_batchnorm(model) before wrapping in DDP: each BatchNorm layer
all-reduces its statistics, so every rank normalises with the global batch's, as one process
holding the whole batch would. PyTorch's SyncBatchNorm runs on GPUs only (DDP refuses it on CPU
modules), so on CPU (gloo) the script swaps in the same computation written out (GlooSyncBatchNorm),
and the fix can be seen anywhere.
"""

import argparse

import torch
import torch.distributed as dist
from torch.distributed._functional_collectives import all_reduce  # differentiable: gradients flow back
from torch.nn.parallel import DistributedDataParallel as DDP

from distrinews_course.demo import finish, gather, result, start, write_json

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["broken", "fixed", "both"], default="both")
p.add_argument("--batch", type=int, default=4, help="samples per rank and step (small, as per GPU in detection)")
p.add_argument("--steps", type=int, default=20)
p.add_argument("--out", default="outputs/pitfalls/12_batchnorm.json")
args = p.parse_args()

ctx = start()


class GlooSyncBatchNorm(torch.nn.BatchNorm1d):
    """SyncBatchNorm's maths for CPU tensors: the per-channel sum, sum of squares and count are
    all-reduced (differentiably), which gives every rank the global batch's mean and variance."""

    def forward(self, x):
        if not self.training:
            return super().forward(x)  # evaluation: the running statistics, nothing to synchronise
        c = x.shape[1]
        count = torch.tensor([float(x.shape[0])], device=x.device)
        total = all_reduce(torch.cat([x.sum(0), (x * x).sum(0), count]), "sum", dist.group.WORLD)
        n = total[-1]
        mean = total[:c] / n
        var = total[c:2 * c] / n - mean * mean      # the batch variance used to normalise
        with torch.no_grad():
            self.num_batches_tracked += 1
            self.running_mean.lerp_(mean, self.momentum)
            self.running_var.lerp_(var * n / (n - 1), self.momentum)  # unbiased, as BatchNorm keeps it
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                               torch.nn.Linear(8, 3)).to(ctx.device)


def global_batch(step):
    """The step's global batch, the same on every rank (each rank then keeps its shard)."""
    g = torch.Generator().manual_seed(step)
    x = torch.randn(args.batch * ctx.world, 6, generator=g) * 2 + 1
    return x.to(ctx.device), torch.randint(0, 3, (len(x),), generator=g).to(ctx.device)


def train(model, shard: bool):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(args.steps):
        x, y = global_batch(step)
        if shard:
            x, y = x[ctx.rank::ctx.world], y[ctx.rank::ctx.world]
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    bn = next(m for m in model.modules() if isinstance(m, (torch.nn.BatchNorm1d, torch.nn.SyncBatchNorm)))
    return {"running_mean": bn.running_mean.tolist(), "running_var": bn.running_var.tolist(), "type": type(bn).__name__,
            "weights": torch.cat([p_.detach().reshape(-1) for p_ in model.parameters()]).tolist()}


def max_diff(a, b):
    return max(abs(u - v) for u, v in zip(a, b))


reference = train(make_model(), shard=False)  # one process holding every step's whole global batch
report = {"world_size": ctx.world, "backend": ctx.backend, "batch_per_rank": args.batch, "steps": args.steps,
          "reference": reference}
for mode in (["broken", "fixed"] if args.mode == "both" else [args.mode]):
    model = make_model()
    if mode == "fixed":
        if ctx.device.type == "cuda":
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)  # THE FIX, before the DDP wrap
        else:                                      # on CPU: the same maths, in the same place
            for m in model.modules():
                if isinstance(m, torch.nn.BatchNorm1d):
                    m.__class__ = GlooSyncBatchNorm  # THE FIX's CPU stand-in: DDP refuses SyncBatchNorm on CPU
    ddp = DDP(model, device_ids=ctx.device_ids)  # BUG in broken mode: its BatchNorm layers were not converted
    stats = gather(train(ddp, shard=True))
    between = max(max_diff(s["running_mean"], stats[0]["running_mean"]) for s in stats)
    to_global = max(max_diff(s["running_mean"], reference["running_mean"]) for s in stats)
    var_to_global = max(max_diff(s["running_var"], reference["running_var"]) for s in stats)
    weights_to_global = max(max_diff(s["weights"], reference["weights"]) for s in stats)
    result(ctx, mode=mode, layer=stats[ctx.rank]["type"], mean_diff_between_ranks=f"{between:.2e}",
           mean_diff_to_global=f"{to_global:.2e}")
    report[mode] = {"per_rank": stats, "mean_diff_between_ranks": between, "mean_diff_to_global": to_global,
                    "var_diff_to_global": var_to_global, "weight_diff_to_global": weights_to_global}
    del ddp  # free the DDP model before the process group goes (see distrinews_course.demo.finish)
write_json(args.out, report, ctx.rank)
finish()
