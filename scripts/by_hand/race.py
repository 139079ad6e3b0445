"""Chapter 03's race: every rung of scripts/by_hand/ against torch's DDP, in ONE launch of 2 gloo ranks.

1. check: each rung and torch's DDP train the same model from the same seed on the same texts; the weights are
   compared after every step (the first difference names its step and parameter). Models: tiny and tied.
2. probes (--probes): the cases where a wrong answer shows (distrinews_course/by_hand/probes.py), each against
   torch's DDP.
3. memory and sharding (tiny model, dropout off, chapter 06's setting): each rung, torch's DDP and torch's FSDP2
   (fully_shard), each in a fresh process per rank (before this one joins a group): peak memory per rank,
   collectives and bytes per step counted; then ZeRO-2, ZeRO-3 and FSDP2 trained --zero_steps steps here, their
   final weights compared.
4. timing (wide model): alternating rounds, the order rotating each round; the median step time of each.
5. sweep: bucket sizes, the hand-built bucketed rung against torch's DDP, alternating.
6. facts: DDP's buckets in its first steps, what gradient_as_bucket_view shares, the bytes each collective puts
   on the wire.
7. mixed (--sections mixed): ZeRO-3 with param_dtype float16 and bfloat16 against FSDP2's MixedPrecisionPolicy, the
   bytes of each collective, what float16 loses without loss scaling, the peak memory beside chapter 06's calculator.

    torchrun --standalone --nproc_per_node=2 scripts/by_hand/race.py --out outputs/by_hand/race.json
"""

import argparse
import os
import time

import torch.distributed as dist

from distrinews_course.by_hand import RUNGS, TWO_LEVEL, harness, probes, race_mixed
from distrinews_course.by_hand.check import Cases
from distrinews_course.by_hand.race import (
    Runner,
    benchmark_record,
    bucket_sweep,
    check,
    ddp_facts,
    inspect_file,
    rung_modules,
    timing,
)
from distrinews_course.by_hand.race_memory import memory, sharding
from distrinews_lib.distributed import run_and_end
from distrinews_lib.errors import UserError, main_guard
from distrinews_lib.files import atomic_write_json


