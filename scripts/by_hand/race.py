"""Chapter 03's race: every rung of scripts/by_hand/ against torch's DDP, in ONE launch of 2 gloo ranks.

1. check: each rung and torch's DDP train the same model from the same seed on the same texts; the weights are
   compared after every step (the first difference names its step and parameter). Models: tiny and tied.
2. timing (wide model): alternating rounds, the order rotating each round; the median step time of each.
3. sweep: bucket sizes, the hand-built bucketed rung against torch's DDP, alternating.
4. facts: DDP's buckets in its first steps, what gradient_as_bucket_view shares, the bytes each collective puts
   on the wire.

    torchrun --standalone --nproc_per_node=2 scripts/by_hand/race.py --out outputs/by_hand/race.json
"""
import argparse
import importlib.util
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from distrinews_lib.bench.timing import cpu_busy_seconds, wait_for_quiet
from distrinews_lib.course import by_hand
from distrinews_lib.distributed import run_and_end
from distrinews_lib.errors import UserError, main_guard
from distrinews_lib.files import atomic_write_json

HERE = Path(__file__).resolve().parent
EXERCISE_FUNCTION = {"overlapped": "on_grad_ready", "bucketed": "on_grad_ready", "zero1": "sharded_step"}


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rung_modules(rungs, exercise):
    mods = {name: load(HERE / f"{name}.py", f"by_hand_{name}") for name in rungs}
    if exercise:  # the learner's function replaces the script's own
        rung, _, path = exercise.partition(":")
        fn = EXERCISE_FUNCTION.get(rung)
        if rung not in mods or fn is None:
            raise UserError(f"--exercise {exercise}: the exercises are {', '.join(EXERCISE_FUNCTION)} (and in --rungs)")
        learner = load(Path(path), f"exercise_{rung}")
        if not hasattr(learner, fn):
            raise UserError(f"{path} defines no function {fn}(...): keep the name the exercise cell gives it")
        setattr(mods[rung], fn, getattr(learner, fn))
    return mods


class Runner:
    """One model trained by torch's DDP ("ddp") or by a rung, with a timeline of its steps."""

    def __init__(self, name, kind, args, mods, rank, bucket_mb=None, grad_view=False):
        self.name, self.timeline = name, by_hand.Timeline()
        self.model = by_hand.build_model(kind, seed=args.seed + rank)  # a different init per rank: broadcast fixes it
        names = by_hand.param_names(self.model)
        for p in self.model.parameters():  # first, so a tick is recorded before the rung's own hook runs
            p.register_post_accumulate_grad_hook(lambda p: self.timeline.ready(names[p]))
        bucket_mb = bucket_mb or args.bucket_mb
        if name == "ddp":
            self.dp = DDP(self.model, bucket_cap_mb=bucket_mb, gradient_as_bucket_view=grad_view)
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
        else:
            self.dp = mods[name].DataParallel(self.model, bucket_mb, True, self.timeline)
            self.opt = self.dp.optimizer(args.lr, args.weight_decay)
        self.steps = 0

    def step(self, batch):
        with self.timeline.span("forward"):
            loss = (self.dp if self.name == "ddp" else self.model)(**batch).loss
        with self.timeline.span("backward"):
            loss.backward()
        with self.timeline.span("step"):
            if self.name == "ddp":
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
            else:
                self.dp.step(self.opt)
        self.steps += 1
        return loss

    @property
    def collectives_per_step(self):
        if self.name == "ddp":  # DDP all-reduces each of its buckets once a step
            return float(len(ddp_buckets(self.dp)))
        return self.dp.collectives / max(1, self.steps)


def ddp_buckets(ddp) -> list:
    """The sizes (bytes) of DDP's buckets: the rebuilt ones once its first step has rebuilt them."""
    data = ddp._get_ddp_logging_data()
    sizes = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes") or ""
    return [int(s) for s in str(sizes).split(",") if s.strip()]


def names_of(runner):
    return [n for n, _ in runner.model.named_parameters()]


def weights(model):
    return [p.detach().clone() for p in model.parameters()]


