"""Pitfall 5: several ranks writing one file.

Every rank runs the same "save" line. Appending to a log gives N rows per epoch, each with a
different (rank-local) number. Writing one file gives a race: each rank truncates it and writes
from offset 0, and the file ends up with one rank's bytes followed by the tail of another's -
unreadable. Barriers below force the unlucky interleaving so the demo is reproducible; in a real
run it happens only sometimes, which is worse. Fix: rank 0 writes (atomically: temp file +
rename), after an all-reduce when the number must be global; the others wait at a barrier.
"""

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from distrinews_course.demo import finish, result, start, write_json

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["broken", "fixed", "both"], default="both")
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--dir", default="outputs/pitfalls/05_files")
p.add_argument("--out", default="outputs/pitfalls/05_shared_file.json")
args = p.parse_args()

ctx = start()
folder = Path(args.dir)
folder.mkdir(parents=True, exist_ok=True)
torch.manual_seed(ctx.rank)
local_losses = [round(float(torch.rand(())), 4) for _ in range(args.epochs)]  # this rank's numbers


def global_mean(values):
    t = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t)
    return [round(v, 4) for v in (t / ctx.world).tolist()]


report = {}
for mode in (["broken", "fixed"] if args.mode == "both" else [args.mode]):
    log, summary = folder / f"{mode}_metrics.csv", folder / f"{mode}_summary.json"
    if ctx.rank == 0:
        log.unlink(missing_ok=True)
        summary.unlink(missing_ok=True)
    dist.barrier()
    if mode == "broken":
        # every rank appends its own row per epoch...
        for epoch, loss in enumerate(local_losses):
            with open(log, "a") as f:                  # BUG: every rank appends
                f.write(f"{epoch},{loss}\n")
        # ...and every rank writes "the" summary file (lower ranks have more to say: longer files)
        payload = json.dumps({"rank": ctx.rank, "losses": local_losses, "notes": "x" * 40 * (ctx.world - ctx.rank)})
        f = open(summary, "w")                       # BUG: each rank truncates the file...
        dist.barrier()
        for r in range(ctx.world):                   # ...then writes from offset 0, one after the other
            if r == ctx.rank:
                f.write(payload)
                f.flush()
            dist.barrier()
        f.close()
    else:
        losses = global_mean(local_losses)           # THE FIX: one global number per epoch...
        if ctx.rank == 0:                            # THE FIX: ...written by rank 0 only, atomically
            with open(log, "w") as f:
                f.writelines(f"{epoch},{loss}\n" for epoch, loss in enumerate(losses))
            tmp = summary.with_name(summary.name + ".tmp")
            tmp.write_text(json.dumps({"losses": losses}))
            os.replace(tmp, summary)                 # THE FIX: readers see the old file or the new, never half
    dist.barrier()                                   # everyone waits for the writer before reading
    rows = log.read_text().splitlines()
    try:
        json.loads(summary.read_text())
        readable, error = True, None
    except json.JSONDecodeError as err:
        readable, error = False, f"JSONDecodeError: {err}"
    result(ctx, mode=mode, csv_rows=len(rows), summary_readable=readable)
    epochs_logged = [int(r.split(",")[0]) for r in rows]
    report[mode] = {"csv_rows": len(rows), "rows_per_epoch": max(epochs_logged.count(e) for e in range(args.epochs)),
                    "distinct_losses_epoch0": len({r.split(",")[1] for r in rows if r.startswith("0,")}),
                    "summary_readable": readable, "error": error}
    dist.barrier()
write_json(args.out, {"world_size": ctx.world, "epochs": args.epochs, **report}, ctx.rank)
finish()
