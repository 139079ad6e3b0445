"""What each rank holds, and its peak, to train the course's model: plain DDP, ZeRO-1 (torch's
ZeroRedundancyOptimizer), FSDP2 (fully_shard, reshard_after_forward on and off) and, where it is installed, DeepSpeed
ZeRO stages 1, 2 and 3; at several batch sizes and sequence lengths, with or without activation recomputation.

    torchrun --standalone --nproc_per_node=2 scripts/memory_footprint.py --out outputs/memory_2.json
    python scripts/memory_footprint.py --out outputs/memory_1.json          # a world of one
    ... --model distilbert-base   # DistilBERT-base's shape (66M parameters), random weights
    ... --runs ddp,ddp+view,ddp@32x128,ddp@32x128+ckpt,fsdp2_reshard_on

A run is VARIANT[@BATCHxSEQ][+ckpt][+view][#K]: the variant, this rank's batch and the sequence length (default
--batch x --max_length), `+ckpt` recomputes each layer's activations in backward (gradient checkpointing), `+view`
builds DDP with gradient_as_bucket_view=True (the gradients live in DDP's buckets instead of beside them), and `#K`
names a repeat of the same run (another fresh process): repeats give a peak's run-to-run spread.

Every run happens in a FRESH process per rank, forked from this one after the imports, so that its peak resident
memory is its own: a process that already ran something keeps the freed memory in its heap, and a later run
would reuse it without raising the peak. Per rank and run it reports:
- the bytes of the parameters, gradients and optimizer state this rank holds, measured on the tensors themselves:
  parameters and optimizer state after the last optimizer step, gradients between the last backward and that step,
  when they are all alive (a DTensor or DeepSpeed partition counts its local shard; the optimizer state counts
  AdamW's two moments, and DeepSpeed's fp32 master partition too);
- the bytes of the activations autograd saved for backward in one forward (counted by a saved-tensors hook);
- the peak resident memory (VmHWM) during the steps above the process's resident memory before the model existed;
- the time per step, wall and this process's CPU seconds (medians), and for plain DDP the FLOPs of one forward and
  backward, counted op by op (torch's FlopCounterMode: what a step computes, however busy the machine); for plain
  DDP with `+ckpt`, recomputation's CPU price in pairs of steps without and with it, one after the other
  (`cpu_ratio_pairs`: a busy machine slows both steps of a pair alike);
- the largest difference between its final weights (gathered) and those of the first run with the same batch
  shape (fp32, dropout off, no weight decay, no clipping: every variant must compute the same thing).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import tempfile
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from distrinews_course.bench.provenance import provenance
from distrinews_course.fresh import in_child
from distrinews_course.memory_probe import (
    VARIANTS,
    batches,
    count_flops,
    ds_gradient_bytes,
    make_model,
    paired_cpu_ratios,
    parse_run,
    settle_allocator,
    step_loop,
    tokenized,
    warm_up,
)
from distrinews_course.proc_self import counted_loss, nbytes, reset_peak, status_mb
from distrinews_lib.distributed import run_and_end


def run_torch(run, args, template, my_batches, world):
    """DDP, ZeRO-1 and FSDP2: the same loop; only the wrapping and the optimizer differ."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = make_model(args.model, args.seed, run["ckpt"])
    model.load_state_dict(template)
    params = list(model.parameters())
    variant = run["variant"]
    if variant in ("ddp", "zero1"):
        wrapped = DDP(model, gradient_as_bucket_view=run["view"]) if world > 1 else model
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
        reshard = variant == "fsdp2_reshard_on"  # on: gathered weights freed after forward; off: kept to backward
        for layer in model.distilbert.transformer.layer:
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
        wrapped, params = model, list(model.parameters())
        opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
        local_state = lambda: opt.state  # noqa: E731

    def forward_backward(batch, count):
        opt.zero_grad(set_to_none=True)
        loss, saved = counted_loss(wrapped, batch, params, count)
        loss.backward()
        return saved, sum(nbytes(p.grad) for p in params)  # between backward and step: every gradient alive

    times, saved, grads = step_loop(my_batches, forward_backward, opt.step)
    held = {
        "params": sum(nbytes(p) for p in params),
        "grads": grads,
        "optimizer_state": sum(nbytes(v) for st in local_state().values() for v in st.values() if torch.is_tensor(v)),
    }
    gather = lambda: {
        k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()  # noqa: E731
        for k, v in model.state_dict().items()
    }
    return held, times, saved, gather


