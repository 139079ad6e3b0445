"""Chapter 03's race, its memory and sharding section: each contender's peak memory per rank, measured as chapter 06
measures it (a fresh process per run), beside chapter 06's calculator; and ZeRO-2 and ZeRO-3 against torch's FSDP2."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from .. import memory as calculator
from ..fresh import in_child
from ..ring import wire_bytes
from . import check, harness, measure, models
from .race import Runner, ddp_buckets
from .rung import agreement_group
from .watch import Collectives


def memory(contenders, mods, args, rank, world) -> dict:
    """Each contender's peak resident memory per rank, measured as chapter 06 measures it: every run in a FRESH
    process per rank (forked from this one after the imports and a warm-up step, before any process group
    exists), its peak (VmHWM) above its resident memory before the model existed; the ranks' children meet in a
    FileStore of their own. Plus the calculator's runtime: DDP on one example of 8 tokens, minus its estimate."""
    scratch = measure.meeting_folder("by_hand_memory")
    torch.set_num_threads(1)  # no OpenMP pool exists when we fork
    batches = models.batches("tiny", rank, world, args.memory_steps, args.zero_batch)
    one = {k: v[:1, :8] if v.dim() == 2 else v[:1] for k, v in batches[0].items()}
    warm = models.build_model("tiny", 0)  # code pages and one-time set-ups touched here, not in a child's peak
    warm(**{k: v[:2] for k, v in one.items()}).loss.backward()
    torch.optim.AdamW(warm.parameters()).step()
    del warm
    measure.settle_allocator()

    def run(index, name, steps):
        store = dist.FileStore(str(scratch / f"store_{index}"), world)
        harness.init(args.timeout_s, store=store)
        try:
            log = Collectives()  # counts the collectives a rung (or FSDP2) calls from Python
            with measure.PeakMemory() as m:
                r = Runner(name, "tiny", args, mods, rank, dropout=False)
                with log:
                    for b in steps:
                        r.step(b)
            if name == "ddp":  # DDP all-reduces its buckets in C++: counted from their sizes
                sizes = ddp_buckets(r.dp)
                calls, sent = len(sizes), wire_bytes("all_reduce", sum(sizes), world)
            else:
                calls, sent = len(log.calls) / len(steps), log.wire_bytes(world) / len(steps)
            return {"peak_mb": m.peak_mb, "collectives_per_step": calls, "bytes_per_step": sent}
        finally:
            dist.destroy_process_group()

    started = time.perf_counter()
    out = {
        "ddp@1x8": in_child(lambda: run(0, "ddp", [one] * args.memory_steps), "race.py: a memory run")["peak_mb"],
        "contenders": {},
    }
    for index, name in enumerate(["ddp", *contenders, "fsdp2"], 1):
        out["contenders"][name] = in_child(
            lambda index=index, name=name: run(index, name, batches), "race.py: a memory run"
        )
    if rank == 0:
        measure.remove_meeting_folder(scratch)
    out["runtime_mb"] = out["ddp@1x8"] - calculator.estimate("tiny", 1, 8, world=world).peak_mb
    out["seconds"] = time.perf_counter() - started
    return out


# Chapter 06's calculator, per contender: (ZeRO stage, impl, bucket_view). naive and overlapped all-reduce each
# gradient in place (no copy: like gradient_as_bucket_view); flat and bucketed copy every gradient into buffers.
CALCULATOR = {
    "ddp": (0, "torch", False),
    "naive": (0, "torch", True),
    "overlapped": (0, "torch", True),
    "flat": (0, "torch", False),
    "bucketed": (0, "torch", False),
    "zero1": (1, "even", False),
    "zero2": (2, "even", False),
    "zero3": (3, "even", False),
    "fsdp2": (3, "torch", False),
}


def estimate(args, stage: int, impl: str, bucket_view: bool, world: int, runtime_mb: float):
    """Chapter 06's calculator on the race's model: the tiny one, args.zero_batch texts per rank of models.SEQ_LEN
    tokens, fp32, ZeRO `stage` over `world` ranks, plus the runtime measured (memory()'s runtime_mb)."""
    return calculator.estimate(
        "tiny",
        args.zero_batch,
        models.SEQ_LEN,
        "fp32",
        stage,
        world,
        bucket_view=bucket_view,
        impl=impl,
        overhead_mb=runtime_mb,
    )


def sharding(contenders, kinds, mods, args, rank, world, mem) -> dict:
    """Per contender (and torch's DDP and FSDP2): the peak memory per rank and the collectives and bytes per step
    measured in memory()'s runs (`mem`) beside chapter 06's calculator's estimate; and ZeRO-2 and ZeRO-3 against
    torch's FSDP2: the course's tiny model without dropout (chapter 06's setting) trained args.zero_steps steps of
    args.zero_batch texts per rank, the largest difference of their final weights."""
    runtime = mem["runtime_mb"] if mem else None
    out = {
        "runtime_mb": runtime,
        "steps": args.zero_steps,
        "batch": args.zero_batch,
        "seq": models.SEQ_LEN,
        "contenders": {},
    }
    for name in ["ddp", *contenders, "fsdp2"]:
        stage, impl, view = CALCULATOR[kinds.get(name, name)]
        est = estimate(args, stage, impl, view, world, runtime or 0.0)
        ranks = check.everyone((mem or {}).get("contenders", {}).get(name, {}), agreement_group())
        out["contenders"][name] = {
            "peak_mb_per_rank": [r.get("peak_mb") for r in ranks],
            "calculator_mb": est.peak_mb,
            "calculator": {"stage": stage, "impl": impl, "bucket_view": view},
            "collectives_per_step": ranks[0].get("collectives_per_step"),
            "bytes_per_step": ranks[0].get("bytes_per_step"),
        }
    batches = models.batches("tiny", rank, world, args.zero_steps, args.zero_batch)
    final = {}
    for name in [*[c for c in contenders if kinds[c] in ("zero2", "zero3")], "fsdp2"]:
        torch.manual_seed(args.seed + 2000 + rank)
        r = Runner(name, "tiny", args, mods, rank, dropout=False)
        for b in batches:
            r.step(b)
        final[name] = r.weights()
        del r
    names = [n for n, _ in models.build_model("tiny", 0).named_parameters()]
    for name, w in final.items():
        _, worst = check.compare([w], [final["fsdp2"]], names)
        out["contenders"][name]["max_weight_diff_vs_fsdp2"] = worst
    return out