def max_across_ranks(x: float) -> float:
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def check(kind, rungs, mods, args, rank, world, facts):
    """Each rung against DDP on the same seed and texts: per step, the largest weight difference and where."""
    batches = by_hand.batches(kind, rank, world, args.check_steps, args.batch_size)
    ref = Runner("ddp", kind, args, mods, rank)
    names = [n for n, _ in ref.model.named_parameters()]
    torch.manual_seed(args.seed + 1000 + rank)  # dropout: the same masks for every runner on this rank
    snapshots = []
    for b in batches:
        ref.step(b)
        snapshots.append(weights(ref.model))
    ddp_state_bytes = by_hand.optimizer_state_bytes(ref.opt)
    out = {}
    for rung in rungs:
        r = Runner(rung, kind, args, mods, rank)
        torch.manual_seed(args.seed + 1000 + rank)
        r.timeline.start()
        first, worst = None, 0.0
        for step, b in enumerate(batches, 1):
            r.step(b)
            for name, a, ref_w in zip(names, r.model.parameters(), snapshots[step - 1]):
                d = float((a.detach() - ref_w).abs().max())
                worst = max(worst, d)
                if d > 0 and first is None:
                    first = {"step": step, "param": name, "diff": d}
        firsts = [None] * world
        dist.all_gather_object(firsts, first)
        first = next((f for f in firsts if f), None)
        ticks = [e["name"] for e in r.timeline.events if e["kind"] == "ready"]
        out[rung] = {"max_weight_diff": max_across_ranks(worst), "first_diff": first,
                     "allreduces_per_step": r.collectives_per_step,
                     "hook_calls_per_step": len(ticks) / len(batches), "params": len(names),
                     "named_params_with_duplicates": len(list(r.model.named_parameters(remove_duplicate=False))),
                     "optimizer_state_bytes": by_hand.optimizer_state_bytes(r.opt)}
        if rung == "bucketed":
            out[rung]["buckets"] = len(r.dp.buckets)
    out["ddp"] = {"allreduces_per_step": ref.collectives_per_step, "optimizer_state_bytes": ddp_state_bytes,
                  "bucket_bytes": ddp_buckets(ref.dp)}
    facts.setdefault("grad_bytes", {})[kind] = sum(p.numel() * p.element_size() for p in ref.model.parameters())
    return out


def written_bytes() -> int | None:
    """Bytes this process has written so far (gloo's sockets included), or None off Linux. Per process, so other
    programs' traffic on the machine cannot leak into the count (/proc/net/dev's loopback counter would)."""
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))
    except (OSError, StopIteration, ValueError):
        return None


def timed_round(runner, batches, record):
    """Run the batches; returns rank 0's seconds per step (the ranks wait for each other in every collective)."""
    dist.barrier()
    t0 = time.perf_counter()
    for i, b in enumerate(batches):
        if record and i == len(batches) - 1:
            runner.timeline.start()
        runner.step(b)
        runner.timeline.on = False
    dist.barrier()
    return (time.perf_counter() - t0) / len(batches)


def race(names, make, batches, rounds, warmup=1):
    """Alternating rounds (the order rotates), after `warmup` steps each; the median seconds per step of each."""
    runners = {n: make(n) for n in names}
    for r in runners.values():
        for b in batches[:warmup]:
            r.step(b)
    times = {n: [] for n in names}
    for k in range(rounds):
        order = names[k % len(names):] + names[:k % len(names)]
        for n in order:
            times[n].append(timed_round(runners[n], batches, record=k == rounds - 1))
    return runners, times


