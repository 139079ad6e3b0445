"""Chapter 08's race on two levels of network (scripts/by_hand/race_two_level.py is its entry point; it runs inside
scripts/cluster/box.py, N nodes x g ranks): each section here runs on every rank.

- correct: the two-level rungs (hierarchical.py, hsdp.py) and torch's FSDP2 on a 2-D mesh, each against torch's DDP,
  and HSDP by hand against FSDP2's, weights compared after every step;
- compute: one step with no communication, every rank at once (what this machine gives each of them);
- fit: the two levels' alpha-beta, measured as the rungs use them: every node's group at once inside the nodes, every
  cross-node group at once over the links;
- predict: each variant's step and the bytes over each node's link (distrinews_course/two_level.py), before the race;
- race: alternating rounds of every variant, each round's step time and the bytes each node's link counted
  (/sys/class/net/eth0/statistics, distrinews_course.link.link_bytes).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from .. import link
from .. import two_level as tl
from ..bench.timing import cpu_busy_seconds
from ..perf_model import fit_alpha_beta
from . import models
from .check import compare
from .nodes import Nodes, layout
from .race import Runner, names_of
from .race_memory import estimate
from .rung import agreement_group

# Each contender of the race, as the cost model sees it: (its variant, its blocks: "flat" one buffer, "blocks" ZeRO-3's)
VARIANT = {
    "ddp": ("ddp", "flat"),
    "flat": ("ddp", "flat"),
    "hierarchical": ("hierarchical", "flat"),
    "zero3": ("fsdp", "blocks"),
    "fsdp2": ("fsdp", "blocks"),
    "hsdp": ("hsdp", "blocks"),
    "fsdp2_hsdp": ("hsdp", "blocks"),
}
# Chapter 06's calculator per contender: (ZeRO stage, impl, bucket view, sharded over: "world" or "node")
CALCULATOR = {
    "ddp": (0, "torch", False, "world"),
    "flat": (0, "torch", False, "world"),
    "hierarchical": (0, "torch", False, "world"),
    "zero3": (3, "even", False, "world"),
    "fsdp2": (3, "torch", False, "world"),
    "hsdp": (3, "even", False, "node"),
    "fsdp2_hsdp": (3, "torch", False, "node"),
}
PAIRS = (  # (contender, against): the weights compared after every step
    ("flat", "ddp"),
    ("hierarchical", "ddp"),
    ("hsdp", "ddp"),
    ("fsdp2_hsdp", "ddp"),
    ("hsdp", "fsdp2_hsdp"),
    ("fsdp2", "ddp"),
)


def across(x: float, op=dist.ReduceOp.MAX) -> float:
    t = torch.tensor([float(x)], dtype=torch.float64)
    dist.all_reduce(t, op=op, group=agreement_group())
    return float(t)


def correct(args, mods, rank: int, world: int) -> dict:
    """Every contender of PAIRS trained on the same seed and texts (tiny model, dropout on, the same masks): per pair,
    the largest weight difference over the steps and ranks, and where it first appeared; and under "grad_norm" each
    contender's step-1 gradient norm (grad_norm()): AdamW barely sees a gradient's scale, its norm does."""
    batches = models.batches("tiny", rank, world, args.check_steps, args.batch_size)
    weights, names, norms, per_node = {}, None, {}, layout(world, args.ranks_per_node)
    for name in dict.fromkeys(n for pair in PAIRS for n in pair):
        r = Runner(name, "tiny", args, mods, rank)
        names = names or names_of(r)
        torch.manual_seed(args.seed + 1000 + rank)  # dropout: the same masks for every contender on this rank
        weights[name] = []
        for b in batches:
            r.step(b)
            weights[name].append(r.weights())
        norms[name] = grad_norm(r, world, per_node)
        del r
    out = {"grad_norm": norms}
    for a, b in PAIRS:
        first, worst = compare(weights[a], weights[b], names)
        out[f"{a} vs {b}"] = {"max_weight_diff": worst, "first_diff": first}
    return out


def grad_norm(runner, world: int, per_node: int) -> float:
    """The L2 norm of the whole gradient the optimizer stepped with at step 1 (Runner.first_grad, each rank's own or
    its shard's sum of squares), summed over the ranks and divided by the copies of it they hold: every rank one
    (DDP, flat, hierarchical), each node one (HSDP: sharded inside the node), one in all (FSDP2, sharded over all)."""
    copies = {"fsdp2": 1, "hsdp": world // per_node, "fsdp2_hsdp": world // per_node}.get(runner.name, world)
    t = torch.tensor([(runner.first_grad or (0.0, 0))[0]], dtype=torch.float64)
    dist.all_reduce(t, group=agreement_group())
    return float(t[0] / copies) ** 0.5


def compute(args, rank: int) -> dict:
    """The step with no communication at all, every rank at once: forward, backward and AdamW (median seconds), the
    slowest rank's, as the ranks of a data-parallel step wait for it."""
    dist.barrier()
    alone = models.step_seconds("tiny", args.timing_batch, dropout=False, steps=args.compute_steps)
    return {part: across(v) for part, v in alone.items()}


def blocks_of(kind: str = "tiny") -> dict:
    """The numbers of elements the variants send: 'flat' one buffer of every gradient, 'blocks' ZeRO-3's blocks (the
    rest, then each transformer layer, as zero3.py cuts them)."""
    model = models.build_model(kind, 0)
    stack = models.layers(model)
    inside = {id(p) for layer in stack for p in layer.parameters()}
    params = [p for p in model.parameters() if p.requires_grad]
    rest = sum(p.numel() for p in params if id(p) not in inside)
    layers = [sum(p.numel() for p in layer.parameters() if p.requires_grad) for layer in stack]
    return {"flat": [sum(p.numel() for p in params)], "blocks": [rest, *layers]}


# The fastest link the race dials, in Mbit/s. The model prices each collective on its level's fit and nothing else,
# and the faster the link, the more what it leaves out weighs: measured in this box, hierarchical kept 79-95% of its
# predicted saving over the flat rung at 150-160 Mbit/s, 62% at 300 (a CI machine with a faster CPU dialed about that
# and got 38%) and none at 600. A machine whose step with no communication is short gets a link slower than
# --comm_over_step asks.
MAX_MBIT = 160
# The slowest link the race dials, in Mbit/s. On a busy machine the step with no communication measures slow (346 ms
# under a CI run beside it, against 87 ms quiet), which asked for 30 Mbit/s: steps of 3.7 s (DDP) and 7.2 s (FSDP2), a
# race past any launch's timeout. At 100 the link's share of a step is at most 1.6x the quiet machine's (130-160), so
# the race takes a bounded time on any machine, and a busy one's timing claims become NOTEs (QUIET_CORES).
MIN_MBIT = 100


def dialed_mbit(wanted: int) -> int:
    """The rate the race dials for `wanted` (link_rate_mbit): held between MIN_MBIT and MAX_MBIT."""
    return min(max(wanted, MIN_MBIT), MAX_MBIT)


def link_rate_mbit(lay: tl.Layout, compute_s: float, over: float) -> int:
    """The link's rate (Mbit/s, as tc counts it: TCP's payload is link.PAYLOAD_SHARE of it) at which hierarchical's
    bytes over a node's link take `over` x the step with no communication: the slow link dominates. Not held
    (dialed_mbit)."""
    flat = blocks_of()["flat"]
    nbytes = sum(o.link_bytes(lay) for o in tl.plan("hierarchical", flat, lay))
    payload = tl.rate_for(nbytes, over * compute_s)  # bytes per second
    return max(10, round(payload * 8 / link.PAYLOAD_SHARE / 1e6 / 10) * 10)


def _time(op, reps: int) -> float:
    """Median seconds of op over reps (the slowest rank's), after one to warm up."""
    op()
    times = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        op()
        times.append(time.perf_counter() - t0)
    return across(statistics.median(times))


def fit_level(level: str, nodes: Nodes, lay: tl.Layout, sizes, reps: int = 3, bits: float | None = None) -> dict:
    """One level's alpha-beta, as the rungs use it: all-reduces inside every node at once ("intra"; x: what a rank
    sends), or on every cross-node group at once ("inter"; x: what a node's link carries, its g ranks' bytes).
    bits: the rate the link is dialed to; only the sizes whose time it sets are timed (link.rate_bound: a link's
    bytes at least 4x its burst), as long as two are left: a smaller one rides the burst and reads as a faster link."""
    group, kind = (nodes.intra, "intra") if level == "intra" else (nodes.cross, "cross")

    def x_bytes(size: int) -> float:
        op = tl.Op("all_reduce", kind, size)
        return op.link_bytes(lay) if level == "inter" else op.rank_bytes(lay)

    sizes = rate_bound_sizes(sizes, x_bytes, bits) if bits else sizes
    rows = []
    for size in sizes:
        x = torch.ones(size // 4)
        t = _time(lambda: dist.all_reduce(x, group=group), reps)
        rows.append({"op": "all_reduce", "bytes": x_bytes(size), "message": size, "seconds": t})
    f = fit_alpha_beta(rows)
    return {
        "alpha_s": f.alpha_s,
        "bytes_per_s": f.bandwidth,
        "rows": rows,
        "smallest_bytes": min(r["bytes"] for r in rows),
    }


def rate_bound_sizes(sizes, x_bytes, bits: float) -> list:
    """The message sizes whose bytes over the link (x_bytes(size)) a link of `bits` times (link.rate_bound: at least
    4x its burst), if two or more are; else all of them, for a fit needs two points."""
    bound = [r["message"] for r in link.rate_bound([{"bytes": x_bytes(s), "message": s} for s in sizes], bits)]
    return bound if len(bound) >= 2 else list(sizes)


def as_fit(level: dict):
    from ..perf_model import Fit

    return Fit(level["alpha_s"], 1 / level["bytes_per_s"])


def prepare(contenders, args, mods, rank: int, world: int):
    """Every contender built and warmed up (a step each: DDP rebuilds its buckets, FSDP2 initializes), and the
    batches of the timed steps."""
    batches = models.batches("tiny", rank, world, args.round_steps + 1, args.timing_batch)
    runners = {}
    for n in contenders:
        runners[n] = Runner(n, "tiny", args, mods, rank, dropout=False)
        runners[n].step(batches[0])
    return runners, batches[1:]


def fast_steps(runners, batches, steps: int) -> dict:
    """Each contender's step on the unshaped box (median of `steps`, rank 0's clock between barriers): its
    computation and collectives with no slow link."""
    out = {}
    for n, r in runners.items():
        times = []
        for b in (batches * steps)[:steps]:
            dist.barrier()
            t0 = time.perf_counter()
            r.step(b)
            dist.barrier()
            times.append(time.perf_counter() - t0)
        out[n] = statistics.median(times)
    return out


def predictions(contenders, lay: tl.Layout, fits: dict, fast: dict) -> dict:
    """Each contender's step and link bytes at the dialed rate (two_level.predict): its computation from its step on
    the unshaped box (two_level.computation), each collective on its level's fit."""
    blocks = blocks_of()
    intra, inter, inter_fast = as_fit(fits["intra"]), as_fit(fits["inter"]), as_fit(fits["inter_unshaped"])
    out = {}
    for name in contenders:
        variant, shape = VARIANT[name]
        c = tl.computation(variant, blocks[shape], lay, intra, inter_fast, fast[name])
        out[name] = {
            **tl.predict(variant, blocks[shape], lay, intra, inter, c).as_dict(),
            "unshaped_step_s": fast[name],
        }
    return out


class Others:
    """The cores other programs kept busy from its creation to cores(): the machine's busy CPU time less every rank's
    own (all-reduced), per second. Collective: every rank calls cores()."""

    def __init__(self):
        self.busy0, self.cpu0, self.t0 = cpu_busy_seconds(), time.process_time(), time.perf_counter()

    def seconds(self) -> float:
        return time.perf_counter() - self.t0

    def cores(self) -> float | None:
        own = torch.tensor([time.process_time() - self.cpu0])
        dist.all_reduce(own)  # every rank's CPU time: the rest of the machine's busy time is someone else's
        busy1 = cpu_busy_seconds()
        return None if self.busy0 is None else max(0.0, (busy1 - self.busy0 - float(own)) / self.seconds())


def race(runners: dict, batches, args, rank: int, world: int, per_node: int, rounds: int | None = None) -> dict:
    """Alternating rounds (the order rotating): every contender's step time (rank 0's clock; the collectives hold the
    ranks together) and what each node's link sent and received per step."""
    contenders = list(runners)
    steps = {n: [] for n in contenders}
    sent = {n: [] for n in contenders}
    others = Others()
    rounds = args.rounds if rounds is None else rounds
    for k in range(rounds):
        order = contenders[k % len(contenders) :] + contenders[: k % len(contenders)]
        for n in order:
            dist.barrier()
            b0, s0 = link.link_bytes(), time.perf_counter()
            for i, b in enumerate(batches):
                if k == rounds - 1 and i == args.round_steps - 1:
                    runners[n].timeline.start()  # the last step of the last round, drawn (rank 0's)
                runners[n].step(b)
                runners[n].timeline.on = False
            dist.barrier()
            s1, b1 = time.perf_counter(), link.link_bytes()
            steps[n].append((s1 - s0) / args.round_steps)
            sent[n].append({d: (b1[d] - b0[d]) / args.round_steps for d in ("tx", "rx")})
    foreign, span = others.cores(), others.seconds()
    # what each node's link counted: local rank 0's reading is its node's (every rank of a node reads one counter)
    nodes = [None] * world
    dist.all_gather_object(nodes, sent, group=agreement_group())
    per_node_bytes = {
        n: [{d: statistics.median(r[d] for r in nodes[i][n]) for d in ("tx", "rx")} for i in range(0, world, per_node)]
        for n in contenders
    }
    return {
        "rounds": rounds,
        "steps_per_round": args.round_steps,
        "step_s": steps,
        "median_step_s": {n: statistics.median(v) for n, v in steps.items()},
        "link_bytes_per_node": per_node_bytes,
        "link_bytes_per_round": {n: [r["tx"] for r in v] for n, v in sent.items()},
        "foreign_cores": foreign,
        "seconds": span,
        "collectives_per_step": {n: r.collectives_per_step for n, r in runners.items()},
        "timelines": {n: r.timeline.events for n, r in runners.items()} if rank == 0 else None,
    }


# The link-rate sweep: the contenders whose step the chapter draws against the link's rate, and the rates, as
# multiples of the race's own. At most SWEEP_MAX_MBIT: up to 640 Mbit/s the shaped link carried 98% of its nominal
# payload rate in this box (75.2 MB/s); dialed to 1280 it carried 169 MB/s, more than the 153 its rate allows (the
# filter's burst, on a CPU busy with four ranks), so that point would not measure a link of that rate.
SWEEP = ("ddp", "hierarchical", "fsdp2", "hsdp")
SWEEP_MAX_MBIT = 640


def sweep_rates(mbit: int, multiples) -> list[int]:
    """The sweep's rates (Mbit/s) beyond the race's own: mbit x each multiple, at most SWEEP_MAX_MBIT, no repeats."""
    return sorted({min(round(mbit * m), SWEEP_MAX_MBIT) for m in multiples if m > 1} - {mbit})


def at_rate(fit: dict, mbit: float, dialed_mbit: float) -> dict:
    """The link's fit (fit_level's dict) at another rate (two_level.link_fit)."""
    f = tl.link_fit(fit["alpha_s"], fit["bytes_per_s"], mbit, dialed_mbit)
    return {"alpha_s": f.alpha_s, "bytes_per_s": f.bandwidth}


def sweep_predictions(lay: tl.Layout, fits: dict, fast: dict, rates, dialed: int) -> dict:
    """{mbit: the SWEEP contenders' predictions at mbit}: the fit at the `dialed` rate, scaled to each rate; made
    before any timed step, as the race's own."""
    chosen = [n for n in SWEEP if n in fast]
    return {
        mbit: predictions(chosen, lay, {**fits, "inter": at_rate(fits["inter"], mbit, dialed)}, fast) for mbit in rates
    }


def sweep(runners: dict, batches, args, rank: int, world: int, per_node: int, rates) -> dict:
    """At each rate of `rates` (rank 0 dials every link), the SWEEP contenders raced in args.sweep_rounds alternating
    rounds: {mbit: race()'s result, without the timelines}."""
    chosen = {n: runners[n] for n in SWEEP if n in runners}
    out = {}
    for mbit in rates:
        dist.barrier()
        if rank == 0:
            link.dial(f"{mbit}mbit")
        dist.barrier()
        r = race(chosen, batches, args, rank, world, per_node, rounds=args.sweep_rounds)
        out[mbit] = {k: v for k, v in r.items() if k != "timelines"}
    return out


def memory_estimates(mem: dict | None, contenders, args, lay: tl.Layout) -> dict:
    """Per contender: the peak memory per rank measured (race_memory.memory's fresh processes) beside chapter 06's
    calculator's estimate: the ZeRO stage it is, its world the ranks it shards over (a node's, for HSDP)."""
    runtime = mem["runtime_mb"] if mem else 0.0
    out = {}
    for name in contenders:
        stage, impl, view, over = CALCULATOR[name]
        world = lay.world if over == "world" else lay.per_node
        est = estimate(args, stage, impl, view, world, runtime)
        got = (mem or {}).get("contenders", {}).get(name, {})
        out[name] = {
            "peak_mb": got.get("peak_mb"),
            "calculator_mb": est.peak_mb,
            "calculator": {"stage": stage, "impl": impl, "world": world},
        }
    return out


def benchmark_record(res: dict) -> dict:
    """benchmarks/two_level_<machine>.json: summary(res) and where it came from (machine, commit, command, load)."""
    from ..bench.provenance import provenance

    return {**summary(res), "provenance": provenance()}


def summary(res: dict) -> dict:
    """Per contender its step time and bytes per link, predicted and measured, and its peak memory per rank beside the
    calculator's; the link, the fits, the load the rounds ran under, the weights' differences."""
    race = res["race"]
    out = {}
    for name in res["contenders"]:
        pred = res["predicted"][name]
        nodes = race["link_bytes_per_node"][name]
        out[name] = {
            "variant": VARIANT[name][0],
            "step_s": {
                "unshaped": pred["unshaped_step_s"],
                "computation": pred["compute_s"],
                "predicted": pred["step_s"],
                "measured": race["median_step_s"][name],
                "rounds": race["step_s"][name],
            },
            "link_bytes_per_step": {"predicted": pred["link_bytes"], "measured_per_node": [b["tx"] for b in nodes]},
        }
    memory = {n: {"measured": m["peak_mb"], "calculator": m["calculator_mb"]} for n, m in res["memory"].items()}
    return {
        "layout": {"nodes": res["nodes"], "ranks_per_node": res["ranks_per_node"]},
        "model": "tiny",
        "timing_batch": res["timing_batch"],
        "link_mbit": res["link_mbit"],
        "grad_bytes": res["grad_bytes"],
        "compute_s": res["compute"],
        "fits": {
            k: {"alpha_s": v["alpha_s"], "bytes_per_s": v["bytes_per_s"], "smallest_bytes": v.get("smallest_bytes")}
            for k, v in res["fit"].items()
        },
        "rounds": race["rounds"],
        "foreign_cores": race["foreign_cores"],
        "calibration_foreign_cores": res.get("calibration_foreign_cores"),
        "contenders": out,
        "peak_mb_per_rank": memory,
        "correct": {k: v["max_weight_diff"] for k, v in res["correct"].items() if k != "grad_norm"},
        "grad_norm": res["correct"]["grad_norm"],
        "terms": {n: {k: res["predicted"][n][k] for k in MODEL_TERMS} for n in res["contenders"]},
        "sweep": sweep_summary(res),
    }


# What the chapter's curves need of each contender's prediction at the dialed rate (two_level.step_at)
MODEL_TERMS = ("compute_s", "intra_s", "inter_s", "inter_ops", "link_bytes", "step_s")


def sweep_summary(res: dict) -> dict:
    """{mbit: {contender: {predicted, measured (the median round), rounds}}}, the race's own rate included; {} for a
    launch without a sweep."""
    sw = res.get("sweep")
    if not sw:
        return {}
    race = res["race"]
    out = {res["link_mbit"]: {n: point(res["predicted"][n]["step_s"], race["step_s"][n]) for n in SWEEP}}
    for mbit, raced in sw["race"].items():
        predicted = sw["predicted"][mbit]
        out[int(mbit)] = {n: point(predicted[n]["step_s"], raced["step_s"][n]) for n in predicted}
    return dict(sorted(out.items()))


def point(predicted: float, rounds: list) -> dict:
    return {"predicted": predicted, "measured": statistics.median(rounds), "rounds": rounds}
