"""How long a checkpoint blocks training: dcp.save against dcp.async_save (through distrinews_lib.sharded_checkpoint,
as scripts/train_sharded.py saves), side by side in one run, rounds alternating which goes first.

    python scripts/bench_async_save.py                                  # 2 ranks (gloo, CPU), tiny and base models
    python scripts/bench_async_save.py --rounds 7 --out benchmarks/     # -> benchmarks/async_save_<machine>.json

Each model is DistilBERT from scratch, sharded with FSDP2 (tiny: the course's 2-layer, 64-wide one; base: the
distilbert-base-uncased shape, 66M parameters, built from its config, nothing downloaded) with AdamW state. A round
saves it once synchronously and once asynchronously. Per save, measured for the group (the last rank's call to the
last rank's return): how long training was blocked; for an async save also how long the background write took to
commit, and how long the optimizer steps that ran meanwhile took against steps with no save in flight. On a GPU
(CUDA available) the ranks train on their GPUs over NCCL and checkpoint over a gloo group; staging is then a copy
from GPU to host memory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _model(name: str, device):
    import torch
    from transformers import AutoModelForSequenceClassification, DistilBertConfig

    from distrinews_lib.models.build import TINY_CONFIG

    torch.manual_seed(0)
    config = DistilBertConfig(num_labels=4, **(TINY_CONFIG if name == "tiny" else {}))
    return AutoModelForSequenceClassification.from_config(config).to(device)


def worker(models: list, rounds: int, folder: Path) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from distrinews_lib import sharded_checkpoint as ckpt

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{rank % max(1, torch.cuda.device_count())}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(1)
    group = dist.new_group(backend="gloo")
    out = {}
    for name in models:
        model = _model(name, device)
        mesh = init_device_mesh(device.type, (world,))
        for layer in model.distilbert.transformer.layer:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randint(1000, 2000, (8, 64), device=device)
        y = torch.arange(8, device=device) % 4

        def step():
            t0 = time.time()
            model(input_ids=x, labels=y).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if cuda:
                torch.cuda.synchronize()
            return time.time() - t0

        def everyone_done(handle):
            """Whether every rank's save has committed. Asked of the whole group, so that every rank trains the
            same number of steps: a rank whose write ended first and stepped on alone would pair its next
            all-gather with another rank's barrier, and both would hang."""
            flag = torch.tensor([0.0 if handle.done() else 1.0], device=device)
            dist.all_reduce(flag)
            return flag.item() == 0.0

        idle = [step() for _ in range(4)]
        rows, n = [], 0
        for r in range(rounds):
            for mode in ("sync", "async") if r % 2 == 0 else ("async", "sync"):
                n += 1
                msd, osd = get_state_dict(model, optimizer)
                dist.barrier()
                handle = ckpt.save({"model": msd, "optim": osd}, folder / name, n, group=group,
                                   async_=mode == "async")  # fmt: skip
                during = []
                while not everyone_done(handle):  # train on while the background thread writes
                    during.append(step())
                handle.wait()
                idle.append(step())
                rows.append({"mode": mode, "started": handle.started, "returned": handle.returned,
                             "committed": handle.committed_at, "steps_during": during})  # fmt: skip
        state_bytes = sum(
            t.to_local().numel() * t.element_size() if hasattr(t, "to_local") else 0
            for sd in (msd, *[s for s in osd["state"].values()])
            for t in sd.values()
        )
        every = [None] * world
        dist.all_gather_object(every, {"rows": rows, "idle": idle, "state_bytes": state_bytes})
        if rank == 0:
            out[name] = summarise(every)
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


def summarise(ranks: list) -> dict:
    """Per mode, over the rounds: the group's blocked time and, for async, its background write; the step times."""
    saves = {"sync": [], "async": []}
    for i, row in enumerate(ranks[0]["rows"]):
        call = max(r["rows"][i]["started"] for r in ranks)
        back = max(r["rows"][i]["returned"] for r in ranks)
        done = max(r["rows"][i]["committed"] for r in ranks)
        during = [s for r in ranks for s in r["rows"][i]["steps_during"]]
        saves[row["mode"]].append({"blocked_ms": 1000 * (back - call), "background_ms": 1000 * (done - back),
                                   "steps_during": len(during) // len(ranks),
                                   "step_ms_during": 1000 * statistics.median(during) if during else None})  # fmt: skip
    idle = [s for r in ranks for s in r["idle"]]
    med = lambda rows, k: statistics.median(x[k] for x in rows if x[k] is not None)  # noqa: E731
    return {
        "state_mib_per_rank": max(r["state_bytes"] for r in ranks) / 2**20,
        "sync_blocked_ms": med(saves["sync"], "blocked_ms"),
        "async_blocked_ms": med(saves["async"], "blocked_ms"),
        "async_background_ms": med(saves["async"], "background_ms"),
        "step_ms_idle": 1000 * statistics.median(idle),
        "step_ms_during_async_write": med([s for s in saves["async"] if s["step_ms_during"]], "step_ms_during")
        if any(s["step_ms_during"] for s in saves["async"])
        else None,
        "rounds": saves,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=None, help="ranks (default: every GPU, else 2 CPU processes)")
    p.add_argument("--models", default="tiny,base", help="comma-separated: tiny, base")
    p.add_argument("--rounds", type=int, default=5, help="rounds of one sync and one async save each")
    p.add_argument("--out", default=None, help="a folder: write async_save_<machine>.json there")
    p.add_argument("--scratch", default="outputs/bench_async_save", help="where the checkpoints are written")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if any(m not in ("tiny", "base") for m in models):
        p.error(f"--models takes tiny and/or base, not {args.models}")
    if args.worker:
        worker(models, args.rounds, Path(args.scratch))
        return

    import shutil

    import torch

    from distrinews_course.bench.provenance import as_jsonable, machine_slug, provenance
    from distrinews_course.launch import torchrun

    info = provenance()
    nproc = args.nproc or (torch.cuda.device_count() or 2)
    shutil.rmtree(args.scratch, ignore_errors=True)
    res = torchrun(__file__, nproc, ["--worker", "--models", args.models, "--rounds", args.rounds, "--scratch",
                                     args.scratch], timeout=1800, echo=False)  # fmt: skip
    shutil.rmtree(args.scratch, ignore_errors=True)
    result = json.loads(next(line for line in res.lines if line.startswith("RESULT "))[len("RESULT ") :])
    for name, r in result.items():
        print(f"{name:>5}: {r['state_mib_per_rank']:7.1f} MiB of state per rank | blocked: sync "
              f"{r['sync_blocked_ms']:7.1f} ms, async {r['async_blocked_ms']:6.1f} ms (then written in "
              f"{r['async_background_ms']:.0f} ms) | step {r['step_ms_idle']:.0f} ms idle, "
              f"{r['step_ms_during_async_write'] or 0:.0f} ms during the write")  # fmt: skip
    if args.out:
        path = Path(args.out) / f"async_save_{machine_slug()}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"provenance": info, "nproc": nproc, "rounds": args.rounds, "models": result,
                  "how": __doc__.split("\n\n")[2].replace("\n", " ")}  # fmt: skip
        path.write_text(json.dumps(as_jsonable(record), indent=2) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    from distrinews_lib.distributed import run_and_end

    run_and_end(main)  # a rank ends without the interpreter's teardown (end_process says why)
