"""Pitfall 6: evaluation that counts DistributedSampler's padding.

DistributedSampler gives every rank the same number of samples; when N is not a multiple of the
world size it PADS by repeating the first samples. Summing correct/total over ranks then counts
those samples twice: the total is wrong and so is the accuracy. Fix: gather (dataset index,
correct) from every rank and drop the repeated indices (distrinews_lib.training.evaluation.evaluate does this).
"""

import argparse
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from distrinews_course.demo import finish, gather, result, start, write_json
from distrinews_lib.training.classify import CLASSIFY
from distrinews_lib.training.evaluation import evaluate

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["broken", "fixed", "both"], default="both")
p.add_argument("--n", type=int, default=0, help="evaluation samples (default: 4 * world_size + 1, never a multiple)")
p.add_argument("--out", default="outputs/pitfalls/06_eval_padding.json")
args = p.parse_args()

ctx = start()
N = args.n or 4 * ctx.world + 1


class EvalSet(Dataset):
    """N samples; label i % 4. Batches look like the course's: input_ids, attention_mask, labels, index."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return {"input_ids": torch.tensor([i]), "attention_mask": torch.tensor([1]),
                "labels": torch.tensor(i % 4), "index": torch.tensor(i)}


class StandIn(torch.nn.Module):
    """A stand-in classifier we can reason about: right on even samples, wrong on odd ones."""

    def forward(self, input_ids, attention_mask=None):
        i = input_ids[:, 0]
        pred = torch.where(i % 2 == 0, i % 4, (i + 1) % 4)
        return SimpleNamespace(logits=F.one_hot(pred, 4).float())


model = StandIn().to(ctx.device)
sampler = DistributedSampler(EvalSet(), shuffle=False)  # pads to a multiple of the world size
loader = DataLoader(EvalSet(), batch_size=4, sampler=sampler)
dev = ctx.device

# The truth: one process over the whole set.
full = next(iter(DataLoader(EvalSet(), batch_size=N)))
truth = float((model(full["input_ids"].to(dev)).logits.argmax(-1).cpu() == full["labels"]).double().mean())

report = {"n": N, "world_size": ctx.world, "padded_to": len(sampler) * ctx.world, "truth_accuracy": truth}
for mode in (["broken", "fixed"] if args.mode == "both" else [args.mode]):
    idx, correct = [], []
    for batch in loader:
        pred = model(batch["input_ids"].to(dev)).logits.argmax(-1).cpu()
        idx += batch["index"].tolist()
        correct += (pred == batch["labels"]).tolist()
    if mode == "broken":
        counts = torch.tensor([sum(correct), len(correct)], dtype=torch.float64, device=dev)
        dist.all_reduce(counts)                      # BUG: sums the padded duplicates too
        n_counted, acc = int(counts[1]), float(counts[0] / counts[1])
    else:
        every = gather(list(zip(idx, correct)))  # THE FIX: gather every rank's (index, correct) pairs
        pairs = dict(p for rank_pairs in every for p in rank_pairs)  # THE FIX: one vote per index
        n_counted, acc = len(pairs), sum(pairs.values()) / len(pairs)  # THE FIX: accuracy over the indices
        report["library_evaluate_accuracy"] = evaluate(model, loader, device=dev, task=CLASSIFY).accuracy
    result(ctx, mode=mode, counted=n_counted, accuracy=f"{acc:.4f}", truth=f"{truth:.4f}", my_indices=idx)
    report[mode] = {"counted": n_counted, "accuracy": acc}
write_json(args.out, report, ctx.rank)
finish()
