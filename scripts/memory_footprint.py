"""What each rank holds to train the course's model: parameters, gradients and optimizer state, under plain
DDP, ZeRO-1 (torch's ZeroRedundancyOptimizer), FSDP2 (fully_shard, ZeRO-2-like and ZeRO-3-like) and, where
it is installed, DeepSpeed ZeRO stages 1, 2 and 3.

    torchrun --standalone --nproc_per_node=2 scripts/memory_footprint.py --out outputs/memory_2.json
    python scripts/memory_footprint.py --out outputs/memory_1.json          # a world of one
    ... --model distilbert-base   # DistilBERT-base's shape (66M parameters), random weights

Every variant trains the same model from the same weights on the same batches for --steps AdamW steps
(fp32, dropout off, no weight decay, no clipping, so that the variants must agree), then reports, per rank:
- the bytes of the parameters, gradients and optimizer state this rank holds, measured on the tensors
  themselves: parameters and optimizer state after the last optimizer step, gradients between the last
  backward and that step, when they are all alive (a DTensor or DeepSpeed partition counts its local shard;
  the optimizer state counts AdamW's two moments, and DeepSpeed's fp32 master partition too);
- the peak resident memory of the process during the steps, above what it used before the model existed;
- the time per step;
- the largest difference between its final weights (gathered) and plain DDP's.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from distrinews_lib import distributed as D
from distrinews_lib.bench.provenance import provenance
from distrinews_lib.data import batching, sources, tokenization
from distrinews_lib.data.texts import AG_NEWS_LABELS
from distrinews_lib.data.tokenization import tiny_tokenizer
from distrinews_lib.models.build import build_model
from distrinews_lib.training.config import RunConfig

VARIANTS = ("ddp", "zero1", "fsdp2_reshard_off", "fsdp2_reshard_on", "deepspeed_1", "deepspeed_2", "deepspeed_3")


def rss_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # Linux: the peak (VmHWM) starts again from now
    except OSError:
        pass


def nbytes(t) -> int:
    if t is None:
        return 0
    if hasattr(t, "to_local"):  # a DTensor: only the local shard lives here
        t = t.to_local()
    return t.numel() * t.element_size()


def make_model(name: str, seed: int):
    if name == "tiny":
        model = build_model(RunConfig(model="tiny", seed=seed), AG_NEWS_LABELS)[0]
    else:
        from transformers import AutoModelForSequenceClassification, DistilBertConfig

        torch.manual_seed(seed)
        model = AutoModelForSequenceClassification.from_config(DistilBertConfig(num_labels=4))
    for m in model.modules():  # no dropout: every variant must compute the same thing
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model


def batches(args, rank: int, world: int) -> list:
    """This rank's share of the same global batches in every variant: real AG News texts, fixed order."""
    splits = sources.load_embedded()
    tok = tiny_tokenizer()
    n = args.steps * args.batch * world
    ids = tokenization.tokenize_texts(splits.train_texts[:n], tok, args.max_length)
    ds = tokenization.TokenizedDataset(ids, splits.train_labels[:n])
    collate = batching.PadCollator(tok.pad_token_id, pad_to_multiple_of=None)
    out = []
    for s in range(args.steps):
        start = (s * world + rank) * args.batch
        out.append(collate([ds[i] for i in range(start, start + args.batch)]))
    return out


def loss_of(model, batch):
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return F.cross_entropy(logits.float(), batch["labels"])


