"""Chapter 08's race on two levels of network, in ONE launch of N nodes x g ranks inside the cluster in a box:

1. memory (before this process joins a group, each run in a fresh process per rank, chapter 06's way): the peak
   resident memory per rank of torch's DDP, the flat and hierarchical rungs, ZeRO-3 and HSDP by hand, torch's FSDP2
   over every rank and on a 2-D mesh (HSDP), beside chapter 06's calculator;
2. correct: flat, hierarchical, HSDP by hand and FSDP2's HSDP against torch's DDP, HSDP by hand against FSDP2's,
   weights compared after every step;
3. compute: the step with no communication, every rank at once; rank 0 dials every link to the rate at which
   hierarchical's bytes take --comm_over_step x that step, at most MAX_MBIT (race_two_level.py in the library);
4. fit: each level's alpha-beta at that rate (inside the nodes; across them);
5. predict, then race: every contender's step and bytes over each node's link, predicted and written to the log
   BEFORE the timed rounds; then alternating rounds, each node's link counted (/sys/class/net/eth0/statistics);
6. the sweep: every link dialed to --sweep multiples of the race's rate (at most SWEEP_MAX_MBIT), and torch's DDP,
   hierarchical, FSDP2 and HSDP by hand raced again at each, their steps predicted with the race's (step 5).

    python scripts/cluster/box.py --nodes 2 --ranks-per-node 2 --link none -- \\
        scripts/by_hand/race_two_level.py --out outputs/two_level/race.json
"""

import argparse
import os
import time

import torch.distributed as dist

from distrinews_course import link
from distrinews_course import two_level as tl
from distrinews_course.by_hand import SCRIPTS, harness
from distrinews_course.by_hand import race_two_level as two
from distrinews_course.by_hand.nodes import Nodes
from distrinews_course.by_hand.race import load
from distrinews_course.by_hand.race_memory import memory
from distrinews_lib.distributed import run_and_end
from distrinews_lib.errors import UserError, main_guard
from distrinews_lib.files import atomic_write_json

