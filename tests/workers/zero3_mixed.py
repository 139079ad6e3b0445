"""ZeRO-3 by hand (scripts/by_hand/zero3.py) in mixed precision, as a peer's own script uses it: a bare
dist.init_process_group("gloo") and nothing of the course's set-up; the rung wraps the model, forward and backward
run, sync_gradients() lands the gradients on the fp32 master shards, and a plain torch optimizer steps dp.parameters().
On 2 ranks (torchrun), against torch's FSDP2 with the same MixedPrecisionPolicy and against one process that casts
the same way; and float16 with torch.amp.GradScaler. Rank 0 writes the JSON.

    torchrun --standalone --nproc_per_node=2 tests/workers/zero3_mixed.py --out mixed.json
"""

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from distrinews_course.by_hand import models  # noqa: E402  (the chapter's models and real texts)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
STEPS, BATCH, LR = 3, 8, 1e-3


def load_zero3():
    spec = importlib.util.spec_from_file_location("zero3", ROOT / "scripts" / "by_hand" / "zero3.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fresh(kind):
    return models.without_dropout(models.build_model(kind, seed=0))  # the same start everywhere: no broadcast needed


def diff(a, b) -> float:
    return max(float((x.double() - y.double()).abs().max()) for x, y in zip(a, b))


def against_one_process(zero3, kind, dtype, rank, world):
    """The rung and a peer's plain SGD over dp.parameters(), STEPS steps; and one process that does the same
    arithmetic with every rank's batch: fp32 masters, each rank's forward and backward on the master cast to `dtype`,
    the gradients cast to fp32, divided by the world size and summed, one SGD step on the masters."""
    data = [models.batches(kind, r, world, STEPS, BATCH) for r in range(world)]
    model = fresh(kind)
    dp = zero3.Zero3DP(model, param_dtype=dtype)
    opt = torch.optim.SGD(dp.parameters(), lr=LR)
    for step in range(STEPS):
        model(**data[rank][step]).loss.backward()
        dp.sync_gradients()
        opt.step()
        opt.zero_grad(set_to_none=True)
    got = dp.full_weights()

    master = [p.detach().clone() for p in fresh(kind).parameters()]
    compute = fresh(kind).to(dtype)
    for step in range(STEPS):
        total = [torch.zeros_like(m) for m in master]
        for r in range(world):
            for p, m in zip(compute.parameters(), master):
                p.data.copy_(m)  # the cast the gather makes
                p.grad = None
            compute(**data[r][step]).loss.backward()
            for t, p in zip(total, compute.parameters()):
                t.add_(p.grad.float().div_(world))
        for m, g in zip(master, total):
            m.add_(g, alpha=-LR)  # plain SGD's update
    return {"max_diff": diff(got, master), "dtypes": sorted({str(t.dtype) for t in dp.parameters()})}


def against_fsdp2(zero3, kind, dtype, rank, world):
    """The rung and torch's FSDP2 (each layer a unit, the root the rest, resharded after forward) with
    MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=float32), both stepping AdamW STEPS steps."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    data = models.batches(kind, rank, world, STEPS, BATCH)
    ours = fresh(kind)
    dp = zero3.Zero3DP(ours, param_dtype=dtype)
    opt = torch.optim.AdamW(dp.parameters(), lr=LR, weight_decay=0.01)
    theirs = fresh(kind)
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    for layer in models.layers(theirs):
        fully_shard(layer, reshard_after_forward=True, mp_policy=policy)
    fully_shard(theirs, reshard_after_forward=True, mp_policy=policy)
    opt2 = torch.optim.AdamW(theirs.parameters(), lr=LR, weight_decay=0.01)
    for batch in data:
        ours(**batch).loss.backward()
        dp.sync_gradients()
        opt.step()
        opt.zero_grad(set_to_none=True)
        theirs(**batch).loss.backward()
        opt2.step()
        opt2.zero_grad(set_to_none=True)
    got, want = dp.full_weights(), [p.full_tensor().detach() for p in theirs.parameters()]
    return {"max_diff": diff(got, want)}


def gathered_bytes(zero3, kind, dtype):
    """Bytes of every gather in one step, from the rung's timeline."""
    from distrinews_course.by_hand.timeline import Timeline

    model = fresh(kind)
    timeline = Timeline()
    dp = zero3.Zero3DP(model, timeline=timeline, param_dtype=dtype)
    timeline.start()
    model(**models.batches(kind, dist.get_rank(), dist.get_world_size(), 1, BATCH)[0]).loss.backward()
    dp.sync_gradients()
    return [e["bytes"] for e in timeline.events if e["kind"] == "comm" and e["name"].startswith("gather")]


def grad_scaler(zero3, kind, rank, world):
    """float16 with torch.amp.GradScaler, as a peer would: the scaled loss backward, the gradients summed onto the fp32
    shards, the scaler's step (it unscales them, and skips the step if any is not finite) and update. From its default
    first scale (2^16, which overflows the tiny model's gradients), steps until one is taken."""
    data = models.batches(kind, rank, world, 8, BATCH)
    model = fresh(kind)
    dp = zero3.Zero3DP(model, param_dtype=torch.float16)
    opt = torch.optim.SGD(dp.parameters(), lr=LR)
    scaler = torch.amp.GradScaler("cpu")
    before = [w.clone() for w in dp.full_weights()]
    scales = []
    for batch in data:
        scales.append(scaler.get_scale())
        scaler.scale(model(**batch).loss).backward()
        dp.sync_gradients()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
    after = dp.full_weights()
    return {
        "scales": scales,
        "finite": all(bool(torch.isfinite(w).all()) for w in after),
        "moved": diff(after, before),
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--models", default="tiny,tied")
    p.add_argument("--dtypes", default="float32,float16,bfloat16")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # all the rung needs: no course set-up
    rank, world = dist.get_rank(), dist.get_world_size()
    zero3 = load_zero3()
    out = {"one_process": {}, "fsdp2": {}, "gather_bytes": {}}
    for kind in args.models.split(","):
        for name in args.dtypes.split(","):
            dtype = DTYPES[name]
            out["one_process"][f"{kind} {name}"] = against_one_process(zero3, kind, dtype, rank, world)
            out["fsdp2"][f"{kind} {name}"] = against_fsdp2(zero3, kind, dtype, rank, world)
            out["gather_bytes"][f"{kind} {name}"] = gathered_bytes(zero3, kind, dtype)
    out["grad_scaler"] = grad_scaler(zero3, "tiny", rank, world)
    worst = [None] * world
    dist.all_gather_object(worst, out)
    if rank == 0:
        Path(args.out).write_text(json.dumps({"ranks": worst}, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
