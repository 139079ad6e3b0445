"""Run the course's training scripts UNCHANGED, many times in ONE torchrun launch, and time a window of
their optimizer steps (distrinews_course.bench.harness). The measuring tool of chapter 05, which prints one line per
run as it ends.

    torchrun --nproc_per_node=2 scripts/bench_runs.py RESULTS.json RUNS.json

RUNS.json maps a name to a run: {"world": 1 or N, "warmup": W, "steps": S, "flags": [...]}, and optionally
"hook" (fp16, bf16 or powersgd: one of torch's gradient compression hooks; none: DDP with no all-reduce at
all, its own work alone), "straggler_ms" (the last rank sleeps that long after each optimizer step),
"breakdown": true (each step's parts, timed on every rank: distrinews_course/perf_model.py's StepClock) and
"profile": PREFIX (a torch.profiler Chrome trace of two steps per rank, PREFIX_rank<r>.json). A run with
"world": 1 is scripts/train_single.py on rank 0 alone (the other ranks wait: one device), or with
"every_rank": true on every rank at once, each on its own (what sharing the machine costs, without any
communication); any other run is scripts/train_ddp.py on every rank, with every gradient bucket's
all-reduce timed and every byte sent counted. A run {"collectives": {"sizes": [...]}} times all_reduce over
those message sizes instead (perf_model.time_collectives), with the cores other programs kept busy meanwhile.
Inside scripts/cluster/box.py a run's "link": RATE
first dials every node's link to that rate (distrinews_course/link.py).
"""
import contextlib
import json
import sys
import time

import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.profiler import ProfilerActivity, profile, schedule

from distrinews_course import link, perf_model
from distrinews_course.bench import harness, throughput
from distrinews_course.bench.timing import cpu_busy_seconds, foreign_cores
from distrinews_lib.distributed import end_process


@contextlib.contextmanager
def profiled(prefix, rank, warmup):
    """torch.profiler over two optimizer steps after the warm-up, exported as Chrome-trace JSON."""
    prof = profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=max(warmup - 1, 0), warmup=1, active=2),
                   on_trace_ready=lambda p: p.export_chrome_trace(f"{prefix}_rank{rank}.json"))
    hook = register_optimizer_step_post_hook(lambda *_: prof.step())
    prof.start()
    try:
        yield
    finally:
        hook.remove()
        prof.stop()


def import_what_the_scripts_import():
    """On every rank at once, before the first run: otherwise each rank pays seconds of imports (transformers) in
    its first run, rank 1 only once rank 0's first run is over."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, DistilBertConfig  # noqa: F401

    from distrinews_lib import checkpoint, plan  # noqa: F401
    from distrinews_lib.training import config, epochs, evaluation, optim, snapshot, tracking  # noqa: F401


results_path, runs = sys.argv[1], json.loads(open(sys.argv[2]).read())
results = {}
if any("collectives" not in run for run in runs.values()):  # a launch of collectives alone runs no script
    import_what_the_scripts_import()
with harness.shared_process_group():
    rank, world = dist.get_rank(), dist.get_world_size()
    for name, run in runs.items():
        if run.get("link"):  # inside scripts/cluster/box.py: every link dialed to this rate before the run
            dist.barrier()
            if rank == 0:
                link.dial(run["link"])
            dist.barrier()
        if "collectives" in run:
            busy, cpu, wall = cpu_busy_seconds(), time.process_time(), time.perf_counter()
            rows = perf_model.time_collectives(**run["collectives"])
            wall, cpu, busy = time.perf_counter() - wall, time.process_time() - cpu, (busy, cpu_busy_seconds())
            sent, cpus = [None] * world, [None] * world
            dist.all_gather_object(sent, [r["sent"] for r in rows])
            dist.all_gather_object(cpus, cpu)  # every rank's CPU, its gloo threads' included: ours, not others'
            if rank == 0:
                results[name] = {**run, "world": world, "others_cores": foreign_cores(*busy, sum(cpus), wall),
                                 "rows": [{**r, "sent_by_rank": [s[i] for s in sent]} for i, r in enumerate(rows)]}
            continue
        window, clock, started = None, perf_model.StepClock(), time.perf_counter()
        timers = clock if run.get("breakdown") else contextlib.nullcontext()
        prof = profiled(run["profile"], rank, run["warmup"]) if run.get("profile") else contextlib.nullcontext()
        if run["world"] == 1 and run.get("every_rank"):  # one process per rank at once, no communication
            flags = [f"{f}.rank{rank}" if prev in ("--output", "--checkpoint") else f
                     for prev, f in zip([None, *run["flags"]], run["flags"])]
            with harness.alone(), timers:
                window = harness.run("scripts/train_single.py", flags, warmup=run["warmup"], steps=run["steps"])
        elif run["world"] == 1:
            if rank == 0:
                with harness.alone(), timers, prof:
                    window = harness.run("scripts/train_single.py", run["flags"], warmup=run["warmup"],
                                         steps=run["steps"])
            dist.barrier()
        else:
            slow = rank == world - 1 and run.get("straggler_ms")
            hook = (register_optimizer_step_post_hook(lambda *_: time.sleep(run["straggler_ms"] / 1000))
                    if slow else None)
            with timers, prof:
                window = harness.run("scripts/train_ddp.py", run["flags"], warmup=run["warmup"], steps=run["steps"],
                                     comm=True, hook=run.get("hook"))
            if hook:
                hook.remove()
        mine = {**window.result(), "events": clock.events,
                "wire_bytes_per_step": clock.written_per_step(run["warmup"], run["steps"])} if window else None
        everyone = [None] * world
        dist.all_gather_object(everyone, mine)
        ranks = [r for r in everyone if r]
        if rank == 0:
            if run.get("breakdown"):
                parts = perf_model.breakdown([r["events"] for r in ranks], run["warmup"], run["steps"])
                times = [perf_model.step_times(r["events"], run["warmup"], run["steps"]) for r in ranks]
                ranks = [{**r, "parts": p, "step_times": t} for r, p, t in zip(ranks, parts, times)]
            ranks = [{k: v for k, v in r.items() if k != "events"} for r in ranks]
            total = throughput.over_ranks(ranks)  # the run lasts as long as its slowest rank; samples add up
            results[name] = {**run, "ranks": ranks, **{k: total[k] for k in ("seconds", "samples", "samples_per_s")},
                             "wall_s": time.perf_counter() - started}  # the whole run: start-up, warm-up, window, end
            print(f"[bench_runs] {name}: {total['samples']} samples in {total['seconds']:.2f} s = "
                  f"{total['samples_per_s']:.0f} samples/s", flush=True)
    if rank == 0:
        with open(results_path, "w") as f:
            json.dump(results, f, indent=1)


end_process(0)  # everything is written; end without the interpreter's teardown, where gloo's threads can abort a rank
