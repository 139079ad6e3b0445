"""How often does a finished gloo DDP rank abort at interpreter exit? A reproduction, outside the test suite.

    python scripts/repro_exit_abort.py --runs 20                 # each pattern, without the fix and with it
    python scripts/repro_exit_abort.py --runs 20 --out benchmarks/exit_abort_<machine>.json
    python scripts/slow_machine.py -- .venv/bin/python scripts/repro_exit_abort.py --runs 20   # under contention

Each launch is `torchrun --standalone --nproc_per_node=2` of this file's worker: a bare torch DDP loop over gloo (no
distrinews_lib in it: a small MLP, 30 steps), in one of two patterns:
- `ddp`: the loop, then destroy_process_group(), as most DDP scripts end;
- `inflight`: the loop, then a few async all-reduces whose handles are dropped (a metric all-reduced with
  async_op=True and never waited on), then destroy_process_group(). gloo's threads finish that work, and drop the
  last reference to its tensors, while the interpreter finalizes: the same race, made likely;
and ended in one of two modes:
- `plain`: the script simply ends;
- `fixed`: it ends through distrinews_lib.distributed.end_process (what every entry point of the course does).
A launch ABORTED when a rank was killed by a signal (torchrun reports exitcode -6, or a rank printed "terminate
called without an active exception"). Patterns and modes alternate launch by launch, so all see the same machine.

The day torch fixes the teardown (gloo's threads releasing finished work while the interpreter finalizes), `plain`
reads 0 aborts here too, and end_process can go back to a plain return.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ABORT = re.compile(r"terminate called without an active exception|exitcode\s*:\s*-6|Signals\.SIGABRT|SIGABRT")


def worker(pattern: str, fixed: bool) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 4)), bucket_cap_mb=0.25
    )  # several buckets: several async all-reduces in flight per step
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(30):
        x, y = torch.randn(32, 256), torch.randint(0, 4, (32,))
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if pattern == "inflight":
        for _ in range(20):
            dist.all_reduce(
                torch.randn(1_000_000), async_op=True
            )  # the handle is dropped: gloo holds the only reference
    if pattern == "ddp":
        dist.destroy_process_group()
    if fixed:
        sys.path.insert(0, str(REPO))
        from distrinews_lib.distributed import end_process

        end_process(0)


def launch(pattern: str, mode: str, timeout: float) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        __file__,
        "--worker",
        f"{pattern}:{mode}",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    t = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
        out, code, hung = p.stdout + p.stderr, p.returncode, False
    except subprocess.TimeoutExpired as e:
        out, code, hung = f"{e.stdout or ''}{e.stderr or ''}", None, True
    aborted = bool(ABORT.search(out))
    return {
        "pattern": pattern,
        "mode": mode,
        "returncode": code,
        "hung": hung,
        "aborted": aborted,
        "seconds": round(time.time() - t, 2),
        "evidence": [line for line in out.splitlines() if ABORT.search(line)][:3],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=20, help="launches per pattern and mode")
    p.add_argument("--patterns", default="ddp,inflight", help="ddp, inflight, or both")
    p.add_argument("--modes", default="plain,fixed", help="plain, fixed, or both (alternating)")
    p.add_argument("--timeout", type=float, default=120, help="seconds before a launch counts as hung")
    p.add_argument("--out", default=None, help="write the counts and every launch here (JSON)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        pattern, mode = args.worker.split(":")
        worker(pattern, mode == "fixed")
        return 0
    modes = [m for m in args.modes.split(",") if m]
    patterns = [m for m in args.patterns.split(",") if m]
    if (
        not modes
        or set(modes) - {"plain", "fixed"}
        or not patterns
        or set(patterns) - {"ddp", "inflight"}
        or args.runs < 1
    ):
        p.error("--modes takes plain and/or fixed, --patterns ddp and/or inflight; --runs at least 1")
    launches = []
    for i in range(args.runs):
        for pattern in patterns:
            for mode in modes:
                r = launch(pattern, mode, args.timeout)
                launches.append(r)
                flag = (
                    "ABORT"
                    if r["aborted"]
                    else "HUNG"
                    if r["hung"]
                    else "ok"
                    if r["returncode"] == 0
                    else f"exit {r['returncode']}"
                )
                print(f"{i + 1:3d}/{args.runs} {pattern:<8} {mode:<5} {flag:<6} {r['seconds']:5.1f} s", flush=True)
    summary = {}
    for pattern in patterns:
        for mode in modes:
            mine = [r for r in launches if r["mode"] == mode and r["pattern"] == pattern]
            summary[f"{pattern}:{mode}"] = {
                "pattern": pattern,
                "mode": mode,
                "launches": len(mine),
                "aborted": sum(r["aborted"] for r in mine),
                "hung": sum(r["hung"] for r in mine),
                "other_failures": sum(1 for r in mine if not r["aborted"] and not r["hung"] and r["returncode"]),
            }
    print("\npattern  mode   launches  aborted  hung  other failures")
    for s in summary.values():
        print(
            f"{s['pattern']:<8} {s['mode']:<6} {s['launches']:8d} {s['aborted']:8d} {s['hung']:5d} "
            f"{s['other_failures']:15d}"
        )
    if args.out:
        sys.path.insert(0, str(REPO))
        from distrinews_course.bench.provenance import provenance

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(
            json.dumps(
                {"benchmark": "exit_abort", **provenance(), "summary": summary, "launches": launches},
                indent=1,
                default=str,
            )
        )
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
