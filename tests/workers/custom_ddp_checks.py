"""Run under torchrun with 2 gloo ranks: the custom transformer with the hash tokenizer under DDP.

Every rank hashes the texts itself (no vocabulary is shared, only the algorithm); rank 0 checks that all ranks
got the same ids, then that 2 ranks x batch b give the same gradients, and after 5 AdamW steps the same
parameters, as 1 process with batch 2b on the same samples (the equivalence test of ddp_checks.py, for this
model). Rank 0 writes custom_ddp_checks.json.
"""

import hashlib
import json
import os
import sys
from dataclasses import replace
from datetime import timedelta

import torch
import torch.distributed as dist
from equivalence import ddp_vs_one_process  # this folder: torchrun puts the script's folder on sys.path
from torch.nn.parallel import DistributedDataParallel as DDP

from distrinews_lib import distributed as D
from distrinews_lib.data import batching, sources, tokenization
from distrinews_lib.models.build import build_model
from distrinews_lib.training.config import RunConfig

out_dir = sys.argv[1]
torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
result = {"world_size": world}
try:
    splits = sources.load_embedded()
    texts, labels = splits.train_texts[:64], splits.train_labels[:64]
    cfg = RunConfig(
        model="custom",
        custom_dim=32,
        custom_heads=4,
        custom_ffn=64,
        custom_layers=2,
        custom_dropout=0.0,
        max_length=48,
        hash_buckets=2048,
    )
    model, tok, _ = build_model(replace(cfg, seed=0), splits.label_names)
    ref = build_model(replace(cfg, seed=0), splits.label_names)[0]
    ref.load_state_dict(model.state_dict())

    ids = tokenization.tokenize_texts(texts, tok, cfg.max_length, use_cache=False)  # each rank hashes on its own
    digest = hashlib.sha256(json.dumps(ids).encode()).hexdigest()
    digests = [None] * world
    dist.all_gather_object(digests, digest)
    result["ids_same_on_every_rank"] = len(set(digests)) == 1

    ds = tokenization.TokenizedDataset(ids, labels)
    collate = batching.PadCollator(tok.pad_token_id, pad_to_multiple_of=None)
    ddp = DDP(model)
    grad_diffs, param_diffs = ddp_vs_one_process(ddp, model, ref, ds, collate, tok.pad_token_id, rank)
    result["grad_max_diff_per_step"] = grad_diffs
    result["param_max_diff_per_step"] = param_diffs
    result["ranks_max_param_diff"] = D.max_param_difference(ddp)
    result["embedding_rows"] = model.token_embeddings.weight.shape[0]
    if rank == 0:
        with open(os.path.join(out_dir, "custom_ddp_checks.json"), "w") as f:
            json.dump(result, f, indent=2)
    dist.barrier()
finally:
    dist.destroy_process_group()