def run_torch(variant, args, template, my_batches, world):
    """DDP, ZeRO-1 and FSDP2: the same loop; only the wrapping and the optimizer differ."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = make_model(args.model, args.seed)
    model.load_state_dict(template)
    params = list(model.parameters())
    if variant in ("ddp", "zero1"):
        wrapped = DDP(model) if world > 1 else model
        if variant == "zero1" and world > 1:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            opt = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=args.lr, weight_decay=0.0)
            local_state = lambda: opt.optim.state  # noqa: E731  (only this rank's shard of the moments)
        else:
            opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
            local_state = lambda: opt.state  # noqa: E731
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        reshard = variant == "fsdp2_reshard_on"  # on: ZeRO-3-like (params sharded between uses); off: ZeRO-2-like
        for layer in model.distilbert.transformer.layer:
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
        wrapped, params = model, list(model.parameters())
        opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
        local_state = lambda: opt.state  # noqa: E731
    times = []
    for batch in my_batches:
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_of(wrapped, batch).backward()
        grads = sum(nbytes(p.grad) for p in params)  # between backward and step: every gradient is alive
        opt.step()
        times.append(time.perf_counter() - t)
    held = {"params": sum(nbytes(p) for p in params), "grads": grads,
            "optimizer_state": sum(nbytes(v) for st in local_state().values() for v in st.values() if torch.is_tensor(v))}
    full = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone() for k, v in model.state_dict().items()}
    return held, times, full


def ds_gradient_bytes(opt, params) -> int:
    """The gradients DeepSpeed holds between backward and step: full .grad tensors (stage 1 keeps them
    until the step) plus its reduced, partitioned gradient buffers (stages 2 and 3), counted once each."""
    seen, total = set(), 0
    tensors = [p.grad for p in params]
    for holder in ("averaged_gradients", "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition"):
        found = getattr(opt, holder, None) or {}
        for value in (found.values() if isinstance(found, dict) else found):
            tensors += value if isinstance(value, (list, tuple)) else [value]
    for t in tensors:
        if torch.is_tensor(t) and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += nbytes(t)
    return total


def run_deepspeed(stage, args, template, my_batches, world):
    import deepspeed

    model = make_model(args.model, args.seed)
    model.load_state_dict(template)
    config = {"train_micro_batch_size_per_gpu": args.batch, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True,
              "gradient_clipping": 0.0, "steps_per_print": 10**9, "wall_clock_breakdown": False}
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    engine, opt, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    times = []
    params = list(engine.module.parameters())
    for batch in my_batches:
        t = time.perf_counter()
        loss = loss_of(engine, batch)
        engine.backward(loss)
        grads = ds_gradient_bytes(opt, params)
        engine.step()
        times.append(time.perf_counter() - t)
    inner = opt.optimizer if hasattr(opt, "optimizer") else opt
    masters = getattr(opt, "single_partition_of_fp32_groups", None) or getattr(opt, "fp32_partitioned_groups_flat", None) or []
    held = {"params": sum(nbytes(getattr(p, "ds_tensor", p)) for p in params), "grads": grads,
            "optimizer_state": sum(nbytes(v) for st in inner.state.values() for v in st.values() if torch.is_tensor(v))
            + sum(nbytes(m) for m in masters if not any(m is p for p in params))}
    if stage == 3:
        with deepspeed.zero.GatheredParameters(params):
            full = {k: v.detach().clone() for k, v in engine.module.state_dict().items()}
    else:
        full = {k: v.detach().clone() for k, v in engine.module.state_dict().items()}
    engine.destroy() if hasattr(engine, "destroy") else None
    return held, times, full


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["tiny", "distilbert-base"], default="tiny")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch", type=int, default=8, help="examples per rank and step")
    p.add_argument("--max_length", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's own collectives renamed; not ours to fix
    torch.set_num_threads(1)
    env = D.torchrun_env()
    dist.init_process_group("gloo", init_method=env.init_method, rank=env.rank, world_size=env.world_size,
                            timeout=timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        baseline_mb = rss_mb("VmRSS")
        template = make_model(args.model, args.seed).state_dict()
        my_batches = batches(args, rank, world)
        wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
        try:
            import deepspeed  # noqa: F401
            deepspeed_version = deepspeed.__version__
        except ImportError:
            deepspeed_version = None
        results, reference = {}, None
        for variant in wanted:
            if variant.startswith("deepspeed") and deepspeed_version is None:
                results[variant] = {"skipped": "DeepSpeed is not installed (pip install --no-build-isolation deepspeed)"}
                continue
            gc.collect()
            dist.barrier()
            reset_peak()
            before = rss_mb("VmRSS")
            if variant.startswith("deepspeed"):
                held, times, full = run_deepspeed(int(variant[-1]), args, template, my_batches, world)
            else:
                held, times, full = run_torch(variant, args, template, my_batches, world)
            peak = rss_mb("VmHWM")
            if reference is None:
                reference = full  # the first variant (plain DDP) is the reference for the others
            diff = max(float((full[k].float() - reference[k].float()).abs().max()) for k in reference)
            mine = {**held, "total": sum(held.values()), "peak_rss_above_start_mb": peak - before,
                    "seconds_per_step": sorted(times)[len(times) // 2], "max_weight_diff_vs_first": diff}
            everyone = [None] * world
            dist.all_gather_object(everyone, mine)
            results[variant] = {"per_rank": everyone}
            if rank == 0:
                r = everyone[0]
                print(f"{variant:<18} params {r['params'] / 2**20:7.2f} MB | grads {r['grads'] / 2**20:7.2f} MB | "
                      f"optimizer {r['optimizer_state'] / 2**20:7.2f} MB | total {r['total'] / 2**20:7.2f} MB | "
                      f"peak RSS +{r['peak_rss_above_start_mb']:6.1f} MB | {1000 * r['seconds_per_step']:6.0f} ms/step | "
                      f"weights vs ddp {diff:.1e}", flush=True)
            del full
            gc.collect()
        if rank == 0:
            n_params = sum(v.numel() for v in template.values() if v.is_floating_point())
            out = {"benchmark": "memory", **provenance(), "world_size": world, "model": args.model, "n_params": n_params,
                   "settings": vars(args), "deepspeed": deepspeed_version, "start_rss_mb": baseline_mb,
                   "results": results}
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(out, indent=1, default=str))
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