CONTENDERS = ("ddp", "flat", "hierarchical", "fsdp2", "hsdp", "fsdp2_hsdp")  # the race's, in its first round's order
MEMORY = ("flat", "hierarchical", "zero3", "hsdp", "fsdp2_hsdp")  # besides torch's DDP and FSDP2 (race_memory.memory)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--benchmark", default=None, help="also write benchmarks/two_level_<machine>.json's record here")
    p.add_argument("--ranks_per_node", type=int, default=None, help="default: LOCAL_WORLD_SIZE (the box sets it)")
    p.add_argument("--check_steps", type=int, default=3)
    p.add_argument("--batch_size", type=int, default=8, help="texts per rank and step in the correctness check")
    timing = "texts per rank and step when timed (no dropout): a small computation, for the slow link to dominate"
    p.add_argument("--timing_batch", type=int, default=4, help=timing)
    p.add_argument("--compute_steps", type=int, default=3, help="steps of the step with no communication")
    p.add_argument("--fast_steps", type=int, default=3, help="steps of each contender on the unshaped box (median)")
    dial = (
        "the link is dialed so that hierarchical's bytes over a node's link take this x the step with no communication"
    )
    p.add_argument("--comm_over_step", type=float, default=6.0, help=dial)
    p.add_argument(
        "--link",
        default=None,
        help="dial this rate instead (e.g. 300mbit); default: from the step with no communication",
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--sweep",
        default="2,4",
        help="after the race, DDP, hierarchical, FSDP2 and HSDP again at these multiples of its rate ('' for none)",
    )
    p.add_argument("--sweep_rounds", type=int, default=2, help="alternating rounds at each rate of the sweep")
    p.add_argument("--round_steps", type=int, default=2)
    p.add_argument("--memory_steps", type=int, default=2, help="steps of each peak-memory run (0: none)")
    p.add_argument("--zero_batch", type=int, default=8, help="texts per rank and step in the memory runs")
    p.add_argument("--bucket_mb", type=float, default=25.0, help="torch's DDP's bucket cap (its default)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight_decay", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--timeout_s", type=float, default=120)
    return p.parse_args()


def say(rank: int, text: str) -> None:
    if rank == 0:
        print(text, flush=True)


@main_guard
def main():
    args = parse_args()
    if not link.in_box():
        raise UserError(
            "race_two_level.py counts the bytes on each node's link: run it inside the cluster in a box, "
            "scripts/cluster/box.py --nodes 2 --ranks-per-node 2 -- scripts/by_hand/race_two_level.py --out ..."
        )
    args.ranks_per_node = args.ranks_per_node or int(os.environ.get("LOCAL_WORLD_SIZE", 0)) or None
    mods = {name: load(SCRIPTS / f"{name}.py", f"by_hand_{name}") for name in ("flat", "hierarchical", "zero3", "hsdp")}
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    started = time.perf_counter()
    res = {"contenders": list(CONTENDERS), "world_size": world, "seconds": {}}
    # 1. memory first, before this process joins a group (each run in a forked child)
    mem = memory(list(MEMORY), mods, args, rank, world) if args.memory_steps else None
    res["seconds"]["memory"] = mem and mem["seconds"]
    rank, world = harness.init(args.timeout_s)
    nodes = Nodes(args.ranks_per_node)  # refuses a world that does not split into nodes, on every rank
    lay = tl.Layout(nodes.n, nodes.per_node)
    res.update(nodes=lay.nodes, ranks_per_node=lay.per_node, grad_bytes=4 * two.blocks_of()["flat"][0])
    # 2. correct
    t0 = time.perf_counter()
    res["correct"] = two.correct(args, mods, rank, world)
    res["seconds"]["correct"] = time.perf_counter() - t0
    # 3. compute (the rate comes from it), every contender's step on the unshaped box, each level's fit there
    t0 = time.perf_counter()
    others = two.Others()  # the predictions rest on what this phase measures: a busy machine here skews them all
    parts = two.compute(args, rank)
    compute_s = sum(parts.values())
    runners, batches = two.prepare(CONTENDERS, args, mods, rank, world)
    fast = two.fast_steps(runners, batches, args.fast_steps)
    # message sizes near the race's own (a block of 8 MiB inside a node, shards of 4 MiB across): the filter's burst
    # (link.burst_bytes) lets a small message through at once, so the dialed link's fit times only those at least 4x it
    inter_sizes = [2**18, 2**19, 2**20, 2**21]
    fits = {"intra": two.fit_level("intra", nodes, lay, [2**20, 2**22, 2**23])}
    fits["inter_unshaped"] = two.fit_level("inter", nodes, lay, inter_sizes)
    # 4. the slow link, dialed by rank 0, and its fit
    wanted = two.link_rate_mbit(lay, compute_s, args.comm_over_step)
    mbit = int(link.bits_per_s(args.link) / 1e6) if args.link else two.dialed_mbit(wanted)
    dist.barrier()
    if rank == 0:
        link.dial(f"{mbit}mbit")
    dist.barrier()
    fits["inter"] = two.fit_level("inter", nodes, lay, inter_sizes, bits=mbit * 1e6)
    res.update(compute=parts, link_mbit=mbit, link_mbit_wanted=wanted, timing_batch=args.timing_batch, fit=fits)
    f_in, f_out = fits["intra"], fits["inter"]
    capped = (
        ""
        if args.link or mbit == wanted
        else f" (held to {two.MIN_MBIT}-{two.MAX_MBIT}: {args.comm_over_step:g}x the step asks {wanted})"
    )
    say(rank, f"step with no communication: {1000 * compute_s:.0f} ms; every link dialed to {mbit} Mbit/s{capped}")
    say(
        rank,
        f"fit: inside a node alpha {1000 * f_in['alpha_s']:.2f} ms, {f_in['bytes_per_s'] / 1e6:.0f} MB/s per rank; "
        f"across, alpha {1000 * f_out['alpha_s']:.2f} ms, {f_out['bytes_per_s'] / 1e6:.1f} MB/s per link",
    )
    # 5. predict (written to the log before any timed step), then race
    res["calibration_foreign_cores"] = others.cores()
    res["predicted"] = two.predictions(CONTENDERS, lay, fits, fast)
    rates = two.sweep_rates(mbit, [float(m) for m in args.sweep.split(",") if m])
    res["sweep"] = {"predicted": two.sweep_predictions(lay, fits, fast, rates, mbit)} if rates else None
    res["predicted_at"] = time.time()
    for n, p in res["predicted"].items():
        say(
            rank,
            f"predicted {n:>12}: {1000 * p['step_s']:6.0f} ms/step, {p['link_bytes'] / 2**20:6.2f} MiB/step per link",
        )
    for r in rates:
        steps = ", ".join(f"{n} {1000 * p['step_s']:.0f}" for n, p in res["sweep"]["predicted"][r].items())
        say(rank, f"predicted at {r} Mbit/s: {steps} ms/step")
    res["seconds"]["calibrate"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    res["race_started_at"] = time.time()
    res["race"] = two.race(runners, batches, args, rank, world, lay.per_node)
    res["seconds"]["race"] = time.perf_counter() - t0
    if rates:  # 6. the sweep: the link dialed faster, DDP, hierarchical, FSDP2 and HSDP raced at each rate
        t0 = time.perf_counter()
        res["sweep"]["race"] = two.sweep(runners, batches, args, rank, world, lay.per_node, rates)
        res["seconds"]["sweep"] = time.perf_counter() - t0
    res["memory"] = two.memory_estimates(mem, ["ddp", *MEMORY, "fsdp2"], args, lay)
    res["runtime_mb"] = mem and mem["runtime_mb"]
    res["seconds"]["all"] = time.perf_counter() - started
    if rank == 0:
        atomic_write_json(args.out, res)
        if args.benchmark:
            atomic_write_json(args.benchmark, two.benchmark_record(res))
        print(f"race_two_level: {len(CONTENDERS)} contenders in {res['seconds']['all']:.1f} s -> {args.out}")
    dist.destroy_process_group()


if __name__ == "__main__":
    run_and_end(main)  # end without the interpreter's teardown, where gloo's threads can abort a finished rank
