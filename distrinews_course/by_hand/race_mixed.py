"""Chapter 03's race, its mixed-precision section: ZeRO-3 by hand with param_dtype float16 and bfloat16 against torch's
FSDP2 with the same MixedPrecisionPolicy; the bytes each collective of a step moves; what float16 loses without loss
scaling; and the peak memory per rank during a block's compute (forward and backward), measured in fresh processes
beside chapter 06's calculator."""

from __future__ import annotations

import gc

import torch
import torch.distributed as dist

from .. import memory as calculator
from ..fresh import in_child
from ..proc_self import reset_peak, status_mb
from . import check, harness, measure, models
from .race import Runner
from .rung import agreement_group

LOW = {"float16": torch.float16, "bfloat16": torch.bfloat16}
# Loss scales of the underflow case: none, a scale that lifts float16's small gradients above its smallest normal
# number (6.1e-5), and torch.amp.GradScaler's first scale (2^16), which makes the tiny model's largest gradient overflow
SCALES = (1, 1024, 65536)


def memory_runs(mods, args, rank, world) -> dict:
    """Before this process joins a group: the peak resident memory per rank of a step of ZeRO-3 by hand (fp32, and
    param_dtype float16) and of FSDP2 (param_dtype float16), the tiny model at args.mixed_batch texts without dropout,
    each in a fresh process per rank as chapter 06 measures (race_memory.py's way); and the runtime the calculator
    adds, from torch's DDP on one example of 8 tokens."""
    scratch = measure.meeting_folder("by_hand_mixed")
    torch.set_num_threads(1)
    batches = models.batches("tiny", rank, world, args.memory_steps, args.mixed_batch)
    one = {k: v[:1, :8] if v.dim() == 2 else v[:1] for k, v in batches[0].items()}
    # Code pages and one-time set-ups are touched here, not in a child's peak: oneDNN's kernels keep state for each
    # shape they first meet, float16's several MiB more than float32's (in a fresh process the tiny model's first
    # float16 step at 8 x 64 peaks about 10 MiB above the next ones, float32's about 2 MiB), so each dtype is warmed
    # at the runs' own shapes, the calibration's and the measured batch's. What the warm-up freed goes back to Linux
    # (malloc_trim), so that a child's allocations are not served from pages it already had.
    measure.settle_allocator()
    for dtype in (torch.float32, torch.float16):
        warm = models.without_dropout(models.build_model("tiny", 0)).to(dtype)
        for b in (one, batches[0]):
            warm(**b).loss.backward()
        torch.optim.AdamW(warm.parameters()).step()
    del warm, b
    gc.collect()
    trim_heap()

    def peak(index, name, steps, param_dtype):
        store = dist.FileStore(str(scratch / f"store_{index}"), world)
        harness.init(args.timeout_s, store=store)
        try:
            compute = {}
            with measure.PeakMemory() as m:
                r = Runner(name, "tiny", args, mods, rank, dropout=False, param_dtype=param_dtype)
                for b in steps[:-1]:
                    r.step(b)
                # the last step's forward and backward, every moment of them some block's compute: their peak, read
                # just before the optimizer steps (the peak restarts from here: the step before it allocated as much)
                r.opt.register_step_pre_hook(lambda *_: compute.update(mb=status_mb("VmHWM") - m.before))
                reset_peak()
                r.step(steps[-1])
            return {"step_mb": m.peak_mb, "compute_mb": compute["mb"]}
        finally:
            dist.destroy_process_group()

    runs = [("ddp@1x8", "ddp", [one] * args.memory_steps, None), ("zero3 float32", "zero3", batches, None)]
    runs += [("zero3 float16", "zero3", batches, torch.float16), ("fsdp2 float16", "fsdp2", batches, torch.float16)]
    out = {}
    for index, (label, name, steps, dtype) in enumerate(runs):
        out[label] = in_child(lambda i=index, n=name, s=steps, d=dtype: peak(i, n, s, d), "race.py: a memory run")
    if rank == 0:
        measure.remove_meeting_folder(scratch)
    runtime = out.pop("ddp@1x8")["step_mb"] - calculator.estimate("tiny", 1, 8, world=world).peak_mb
    return {"peaks": out, "runtime_mb": runtime}