@main_guard
def main():
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--rungs", default=",".join(by_hand.RUNGS))
    p.add_argument("--models", default="tiny,tied")
    p.add_argument("--check_steps", type=int, default=3)
    p.add_argument("--check_only", action="store_true")
    p.add_argument("--exercise", default=None, help="RUNG:FILE, the learner's function replacing the rung's own")
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight_decay", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--bucket_mb", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--round_steps", type=int, default=3)
    p.add_argument("--sweep", default="0.25,1,25", help="bucket sizes (MB) for the sweep; empty: no sweep")
    p.add_argument("--sweep_rounds", type=int, default=3)
    p.add_argument("--timeout_s", type=float, default=60)
    p.add_argument("--out", required=True)
    p.add_argument("--benchmark", default=None, help="also write the benchmark file (benchmarks/ddp_by_hand_<machine>.json)")
    args = p.parse_args()
    rungs = [r for r in args.rungs.split(",") if r]
    bad = [r for r in rungs if r not in by_hand.RUNGS]
    if bad:
        raise UserError(f"--rungs: unknown {bad}; the rungs are {', '.join(by_hand.RUNGS)}")
    rank, world = by_hand.init(args.timeout_s)
    mods = rung_modules(rungs, args.exercise)
    started = time.perf_counter()
    res = {"rungs": rungs, "world_size": world, "steps": args.check_steps, "bucket_mb": args.bucket_mb,
           "batch_size": args.batch_size, "check": {}, "facts": {}}
    for kind in [m for m in args.models.split(",") if m]:
        res["check"][kind] = check(kind, rungs, mods, args, rank, world, res["facts"])
    res["seconds_check"] = time.perf_counter() - started
    if not args.check_only:
        batches = by_hand.batches("wide", rank, world, args.round_steps, args.batch_size)
        names = ["ddp", *rungs]
        if args.benchmark and rank == 0:  # a benchmark file waits (up to a minute) for the other processes to calm down
            res["quiet_wait"] = wait_for_quiet(0.3, timeout_s=60)
        dist.barrier()
        busy0, cpu0, t0 = cpu_busy_seconds(), time.process_time(), time.perf_counter()
        runners, times = race(names, lambda n: Runner(n, "wide", args, mods, rank), batches, args.rounds)
        own = torch.tensor([time.process_time() - cpu0])
        dist.all_reduce(own)  # both ranks' CPU time: the rest of the machine's busy time is someone else's
        busy1, span = cpu_busy_seconds(), time.perf_counter() - t0
        foreign = None if busy0 is None else max(0.0, (busy1 - busy0 - float(own)) / span)
        med = {n: statistics.median(v) for n, v in times.items()}
        res["timing"] = {"model": "wide", "rounds": args.rounds, "steps_per_round": args.round_steps,
                         "step_s": times, "median_step_s": med,
                         "ratio_vs_ddp": {n: med[n] / med["ddp"] for n in rungs},
                         "foreign_cores": foreign, "seconds": span,
                         "collectives_per_step": {n: r.collectives_per_step for n, r in runners.items()},
                         "timelines": {n: r.timeline.events for n, r in runners.items()} if rank == 0 else None}
        ddp = runners["ddp"].dp
        res["facts"]["ddp_buckets_wide"] = ddp_buckets(ddp)
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
        res["facts"]["ddp_rebuild"] = {
            "buckets_seen_per_step": storages,
            "ready_order": [e["name"] for e in fresh.timeline.events if e["kind"] == "ready"][:len(names_of(fresh))],
            "definition_order": names_of(fresh)}
        # gradient_as_bucket_view: the gradients ARE views into DDP's buckets instead of tensors of their own.
        views = {}
        for flag in (False, True):
            r = Runner("ddp", "wide", args, mods, rank, grad_view=flag)
            for b in batches[:2]:
                r.dp(**b).loss.backward()  # no zero_grad: keep the gradients to look at
            storages = {p.grad.untyped_storage().data_ptr(): p.grad.untyped_storage().nbytes()
                        for p in r.model.parameters()}
            views[str(flag)] = {"grad_storages": len(storages), "grad_storage_bytes": sum(storages.values()),
                                "buckets": len(ddp_buckets(r.dp))}
        res["facts"]["gradient_as_bucket_view"] = views
        # Bytes on the wire of each collective alone, on a buffer of the wide model's size.
        n = sum(p.numel() for p in runners["ddp"].model.parameters())
        n -= n % world
        full, part = torch.ones(n), torch.ones(n // world)
        ops = {"all_reduce": lambda: dist.all_reduce(full),
               "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, full),
               "all_gather": lambda: dist.all_gather_into_tensor(full, part)}
        volume = {"buffer_bytes": n * 4}
        for name, op in ops.items():
            dist.barrier()
            b0 = written_bytes()
            for _ in range(3):
                op()
            sent = None if b0 is None else (written_bytes() - b0) / 3
            total = torch.tensor([sent or 0.0], dtype=torch.float64)
            dist.all_reduce(total)  # both ranks' bytes, as the loopback counter saw them (after the count)
            volume[name] = None if sent is None else float(total)
        res["facts"]["collective_bytes"] = volume
        sweep = [float(x) for x in args.sweep.split(",") if x]
        if sweep and "bucketed" in rungs:
            res["sweep"] = {}
            for mb in sweep:
                def make(n, mb=mb):
                    return Runner(n.split("@")[0], "wide", args, mods, rank, bucket_mb=mb)
                runners, times = race(["ddp", "bucketed"], make, batches, args.sweep_rounds)
                res["sweep"][str(mb)] = {"ddp_step_s": statistics.median(times["ddp"]),
                                         "bucketed_step_s": statistics.median(times["bucketed"]),
                                         "bucketed_buckets": len(runners["bucketed"].dp.buckets),
                                         "ddp_buckets": len(ddp_buckets(runners["ddp"].dp))}
    res["seconds"] = time.perf_counter() - started
    if rank == 0:
        atomic_write_json(args.out, res)
        if args.benchmark and not args.check_only:
            from distrinews_lib.bench.provenance import provenance

            atomic_write_json(args.benchmark, {
                "rungs": by_hand.rung_summary(res), "ddp_median_step_s": res["timing"]["median_step_s"]["ddp"],
                "model": "wide", "bucket_mb": args.bucket_mb, "world_size": world, "backend": "gloo",
                "foreign_cores": res["timing"]["foreign_cores"], "sweep": res.get("sweep"),
                "collective_bytes": res["facts"]["collective_bytes"], "provenance": provenance()})
        print(f"race: {len(rungs)} rung(s) checked on {', '.join(res['check'])} in {res['seconds']:.1f} s -> {args.out}")
    dist.destroy_process_group()


if __name__ == "__main__":
    run_and_end(main)  # end without the interpreter's teardown, where gloo's threads can abort a finished rank
