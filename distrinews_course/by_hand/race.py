"""The machinery of chapter 03's race (scripts/by_hand/race.py is its entry point): a Runner trains one contender
(torch's DDP, torch's FSDP2 or a rung of scripts/by_hand/) with a timeline of its steps, and each section of the race
(check, timing, the facts, the bucket sweep) is a function here, run on every rank; memory and sharding are
race_memory.py's."""

from __future__ import annotations

import importlib.util
import inspect
import statistics
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from distrinews_lib.errors import UserError

from ..bench.timing import cpu_busy_seconds, wait_for_quiet
from ..proc_self import bytes_written
from . import RUNGS, SCRIPTS, TWO_LEVEL, measure, models, report, rung_class
from .check import PASS, compare, crashed, hsdp_mistake, master_mistake, mesh_mistake, mistake, two_level_mistake
from .exercises import EXERCISES
from .rung import agreement_group, param_names
from .timeline import Timeline
from .watch import Collectives, calls_per_step

# torch 2.13 renamed collectives the rungs call; they keep the old names (every torch since 2.1 has them), unwarned
warnings.filterwarnings("ignore", message=r".*is deprecated. Please use `torch\.distributed\.")


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rung_modules(rungs, exercises):
    """{contender: module}, {contender: rung}. An exercise RUNG:FILE[:LABEL] is a fresh copy of the rung's script
    in which every class and function FILE defines replaces the script's own (the learner's rung class, or
    ZeRO-3's gather and free): contender LABEL (default RUNG)."""
    mods = {name: load(SCRIPTS / f"{name}.py", f"by_hand_{name}") for name in rungs}
    kinds = {name: name for name in rungs}
    for name in rungs:
        mods[name].RUNG = name  # which rung's class a Runner wraps (a contender's label may differ)
    for exercise in exercises:
        rung, path, label = (exercise.split(":") + [""])[:3]
        label = label or rung
        if rung not in RUNGS + TWO_LEVEL or rung not in EXERCISES:
            raise UserError(f"--exercise {exercise}: the exercises are {', '.join(EXERCISES)}")
        mod = load(SCRIPTS / f"{rung}.py", f"by_hand_{label}")
        learner = load(Path(path), f"exercise_{label}")
        need = EXERCISES[rung]
        if not hasattr(learner, need):
            raise UserError(f"{path} defines no {need}: keep the names the exercise's skeleton gives")
        for name, obj in vars(learner).items():
            if getattr(obj, "__module__", None) == learner.__name__ and hasattr(mod, name):
                setattr(mod, name, obj)
        mod.RUNG = rung
        mods[label], kinds[label] = mod, rung
    return mods, kinds


_MESH = {}
FSDP2 = ("fsdp2", "fsdp2_hsdp")  # torch's FSDP2 over every rank, and on a 2-D mesh (HSDP: chapter 08)
TORCH = ("ddp", *FSDP2)