def trim_heap() -> None:
    """glibc: give every free page of the heap back to Linux (malloc_trim(0)); nothing elsewhere."""
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def memory(runs: dict, args, world) -> dict:
    """Each run's peak per rank (every rank's, from memory_runs) beside chapter 06's calculator: ZeRO-3 by hand is its
    stage 3 with an even split ("even"), FSDP2 its "torch" implementation; float32 in its fp32 mode, param_dtype
    float16 in its MIXED_FSDP mode."""
    ranks = check.everyone(runs["peaks"], agreement_group())
    out = {}
    for label in runs["peaks"]:
        name, dtype = label.split()
        est = calculator.estimate(
            "tiny",
            args.mixed_batch,
            models.SEQ_LEN,
            "fp32" if dtype == "float32" else calculator.MIXED_FSDP,
            3,
            world,
            impl="even" if name == "zero3" else "torch",
            overhead_mb=runs["runtime_mb"],
        )
        out[label] = {
            "step_mb_per_rank": [r[label]["step_mb"] for r in ranks],
            "compute_mb_per_rank": [r[label]["compute_mb"] for r in ranks],
            "calculator_mb": est.peak_mb,
            "parts_mb": est.parts_mb,
        }
    return out


def against_fsdp2(mods, args, rank, world) -> dict:
    """ZeRO-3 by hand and FSDP2, both with param_dtype float16, then bfloat16 (reduce_dtype float32), trained
    args.mixed_steps steps of AdamW on the tiny model: the largest difference of their final fp32 weights."""
    batches = models.batches("tiny", rank, world, args.mixed_steps, args.zero_batch)
    names = [n for n, _ in models.build_model("tiny", 0).named_parameters()]
    out = {}
    for label, dtype in LOW.items():
        final = {}
        for name in ("zero3", "fsdp2"):
            torch.manual_seed(args.seed + 3000 + rank)
            r = Runner(name, "tiny", args, mods, rank, dropout=False, param_dtype=dtype)
            for b in batches:
                r.step(b)
            final[name] = r.weights()
        out[label] = check.compare([final["zero3"]], [final["fsdp2"]], names)[1]
    return out


def collectives(mods, args, rank) -> dict:
    """One step of ZeRO-3 by hand in float32 and with param_dtype float16, from its timeline: each collective's name
    and the bytes of its whole buffer (a gather's output, a reduce-scatter's input)."""
    batch = models.batches("tiny", rank, dist.get_world_size(), 1, args.zero_batch)[0]
    out = {}
    for label, dtype in (("float32", None), ("float16", torch.float16)):
        r = Runner("zero3", "tiny", args, mods, rank, dropout=False, param_dtype=dtype)
        r.timeline.start()
        r.step(batch)
        out[label] = [{"name": e["name"], "bytes": e["bytes"]} for e in r.timeline.events if e["kind"] == "comm"]
    return out


def underflow(mods, args, rank, world) -> dict:
    """One backward of the tiny model from the same weights in float32, with param_dtype float16 at each loss scale of
    SCALES, and bfloat16: the fp32 gradient on the shards (divided by the scale again) against float32's. Per case:
    the share of the gradient's entries float32 has nonzero that came out zero (underflow), the entries that are not
    finite (overflow), and the relative error of the whole gradient; summed over the ranks."""
    batch = models.batches("tiny", rank, world, 1, args.zero_batch)[0]
    cases = [
        ("float32", None, 1),
        *[(f"float16 x{s}", torch.float16, s) for s in SCALES],
        ("bfloat16", torch.bfloat16, 1),
    ]
    grads = {}
    for label, dtype, scale in cases:
        r = Runner("zero3", "tiny", args, mods, rank, dropout=False, param_dtype=dtype)
        (r.model(**batch).loss * scale).backward()
        r.dp.sync_gradients()  # a peer's call: the summed gradients land on the fp32 shards
        grads[label] = torch.cat([p.grad.reshape(-1) / scale for p in r.dp.parameters()])
    ref = grads["float32"]
    out = {}
    for label, g in grads.items():
        counts = torch.tensor(
            [
                float(((g == 0) & (ref != 0)).sum()),
                float((ref != 0).sum()),
                float((~torch.isfinite(g)).sum()),
                float(torch.nan_to_num(g - ref, nan=0.0, posinf=0.0, neginf=0.0).pow(2).sum()),
                float(ref.pow(2).sum()),
            ],
            dtype=torch.float64,
        )
        dist.all_reduce(counts, group=agreement_group())
        lost, nonzero, bad, err, norm = counts.tolist()
        out[label] = {
            "lost_share": lost / nonzero,
            "nonfinite": int(bad),
            "rel_error": None if bad else (err / norm) ** 0.5,
        }
    return out


def mixed(mods, args, rank, world, runs) -> dict:
    """The section: against FSDP2, the collectives' bytes, the underflow case, and (runs: memory_runs') the peaks."""
    return {
        "steps": args.mixed_steps,
        "batch": args.zero_batch,
        "memory_batch": args.mixed_batch,
        "vs_fsdp2": against_fsdp2(mods, args, rank, world),
        "collectives": collectives(mods, args, rank),
        "underflow": underflow(mods, args, rank, world),
        "memory": memory(runs, args, world) if runs else None,
    }
