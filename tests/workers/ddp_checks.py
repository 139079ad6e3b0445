"""Run under torchrun with 2 gloo ranks; rank 0 writes a JSON of measurements for tests/test_ddp.py.

1. DDP equivalence: 2 ranks x batch b give the same gradients and, after several AdamW steps, the same
   parameters as 1 process with batch 2b on the same samples.
2. After training, every rank holds identical parameters.
4. evaluate() under DDP on an odd-sized set equals single-process evaluate() of the same weights.
5. A checkpoint saved from the DDP-wrapped model has no `module.` keys and predicts like the model.
"""

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from equivalence import ddp_vs_one_process  # this folder: torchrun puts the script's folder on sys.path
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

from distrinews_lib import checkpoint
from distrinews_lib import distributed as D
from distrinews_lib.data import batching, synthetic, tokenization
from distrinews_lib.data.texts import AG_NEWS_LABELS
from distrinews_lib.models.build import build_model
from distrinews_lib.serving import inference
from distrinews_lib.training import evaluation
from distrinews_lib.training.classify import CLASSIFY
from distrinews_lib.training.config import RunConfig

out_dir = sys.argv[1]
torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
device = torch.device("cpu")
result = {"world_size": world}
try:
    # Deterministic: no dropout, fp64 would hide nothing here; fp32 sums differ only by rounding.
    splits = synthetic.synthetic_agnews(n_train=64, n_test=101, seed=7)
    model, tok, _ = build_model(RunConfig(model="tiny", seed=0), AG_NEWS_LABELS)
    model.config.dropout = 0.0
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    ref = build_model(RunConfig(model="tiny", seed=0), AG_NEWS_LABELS)[
        0
    ]  # same init, for the single-process reference (rank 0)
    ref.load_state_dict(model.state_dict())
    ref.eval(), model.eval()  # eval(): no dropout; the gradients are still computed

    ids = tokenization.tokenize_texts(splits.train_texts, tok, 32, use_cache=False)
    ds = tokenization.TokenizedDataset(ids, splits.train_labels)
    collate = batching.PadCollator(tok.pad_token_id, pad_to_multiple_of=None)
    ddp = DDP(model)
    grad_diffs, param_diffs = ddp_vs_one_process(ddp, model, ref, ds, collate, tok.pad_token_id, rank)
    result["grad_max_diff_per_step"] = grad_diffs
    result["param_max_diff_per_step"] = param_diffs
    result["ranks_max_param_diff"] = D.max_param_difference(ddp)

    # exact evaluation on an odd-sized set (101 texts over 2 ranks: DistributedSampler pads one)
    val_ids = tokenization.tokenize_texts(splits.test_texts, tok, 32, use_cache=False)
    val = tokenization.TokenizedDataset(val_ids, splits.test_labels)
    sampler = DistributedSampler(val, world, rank, shuffle=False)
    loader = batching.make_loader(val, 16, sampler, pad_id=tok.pad_token_id)
    ddp_eval = evaluation.evaluate(ddp, loader, device=device, task=CLASSIFY)
    result["ddp_eval"] = {
        "accuracy": ddp_eval.accuracy,
        "loss": ddp_eval.loss,
        "n": ddp_eval.n,
        "shard_sizes": len(sampler),
    }
    if rank == 0:
        single = evaluation.evaluate(
            model, batching.make_loader(val, 16, pad_id=tok.pad_token_id), device=device, task=CLASSIFY, gather=False
        )
        result["single_eval"] = {"accuracy": single.accuracy, "loss": single.loss, "n": single.n}
        # what a naive average of per-rank accuracies would give (counts the padded example twice)
        result["val_size"] = len(val)

        path = os.path.join(out_dir, "ddp_model.pt")
        checkpoint.save_checkpoint(path, ddp, tok, AG_NEWS_LABELS, {"world_size": world}, 32)
        raw = inference.read_checkpoint(path)
        result["checkpoint_module_keys"] = sum(k.startswith("module.") for k in raw["state_dict"])
        loaded = inference.load_checkpoint(path)
        texts = splits.test_texts[:7]
        p_loaded = inference.predict_proba(loaded, texts)
        enc = tok(texts, truncation=True, max_length=32, padding=True, return_tensors="pt")
        with torch.no_grad():
            p_live = torch.softmax(model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits, -1)
        result["checkpoint_pred_max_diff"] = (p_loaded - p_live).abs().max().item()
        with open(os.path.join(out_dir, "ddp_checks.json"), "w") as f:
            json.dump(result, f, indent=2)
    dist.barrier()
finally:
    dist.destroy_process_group()