@main_guard
def main():
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--rungs", default=",".join(RUNGS))
    p.add_argument(
        "--sections",
        default="check,timing",
        help="check (each contender against DDP), timing (the wide model: the rungs of --timing_rungs "
        "against DDP, the facts, the sweep), zero (ZeRO-2 and ZeRO-3 against FSDP2: memory, 20 steps, "
        "their timing), mixed (ZeRO-3 in mixed precision against FSDP2's: distrinews_course/by_hand/race_mixed.py)",
    )
    p.add_argument("--models", default="tiny,tied")
    p.add_argument("--check_steps", type=int, default=3)
    p.add_argument("--check_only", action="store_true", help="the check (and --probes) only: --sections check")
    p.add_argument(
        "--exercise",
        action="append",
        default=[],
        help="RUNG:FILE[:LABEL], the learner's code in a copy of the rung (repeatable)",
    )
    p.add_argument("--probes", default="", help="'all' or a comma list of by_hand_check's cases; empty: none")
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight_decay", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--bucket_mb", type=float, default=1.0)
    p.add_argument("--timing_rungs", default="naive,flat,overlapped,bucketed,zero1")
    p.add_argument(
        "--timing_batch_size", type=int, default=None, help="texts per rank and step when timed (default: --batch_size)"
    )
    p.add_argument(
        "--dropout",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="dropout in the timed runs (its random masks are CPU work that moves no byte: chapter 03's dialed race "
        "leaves it out)",
    )
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--round_steps", type=int, default=3)
    p.add_argument("--sweep", default="0.25,1,25", help="bucket sizes (MiB) for the sweep; empty: no sweep")
    p.add_argument("--sweep_rounds", type=int, default=3)
    p.add_argument(
        "--sweep_ddp",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="torch's DDP at each size of the sweep too (--no-sweep_ddp: the hand-built rung only)",
    )
    p.add_argument(
        "--facts",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after the timing: DDP's buckets and rebuild, gradient_as_bucket_view, each collective's bytes",
    )
    p.add_argument("--zero_steps", type=int, default=20, help="steps of ZeRO-2 and ZeRO-3 against FSDP2")
    p.add_argument("--zero_batch", type=int, default=8, help="texts per rank and step in the zero section")
    p.add_argument("--zero_rounds", type=int, default=3, help="timing rounds of DDP, ZeRO-2, ZeRO-3 and FSDP2")
    p.add_argument("--mixed_steps", type=int, default=5, help="steps of mixed-precision ZeRO-3 against FSDP2's")
    mixed_help = "texts per rank in the mixed section's memory runs: at 32 float16's saving (~13 MiB) stands clear of "
    mixed_help += "the peaks' noise (~2 MiB); at 8 it is about as large as the noise"
    p.add_argument("--mixed_batch", type=int, default=32, help=mixed_help)
    memory_help = "steps of each peak-memory run (0: none); the 2nd holds the optimizer's state, gradients, activations"
    p.add_argument("--memory_steps", type=int, default=2, help=memory_help)
    p.add_argument(
        "--ranks_per_node",
        type=int,
        default=None,
        help="the two-level rungs' node layout (chapter 08): ranks per node (default: torchrun's LOCAL_WORLD_SIZE)",
    )
    p.add_argument("--timeout_s", type=float, default=60)
    p.add_argument("--out", required=True)
    p.add_argument(
        "--benchmark", default=None, help="also write the benchmark file (benchmarks/ddp_by_hand_<machine>.json)"
    )
    args = p.parse_args()
    args.timing_batch_size = args.timing_batch_size or args.batch_size
    sections = {"check"} if args.check_only else {s for s in args.sections.split(",") if s}
    rungs = [r for r in args.rungs.split(",") if r]
    bad = [r for r in rungs if r not in RUNGS + TWO_LEVEL] + [
        s for s in sections if s not in ("check", "timing", "zero", "mixed")
    ]
    if bad:
        raise UserError(
            f"--rungs/--sections: unknown {bad}; the rungs are {', '.join(RUNGS + TWO_LEVEL)}, the sections check, "
            "timing, zero and mixed"
        )
    if "mixed" in sections and "zero3" not in rungs:
        raise UserError("--sections mixed races ZeRO-3 by hand: keep zero3 in --rungs")
    mods, kinds = rung_modules(rungs, args.exercise)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    # Memory first, before this process joins a group (each run in a forked child); the reference rungs only: a
    # learner's code is checked first, in a sandbox, where a crash is a verdict.
    mem = memory(rungs, mods, args, rank, world) if "zero" in sections and args.memory_steps else None
    mixed_runs = race_mixed.memory_runs(mods, args, rank, world) if "mixed" in sections and args.memory_steps else None
    rank, world = harness.init(args.timeout_s)
    contenders = list(mods)
    # The source files of every contender's code (a learner's file too): a `raise` there is a clear error.
    files = {m.__file__ for m in mods.values()} | {inspect_file(v) for m in mods.values() for v in vars(m).values()}
    cases = Cases(
        lambda name, kind, **kw: Runner(name, kind, args, mods, rank, **kw),
        args.batch_size,
        args.timeout_s,
        args.seed + 1000,
        files - {None},
    )
    started = time.perf_counter()
    res = {
        "rungs": rungs,
        "contenders": contenders,
        "kinds": kinds,
        "sections": sorted(sections),
        "world_size": world,
        "steps": args.check_steps,
        "bucket_mb": args.bucket_mb,
        "batch_size": args.batch_size,
        "timing_batch_size": args.timing_batch_size,
        "dropout_when_timed": args.dropout,
        "check": {},
        "facts": {},
    }
    if "check" in sections:
        for kind in [m for m in args.models.split(",") if m]:
            res["check"][kind] = check(kind, contenders, mods, args, rank, world, res["facts"], cases, kinds=kinds)
    res["seconds_check"] = time.perf_counter() - started
    if args.probes:
        t0, res["probes"] = time.perf_counter(), {}
        for name in contenders:
            if any(not c[name]["verdict"]["ok"] for c in res["check"].values() if name in c):
                continue  # its first mistake is already named
            chosen = probes.probes_for(kinds[name])
            if args.probes != "all":
                chosen = [c for c in chosen if c in args.probes.split(",")]
            res["probes"][name] = {}
            for case in chosen:
                res["probes"][name][case] = v = probes.probe(case, name, kinds[name], cases)
                if not v["ok"]:
                    break  # one mistake at a time: the later cases may fail only because of it
        res["seconds_probes"] = time.perf_counter() - t0
    # A contender that failed its check goes no further (its code may crash anywhere: the verdict is in)
    contenders = [n for n in contenders if all(c[n]["verdict"]["ok"] for c in res["check"].values() if n in c)]
    if "zero" in sections:
        t0 = time.perf_counter()
        res["zero_check"] = check("tiny", [], mods, args, rank, world, {}, cases, with_fsdp2=True)["fsdp2"]
        res["sharding"] = sharding(contenders, kinds, mods, args, rank, world, mem)
        names = ["ddp", *[c for c in contenders if kinds[c] in ("zero2", "zero3")], "fsdp2"]
        res["zero_timing"] = timing(names, mods, args, rank, world, args.zero_rounds)[0]
        res["seconds_zero"], res["seconds_memory"] = time.perf_counter() - t0, mem and mem["seconds"]
    if "mixed" in sections:
        t0 = time.perf_counter()
        res["mixed"] = race_mixed.mixed(mods, args, rank, world, mixed_runs)
        res["seconds_mixed"] = time.perf_counter() - t0
    if "timing" in sections:
        names = ["ddp", *[c for c in contenders if kinds[c] in args.timing_rungs.split(",")]]
        res["timing"], runners, batches = timing(names, mods, args, rank, world, args.rounds, bool(args.benchmark))
        if args.facts:
            res["facts"].update(ddp_facts(runners, batches, names, args, mods, rank, world))
        sweep = [float(x) for x in args.sweep.split(",") if x]
        if sweep and "bucketed" in rungs:
            res["sweep"] = bucket_sweep(sweep, batches, args, mods, rank, args.sweep_ddp)
    res["seconds"] = time.perf_counter() - started
    if rank == 0:
        atomic_write_json(args.out, res)
        if args.benchmark and {"timing", "zero"} <= sections:
            atomic_write_json(args.benchmark, benchmark_record(res, args, world))
        print(
            f"race: {len(contenders)} contender(s) checked on {', '.join(res['check'])} in {res['seconds']:.1f} s "
            f"-> {args.out}"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    run_and_end(main)  # end without the interpreter's teardown, where gloo's threads can abort a finished rank