def run_deepspeed(run, args, template, my_batches, world):
    import deepspeed

    stage = int(run["variant"][-1])
    model = make_model(args.model, args.seed, run["ckpt"])
    model.load_state_dict(template)
    config = {
        "train_micro_batch_size_per_gpu": run["batch"],
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "gradient_clipping": 0.0,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    engine, opt, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    params = list(engine.module.parameters())

    def forward_backward(batch, count):
        loss, saved = counted_loss(engine, batch, params, count)
        engine.backward(loss)
        return saved, ds_gradient_bytes(opt, params)

    times, saved, grads = step_loop(my_batches, forward_backward, engine.step)
    inner = opt.optimizer if hasattr(opt, "optimizer") else opt
    masters = (
        getattr(opt, "single_partition_of_fp32_groups", None)
        or getattr(opt, "fp32_partitioned_groups_flat", None)
        or []
    )
    held = {
        "params": sum(nbytes(getattr(p, "ds_tensor", p)) for p in params),
        "grads": grads,
        "optimizer_state": sum(nbytes(v) for st in inner.state.values() for v in st.values() if torch.is_tensor(v))
        + sum(nbytes(m) for m in masters if not any(m is p for p in params)),
    }

    def gather():
        if stage == 3:
            with deepspeed.zero.GatheredParameters(params):
                return {k: v.detach().clone() for k, v in engine.module.state_dict().items()}
        return {k: v.detach().clone() for k, v in engine.module.state_dict().items()}

    return held, times, saved, gather


def one_run(run, index, args, template, ds, pad_id, rank, world, scratch: Path) -> dict:
    """Runs in a fresh child process of this rank: joins the other ranks' children, trains, measures.
    They meet in a FileStore (a file of this run's own): no store server, so the parent never holds a thread
    that a fork could catch holding a lock (a TCPStore in the parent hung a child under load)."""
    store = dist.FileStore(str(scratch / f"store_{index}"), world) if world > 1 else dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=args.timeout))
    try:
        my_batches = batches(ds, pad_id, run, args.steps, rank, world)
        dist.barrier()
        gc.collect()
        before = status_mb("VmRSS")
        reset_peak()
        if run["variant"].startswith("deepspeed"):
            held, times, saved, gather = run_deepspeed(run, args, template, my_batches, world)
        else:
            held, times, saved, gather = run_torch(run, args, template, my_batches, world)
        peak = status_mb("VmHWM") - before  # read before anything else (the gathered weights) is allocated
        wall_s, cpu_s = times  # each step's, from step_loop
        full = gather()
        reference = scratch / f"reference_{run['batch']}x{run['seq']}.pt"
        diff = 0.0
        if rank == 0 and not reference.exists():
            torch.save(full, reference)  # the first run of this batch shape is the others' reference
        dist.barrier()
        ref = torch.load(reference, weights_only=True)
        diff = max(float((full[k].float() - ref[k].float()).abs().max()) for k in ref)
        ddp = run["variant"] == "ddp"  # the runs whose FLOPs and CPU price chapter 06 reads
        flops = count_flops(args.model, args.seed, run["ckpt"], my_batches[0]) if ddp else None
        pairs = paired_cpu_ratios(args.model, args.seed, my_batches[0]) if ddp and run["ckpt"] else None
        mine = {
            **held,
            "total": sum(held.values()),
            "activations_saved": saved,
            "peak_rss_above_start_mb": peak,
            "seconds_per_step": sorted(wall_s)[len(wall_s) // 2],
            "cpu_seconds_per_step": sorted(cpu_s)[len(cpu_s) // 2],
            "flops_per_step": flops,
            "cpu_ratio_pairs": pairs,  # +ckpt runs: recomputation's CPU price, step pair by step pair
            "max_weight_diff_vs_first": diff,
        }
        everyone = [None] * world
        dist.all_gather_object(everyone, mine)
        dist.barrier()
        return {**{k: run[k] for k in ("variant", "batch", "seq", "ckpt", "view")}, "per_rank": everyone}
    finally:
        dist.destroy_process_group()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["tiny", "distilbert-base"], default="tiny")
    p.add_argument(
        "--runs",
        "--variants",
        dest="runs",
        default=",".join(VARIANTS),
        help="comma-separated runs VARIANT[@BATCHxSEQ][+ckpt][+view]",
    )
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch", type=int, default=8, help="examples per rank and step")
    p.add_argument("--max_length", type=int, default=64, help="tokens per example (every batch is padded to it)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=300, help="seconds a run's collectives may wait")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    args.parsed = [parse_run(r, args.batch, args.max_length) for r in args.runs.split(",") if r.strip()]
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's own collectives renamed; not ours to fix
    torch.set_num_threads(1)  # one thread: no OpenMP pool exists when we fork, and the ranks do not fight for cores
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    # Imported before forking, so that no run counts a module's import in its own peak (each ZeRO-1 run counted
    # 5.3 MiB of torch.distributed.optim when its child imported it: chapter 06 measured it).
    from torch.distributed.optim import ZeroRedundancyOptimizer  # noqa: F401

    try:
        import deepspeed  # imported before forking: every child shares it instead of importing it again

        deepspeed_version = deepspeed.__version__
        # On a CPU, DeepSpeed compiles its own shared-memory all-reduce (a C++ op: ~30 s of two cores on first use)
        # and uses it instead of the process group. Here every contender, DeepSpeed too, talks through the same gloo
        # group: DeepSpeed's rows differ from the others only in what they shard. (By module name: `import
        # deepspeed.comm.torch as m` would give the torch library, which deepspeed.comm imports under that name.)
        ds_comm = importlib.import_module("deepspeed.comm.torch")
        if hasattr(ds_comm, "build_shm_op"):
            ds_comm.build_shm_op = lambda: None
    except ImportError:
        deepspeed_version = None
    # Everything every run needs, made once before forking, so that no run counts it in its own peak.
    template = make_model(args.model, args.seed).state_dict()
    n = args.steps * max(r["batch"] for r in args.parsed) * world
    ds, pad_id = tokenized(args.parsed, n)
    settle_allocator()
    warm_up(args.model, args.seed, args.lr, template, ds, pad_id)
    baseline_mb = status_mb("VmRSS")
    scratch = Path(os.environ.get("DISTRINEWS_MEMORY_SCRATCH") or tempfile.gettempdir()) / (
        f"memory_footprint_{os.environ.get('TORCHELASTIC_RUN_ID', os.getpid())}"
    )
    scratch.mkdir(parents=True, exist_ok=True)
    if world > 1 and int(os.environ.get("LOCAL_WORLD_SIZE", world)) != world:
        raise SystemExit(
            "memory_footprint.py: every rank must run on this machine (its runs meet in a file under "
            f"{scratch.parent}); launch it with torchrun --standalone --nproc_per_node=N"
        )
    results = {}
    for index, run in enumerate(args.parsed):
        if run["variant"].startswith("deepspeed") and deepspeed_version is None:
            results[run["name"]] = {
                "skipped": "DeepSpeed is not installed (pip install --no-build-isolation -r requirements-deepspeed.txt)"
            }
            continue
        result = in_child(
            lambda: one_run(run, index, args, template, ds, pad_id, rank, world, scratch), "memory_footprint.py: a run"
        )
        results[run["name"]] = result
        if rank == 0:
            r = max(result["per_rank"], key=lambda x: x["peak_rss_above_start_mb"])
            print(
                f"{run['name']:<22} params {r['params'] / 2**20:7.2f} MiB | grads {r['grads'] / 2**20:7.2f} MiB | "
                f"optimizer {r['optimizer_state'] / 2**20:7.2f} MiB | "
                f"activations {r['activations_saved'] / 2**20:7.2f} MiB"
                f" | peak RSS +{r['peak_rss_above_start_mb']:7.1f} MiB | {1000 * r['seconds_per_step']:6.0f} ms/step | "
                f"weights vs first {r['max_weight_diff_vs_first']:.1e}",
                flush=True,
            )
    if rank == 0:
        n_params = sum(v.numel() for v in template.values() if v.is_floating_point())
        out = {
            "benchmark": "memory",
            **provenance(),
            "world_size": world,
            "model": args.model,
            "n_params": n_params,
            "settings": {k: v for k, v in vars(args).items() if k != "parsed"},
            "deepspeed": deepspeed_version,
            "start_rss_mb": baseline_mb,
            "results": results,
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1, default=str))
        for f in [*scratch.glob("reference_*.pt"), *scratch.glob("store_*")]:
            f.unlink(missing_ok=True)
        try:
            scratch.rmdir()
        except OSError:
            pass


if __name__ == "__main__":
    run_and_end(main)  # end without the interpreter's teardown, where gloo's threads can abort a finished rank