def fsdp2(model, ranks_per_node=None, param_dtype=None):
    """torch's FSDP2 the way chapter 06 runs it (fsdp2_reshard_on): each transformer layer its own unit, the rest the
    root's, every unit's weights freed after forward and gathered again for backward (the root's too: ZeRO-3). With
    ranks_per_node, hybrid sharding (HSDP) on a 2-D mesh of N nodes x g ranks: FSDP2's docstring says the parameters
    are "sharded across the 1st dim and replicated across the 0th dim", so dim 0 is the nodes, dim 1 a node's ranks.
    param_dtype: MixedPrecisionPolicy(param_dtype, reduce_dtype=float32), ZeRO-3 by hand's split (FSDP2's default
    reduce_dtype is param_dtype)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    world, g = dist.get_world_size(), ranks_per_node
    key = (world, g)
    if key not in _MESH:  # one mesh (and its groups) per process and shape
        shape, names = ((world // g, g), ("replicate", "shard")) if g else ((world,), None)
        _MESH[key] = init_device_mesh("cpu", shape, mesh_dim_names=names)
    mesh = _MESH[key]
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
    for layer in models.layers(model):
        fully_shard(layer, mesh=mesh, reshard_after_forward=True, mp_policy=mp)
    fully_shard(model, mesh=mesh, reshard_after_forward=True, mp_policy=mp)
    return model


class Runner:
    """One model trained by torch's DDP ("ddp"), torch's FSDP2 ("fsdp2") or a rung, with a timeline of its steps.
    model_kw: build_model's (unused=...); dtype: the model's; find_unused: DDP's; param_dtype: mixed precision."""

    def __init__(
        self,
        name,
        kind,
        args,
        mods,
        rank,
        bucket_mb=None,
        grad_view=False,
        dtype=None,
        find_unused=False,
        dropout=True,
        param_dtype=None,
        **model_kw,
    ):
        self.name, self.timeline = name, Timeline()
        self.model = models.build_model(kind, seed=args.seed + rank, **model_kw)  # a different init per rank
        if dtype is not None:
            self.model.to(dtype)
        if not dropout:  # chapter 06's memory model (and its measurements) have none; nor has the dialed race
            models.without_dropout(self.model)
        if name not in FSDP2:  # (FSDP2 replaces the parameters: a hook would keep the unsharded ones alive)
            names = param_names(self.model)
            for p in self.model.parameters():  # first, so a tick is recorded before the rung's own hook runs
                p.register_post_accumulate_grad_hook(lambda p: self.timeline.ready(names[p]))
        bucket_mb = bucket_mb or args.bucket_mb
        if name == "ddp":
            self.dp = DDP(
                self.model,
                bucket_cap_mb=bucket_mb,
                gradient_as_bucket_view=grad_view,
                find_unused_parameters=find_unused,
            )
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
        elif name in FSDP2:
            for t in [*self.model.parameters(), *self.model.buffers()]:  # rank 0's weights, as DDP and the rungs
                dist.broadcast(t.data, src=0)
            self.dp = fsdp2(self.model, args.ranks_per_node if name == "fsdp2_hsdp" else None, param_dtype)
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
        else:
            cls, kw = rung_class(mods[name], getattr(mods[name], "RUNG", name)), {}
            if "ranks_per_node" in inspect.signature(cls).parameters:  # a two-level rung: the layout the race gives
                kw["ranks_per_node"] = getattr(args, "ranks_per_node", None)
            if param_dtype is not None:  # mixed precision: the sharded rungs' keyword, FSDP2's name
                kw["param_dtype"] = param_dtype
            self.dp = cls(self.model, bucket_mb, True, self.timeline, **kw)
            self.opt = self.dp.optimizer(args.lr, args.weight_decay)
        self.steps, self.first_grad, self.backward_s = 0, None, 0.0  # backward's seconds, summed over every step
        self.log = Collectives() if name in FSDP2 else None  # FSDP2 collectives, counted
        self.opt.register_step_pre_hook(self._note_gradient)

    def _note_gradient(self, opt, args, kwargs):
        """(sum of squares, numbers) of the gradients the optimizer steps with, at its first step (missing divide?)."""
        if self.first_grad is None:
            grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
            grads = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
            # a norm per tensor (no full-size temporary: the memory runs measure this step's peak)
            self.first_grad = (
                sum(float(torch.linalg.vector_norm(g)) ** 2 for g in grads),
                sum(g.numel() for g in grads),
            )

    def step(self, batch, micro=1, log=None):
        """One optimizer step on `batch`, in `micro` backward passes (accumulation, each on a slice of the batch)."""
        if self.log is not None:
            with self.log:
                return self._step(batch, micro, log)
        return self._step(batch, micro, log)

    def _step(self, batch, micro, log):
        n = len(batch["labels"])
        for k in range(micro):
            part = {key: v[k * n // micro : (k + 1) * n // micro] for key, v in batch.items()} if micro > 1 else batch
            with self.timeline.span("forward"):
                loss = (self.dp if self.name == "ddp" else self.model)(**part).loss
            if log is not None:
                log.in_backward = True
            t0 = time.perf_counter()
            try:
                with self.timeline.span("backward"):
                    loss.backward()
            finally:
                self.backward_s += time.perf_counter() - t0
                if log is not None:
                    log.in_backward = False
        with self.timeline.span("step"):
            if self.name in TORCH:
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
            else:
                self.dp.step(self.opt)
        self.steps += 1
        return loss

    def weights(self) -> list:
        """Every parameter's full value, in model.parameters() order (FSDP2 and ZeRO-3 gather them: every rank
        must call this at the same time)."""
        if self.name in FSDP2:
            return [p.full_tensor().detach().clone() for p in self.model.parameters()]
        if hasattr(self.dp, "full_weights"):
            return self.dp.full_weights()
        return [p.detach().clone() for p in self.model.parameters()]

    @property
    def collectives_per_step(self):
        if self.name == "ddp":  # DDP all-reduces each of its buckets once a step (in C++: no Python call to count)
            return float(len(ddp_buckets(self.dp)))
        if self.name in FSDP2:  # counted from its calls
            return len(self.log.calls) / max(1, self.steps)
        if getattr(self, "calls", None) is not None:  # counted from its calls in race()'s warm-up
            return sum(self.calls.values())
        return self.dp.collectives / max(1, self.steps)


def ddp_buckets(ddp) -> list:
    """The sizes (bytes) of DDP's buckets: the rebuilt ones once its first step has rebuilt them."""
    data = ddp._get_ddp_logging_data()
    sizes = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes") or ""
    return [int(s) for s in str(sizes).split(",") if s.strip()]


def names_of(runner):
    return [n for n, _ in runner.model.named_parameters()]


def inspect_file(obj):
    """The source file of a class or function (None for anything else)."""
    code = getattr(obj, "__code__", None) or getattr(getattr(obj, "__init__", None), "__code__", None)
    return code.co_filename if code else None


def stepped_norm(runner) -> float:
    """The norm of the whole gradient the optimizer stepped with at its first step (sharded or not), over the ranks."""
    s, n = runner.first_grad or (0.0, 0)
    t = torch.tensor([s, n], dtype=torch.float64)
    dist.all_reduce(t, group=agreement_group())
    replicated = float(t[1]) >= 1.5 * sum(p.numel() for p in runner.model.parameters())  # every rank holds it all
    return float(t[0] / (dist.get_world_size() if replicated else 1)) ** 0.5


# How far a rung may end from torch's DDP: bit-identical, but for the two-level rungs at 4 ranks, whose sums run in
# another order (their docstrings say which); fp32 addition is not associative.
TOLERANCE = {"hierarchical": 1e-6, "hsdp": 1e-6}


def check(kind, contenders, mods, args, rank, world, facts, cases, with_fsdp2=False, kinds=None):
    """Each contender against DDP on the same seed and texts: per step, the largest weight difference and where.
    with_fsdp2: torch's FSDP2 too (True), or the FSDP2 contenders named (fsdp2, fsdp2_hsdp)."""
    batches = models.batches(kind, rank, world, args.check_steps, args.batch_size)
    ref = Runner("ddp", kind, args, mods, rank)
    names = names_of(ref)
    torch.manual_seed(args.seed + 1000 + rank)  # dropout: the same masks for every runner on this rank
    snapshots = []
    for b in batches:
        ref.step(b)
        snapshots.append(ref.weights())
    ref_norm = stepped_norm(ref)
    ddp_state_bytes = measure.optimizer_state_bytes(ref.opt)
    out, hsdp = {}, {}
    for name in contenders:
        got = cases.run(name, kind, batches)
        if any(got["outcomes"]):
            out[name] = {"verdict": crashed(got["outcomes"]), "max_weight_diff": None, "first_diff": None}
            continue
        r, rung = got["runner"], (kinds or {}).get(name, name)
        first, worst = compare(got["weights"], snapshots, names)
        if first and worst <= TOLERANCE.get(rung, 0.0):
            first = None  # within rounding of DDP's, as the rung's docstring says
        ratio = stepped_norm(r) / ref_norm
        verdict = PASS
        level = {"hierarchical": two_level_mistake, "hsdp": hsdp_mistake}.get(rung)  # two levels: read from the calls
        found = master_mistake(r.dp, r.opt) or (level and level(got["calls"], rank, args.ranks_per_node, world))
        if found:
            verdict = found
        elif first and abs(ratio - world) < 0.05 * world:
            verdict = mistake("missing_divide", ratio=ratio, world=world)
        elif first and abs(ratio * world - 1) < 0.05:
            verdict = mistake("divided_twice", ratio=ratio)
        elif first:
            earlier = " (every earlier step was equal)" if first["step"] > 1 else ""
            verdict = mistake(
                "differs",
                detail=f"{kind} model: step {first['step']}, parameter "
                f"{first['param']} differs from torch's DDP by {first['diff']:.3g}" + earlier,
            )
        ticks = [e["name"] for e in r.timeline.events if e["kind"] == "ready"]
        out[name] = {
            "max_weight_diff": worst,
            "first_diff": first,
            "verdict": verdict,
            "gradient_ratio": ratio,
            "allreduces_per_step": r.collectives_per_step,
            "hook_calls_per_step": len(ticks) / len(batches),
            "params": len(names),
            "named_params_with_duplicates": len(list(r.model.named_parameters(remove_duplicate=False))),
            "optimizer_state_bytes": measure.optimizer_state_bytes(r.opt),
        }
        if hasattr(r.dp, "buckets"):
            out[name]["buckets"] = len(r.dp.buckets)
        if rung == "hsdp" and verdict["ok"]:
            hsdp[name] = got["weights"]
    fsdp2s = ("fsdp2",) if with_fsdp2 is True else tuple(with_fsdp2 or ())
    fsdp2s += ("fsdp2_hsdp",) if hsdp and "fsdp2_hsdp" not in fsdp2s else ()
    for name in fsdp2s:
        # torch's FSDP2 on the same steps (outside a sandbox: its device mesh is made once, on this group)
        r = Runner(name, kind, args, mods, rank)
        torch.manual_seed(args.seed + 1000 + rank)
        got = []
        for b in batches:
            r.step(b)
            got.append(r.weights())
        first, worst = compare(got, snapshots, names)
        out[name] = {"max_weight_diff": worst, "first_diff": first, "verdict": PASS}
        for mine, weights in hsdp.items() if name == "fsdp2_hsdp" else ():  # HSDP by hand against FSDP2's 2-D mesh
            out[mine]["max_weight_diff_vs_fsdp2"], found = mesh_mistake(weights, got, names, kind, TOLERANCE["hsdp"])
            out[mine]["verdict"] = found or out[mine]["verdict"]
    out["ddp"] = {
        "allreduces_per_step": ref.collectives_per_step,
        "optimizer_state_bytes": ddp_state_bytes,
        "bucket_bytes": ddp_buckets(ref.dp),
    }
    facts.setdefault("grad_bytes", {})[kind] = sum(p.numel() * p.element_size() for p in ref.model.parameters())
    return out


def timed_round(runner, batches, record):
    """Run the batches; returns rank 0's seconds per step (the ranks wait for each other in every collective) and its
    backward's seconds per step (the collectives a rung launches from its hooks run meanwhile)."""
    dist.barrier()
    b0, t0 = runner.backward_s, time.perf_counter()
    for i, b in enumerate(batches):
        if record and i == len(batches) - 1:
            runner.timeline.start()
        runner.step(b)
        runner.timeline.on = False
    dist.barrier()
    return (time.perf_counter() - t0) / len(batches), (runner.backward_s - b0) / len(batches)


def race(names, make, batches, rounds, warmup=1):
    """Alternating rounds (the order rotates), after `warmup` steps each, whose collectives are counted (runner.calls):
    each contender's seconds per step in every round, and its backward's seconds per step in every round."""
    runners = {n: make(n) for n in names}
    for r in runners.values():
        r.calls = calls_per_step(r.step, batches[:warmup])
    times, backward = {n: [] for n in names}, {n: [] for n in names}
    for k in range(rounds):
        order = names[k % len(names) :] + names[: k % len(names)]
        for n in order:
            step_s, backward_s = timed_round(runners[n], batches, record=k == rounds - 1)
            times[n].append(step_s)
            backward[n].append(backward_s)
    return runners, times, backward


def timing(names, mods, args, rank, world, rounds, benchmark=False) -> tuple:
    """The wide model: `rounds` alternating rounds of every contender in `names` (torch's DDP first); their median
    step times and ratios to DDP's, the collectives per step, the other programs' load meanwhile, the timelines."""
    batches = models.batches("wide", rank, world, args.round_steps, args.timing_batch_size)
    out = {}
    if benchmark and rank == 0:  # a benchmark file waits (up to a minute) for the other processes to calm down
        out["quiet_wait"] = wait_for_quiet(0.3, timeout_s=60)
    dist.barrier()
    busy0, cpu0, t0 = cpu_busy_seconds(), time.process_time(), time.perf_counter()
    runners, times, backward = race(
        names, lambda n: Runner(n, "wide", args, mods, rank, dropout=args.dropout), batches, rounds
    )
    own = torch.tensor([time.process_time() - cpu0])
    dist.all_reduce(own)  # both ranks' CPU time: the rest of the machine's busy time is someone else's
    busy1, span = cpu_busy_seconds(), time.perf_counter() - t0
    foreign = None if busy0 is None else max(0.0, (busy1 - busy0 - float(own)) / span)
    med = {n: statistics.median(v) for n, v in times.items()}
    out.update(
        {
            "model": "wide",
            "rounds": rounds,
            "steps_per_round": args.round_steps,
            "step_s": times,
            "backward_s": backward,  # DDP's holds the all-reduces of its buckets; a rung's, the launches of its own
            "median_step_s": med,
            "ratio_vs_ddp": {n: med[n] / med["ddp"] for n in names if n != "ddp"},
            "foreign_cores": foreign,
            "seconds": span,
            "collectives_per_step": {n: r.collectives_per_step for n, r in runners.items()},
            "collective_kinds": {n: r.calls for n, r in runners.items()},  # {kind: per step}; DDP's are in C++
            "timelines": {n: r.timeline.events for n, r in runners.items()} if rank == 0 else None,
        }
    )
    return out, runners, batches


def ddp_facts(runners, batches, names, args, mods, rank, world) -> dict:
    """What torch's DDP does on the wide model, seen from outside: its buckets, how the first steps rebuild them,
    what gradient_as_bucket_view shares, and the bytes each collective puts on the wire."""
    facts = {"ddp_buckets_wide": ddp_buckets(runners["ddp"].dp)}
    # Before its first step DDP has ONE bucket (the order gradients will arrive in is not known yet); the first
    # backward records that order and the second forward rebuilds buckets of bucket_cap_mb in it. With
    # gradient_as_bucket_view the gradients are views into the buckets, so their storages show the buckets.
    fresh = Runner("ddp", "wide", args, mods, rank, grad_view=True)
    storages = []
    fresh.timeline.start()
    for b in batches[:3]:
        fresh.dp(**b).loss.backward()
        storages.append(len({p.grad.untyped_storage().data_ptr() for p in fresh.model.parameters()}))
        fresh.opt.step()
        fresh.opt.zero_grad(set_to_none=True)
    facts["ddp_rebuild"] = {
        "buckets_seen_per_step": storages,
        "ready_order": [e["name"] for e in fresh.timeline.events if e["kind"] == "ready"][: len(names_of(fresh))],
        "definition_order": names_of(fresh),
    }
    # gradient_as_bucket_view: the gradients ARE views into DDP's buckets instead of tensors of their own.
    views = {}
    for flag in (False, True):
        r = Runner("ddp", "wide", args, mods, rank, grad_view=flag)
        for b in batches[:2]:
            r.dp(**b).loss.backward()  # no zero_grad: keep the gradients to look at
        storages = {
            p.grad.untyped_storage().data_ptr(): p.grad.untyped_storage().nbytes() for p in r.model.parameters()
        }
        views[str(flag)] = {
            "grad_storages": len(storages),
            "grad_storage_bytes": sum(storages.values()),
            "buckets": len(ddp_buckets(r.dp)),
        }
    facts["gradient_as_bucket_view"] = views
    # Bytes on the wire of each collective alone, on a buffer of the wide model's size.
    n = sum(p.numel() for p in runners["ddp"].model.parameters())
    n -= n % world
    full, part = torch.ones(n), torch.ones(n // world)
    ops = {
        "all_reduce": lambda: dist.all_reduce(full),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, full),
        "all_gather": lambda: dist.all_gather_into_tensor(full, part),
    }
    volume = {"buffer_bytes": n * 4}
    for name, op in ops.items():
        dist.barrier()
        b0 = bytes_written()
        for _ in range(3):
            op()
        sent = None if b0 is None else (bytes_written() - b0) / 3
        total = torch.tensor([sent or 0.0], dtype=torch.float64)
        dist.all_reduce(total)  # both ranks' bytes, as the loopback counter saw them (after the count)
        volume[name] = None if sent is None else float(total)
    facts["collective_bytes"] = volume
    return facts


def bucket_sweep(sizes_mb, batches, args, mods, rank, with_ddp=True) -> dict:
    """The hand-built bucketed rung (and torch's DDP, with_ddp) at each bucket size: every size in the same
    alternating rounds, so that a slower minute of the machine cannot make one size look worse than the next."""
    impls = ("ddp", "bucketed") if with_ddp else ("bucketed",)
    names = [f"{impl}@{mb}" for mb in sizes_mb for impl in impls]

    def make(n):
        impl, mb = n.split("@")
        return Runner(impl, "wide", args, mods, rank, bucket_mb=float(mb), dropout=args.dropout)

    runners, times, _ = race(names, make, batches, args.sweep_rounds)
    out = {}
    for mb in sizes_mb:
        out[str(mb)] = {
            "bucketed_step_s": statistics.median(times[f"bucketed@{mb}"]),
            "bucketed_rounds_s": times[f"bucketed@{mb}"],  # each round's step: how far the rounds agree
            "bucketed_buckets": len(runners[f"bucketed@{mb}"].dp.buckets),
        }
        if with_ddp:
            out[str(mb)] |= {
                "ddp_step_s": statistics.median(times[f"ddp@{mb}"]),
                "ddp_buckets": len(ddp_buckets(runners[f"ddp@{mb}"].dp)),
            }
    return out


def benchmark_record(res: dict, args, world: int) -> dict:
    """benchmarks/ddp_by_hand_<machine>.json: every rung's summary, the sweep, sharding and the collectives' bytes,
    with the load the rounds were timed under and the machine's provenance."""
    from ..bench.provenance import provenance

    loads = [res["timing"]["foreign_cores"], res["zero_timing"]["foreign_cores"]]
    quiet = None not in loads and max(loads) <= 0.3
    return {
        "rungs": report.rung_summary(res),
        "ddp_median_step_s": res["timing"]["median_step_s"]["ddp"],
        "model": "wide",
        "bucket_mb": args.bucket_mb,
        "world_size": world,
        "backend": "gloo",
        "foreign_cores": res["timing"]["foreign_cores"],
        "quiet": quiet,
        "zero_foreign_cores": res["zero_timing"]["foreign_cores"],
        "note": "the step-time ratios were timed on a quiet machine"
        if quiet
        else "other processes kept the machine busy while the rounds were timed (foreign_cores): the "
        "step-time ratios are not speed claims; the weights, counts, bytes and memory do not depend "
        "on load",
        "sweep": res.get("sweep"),
        "sharding": res.get("sharding"),
        "collective_bytes": res["facts"]["collective_bytes"],
        "provenance": provenance(),
    }
