"""The DDP equivalence loop of ddp_checks.py and custom_ddp_checks.py: the same samples trained as 2 ranks x
batch b (DDP) and, on rank 0, as 1 process with batch 2b, step by step."""

import torch
import torch.nn.functional as F


def logits(model, batch):
    return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


def ddp_vs_one_process(ddp, model, ref, ds, collate, pad_id: int, rank: int, b: int = 4, steps: int = 5):
    """`ddp` wraps `model`; `ref` starts from the same weights. Returns rank 0's largest gradient and parameter
    differences per step (empty lists on the other ranks)."""
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    grad_diffs, param_diffs = [], []
    for step in range(steps):
        # global batch: samples [step*2b, (step+1)*2b); rank r takes its half
        glob = list(range(step * 2 * b, (step + 1) * 2 * b))
        mine = glob[rank * b : (rank + 1) * b]
        # pad every batch to the same width so rank-local and global batches see identical inputs
        width = max(len(ds[i]["input_ids"]) for i in glob)

        def batch_of(idx):
            bt = collate([ds[i] for i in idx])
            pad = width - bt["input_ids"].shape[1]
            return {
                k: (F.pad(v, (0, pad), value=pad_id if k == "input_ids" else 0) if v.ndim == 2 else v)
                for k, v in bt.items()
            }

        bt = batch_of(mine)
        loss = F.cross_entropy(logits(ddp, bt), bt["labels"])
        opt.zero_grad()
        loss.backward()  # DDP averages the gradients over the ranks here
        if rank == 0:
            rb = batch_of(glob)
            rloss = F.cross_entropy(logits(ref, rb), rb["labels"])
            ref_opt.zero_grad()
            rloss.backward()
            grad_diffs.append(
                max((p.grad - q.grad).abs().max().item() for p, q in zip(model.parameters(), ref.parameters()))
            )
        opt.step()
        if rank == 0:
            ref_opt.step()
            param_diffs.append(max((p - q).abs().max().item() for p, q in zip(model.parameters(), ref.parameters())))
    return grad_diffs, param_diffs
