"""bench_train's sections for issue 41 beyond the race: the large-GPU preset's MFU (`preset`), and the CPU launch
floor with the Kaggle T4 forecast it implies (`floor`)."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import torch

from distrinews_lib import plan as run_plan
from distrinews_lib.training import config, flops, precision

from . import global_state
from .train_measure import run_ours
from .train_setup import materialise_model, parse_argv, script_argv


def preset_plan(quick: bool, cuda: bool) -> dict | None:
    """The large_gpu preset's batch, as the preset sets it (compiled) and eager; tiny sizes for --quick."""
    preset = config.read_preset("large_gpu")[1]
    if quick:
        return dict(model="tiny", batch_size=16, warmup=1, steps=2, rounds=1, compile=cuda)
    if not cuda:
        return None
    return dict(model="distilbert-base", batch_size=preset["batch_size"], warmup=10, steps=20, rounds=1, compile=True)


def preset_section(plan: dict, data_arg: str, device, args, log, workdir: Path) -> dict:
    """Our script at the large_gpu preset's batch and learning rate on DistilBERT-base, max_length 128: MFU, the
    precision that ran, and (on a GPU) the target of issue 41 (MFU >= 30%)."""
    preset = config.read_preset("large_gpu")[1]
    model = materialise_model(plan["model"], workdir / "preset_model", args.seed)
    B, W, K = plan["batch_size"], plan["warmup"], plan["steps"]
    variants = {"compiled": ["--compile"], "eager": ["--no-compile"]}
    if not plan["compile"]:
        variants = {"eager": ["--no-compile"]}
    argv_of = {
        name: script_argv(
            model=model,
            data_arg=data_arg,
            batch_size=B,
            steps=W + K,
            num_samples=(W + K) * B,
            max_length=args.max_length,
            seed=args.seed,
            threads=args.threads,
            out=workdir / "preset_runs",
            device_type=device.type,
            flags=["--lr", str(preset["lr"]), *flags],
        )  # fmt: skip
        for name, flags in variants.items()
    }
    cfg = parse_argv(argv_of[next(iter(argv_of))])
    with contextlib.redirect_stdout(io.StringIO()):
        prepared = run_plan.prepare(run_plan.decide(cfg, log=lambda *a: None), log=lambda *a: None)
    shape = flops.model_shape(prepared.model)
    del prepared
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    dtype = flops.matmul_dtype(precision.resolve_amp(cfg.amp, device).mode, device.type)
    peak = args.peak_tflops or (flops.peak_tflops(gpu, dtype) if gpu else None)
    log(f"\n== preset: large_gpu's batch {B} at lr {preset['lr']:g} | {plan['model']} | {W} + {K} steps | {device}")
    baseline = global_state.GlobalState.capture()
    rows = {name: [] for name in argv_of}
    for _ in range(plan["rounds"]):
        for name, argv in argv_of.items():
            global_state.start_window(baseline, name)
            res = run_ours(argv, warmup=W, steps=K, device=device, shape=shape, peak=peak, gate=_NoGate())
            rows[name].append(res)
            mfu = res.get("mfu")
            log(f"   {name:22s} {res['samples_per_s']:9.0f} samples/s" + (f" | MFU {100 * mfu:.1f}%" if mfu else ""))
    out = {"plan": plan, "lr": preset["lr"], "matmul_dtype": dtype, "peak_tflops": peak, "variants": {}}
    for name, rs in rows.items():
        mfus = sorted(r["mfu"] for r in rs if r.get("mfu"))
        out["variants"][name] = {
            "samples_per_s": sorted(r["samples_per_s"] for r in rs)[len(rs) // 2],
            "mfu": mfus[len(mfus) // 2] if mfus else None,
            "command": "python scripts/train_single.py " + " ".join(argv_of[name]),
            "rounds": rs,
        }
    best = max((v["mfu"] or 0 for v in out["variants"].values()), default=0)
    out["best_mfu"] = best or None
    return out


class _NoGate:
    def wait(self):
        return None


def floor_section(data_arg: str, args, log, workdir: Path, quick: bool) -> dict:
    """The launch floor, measured (CUDA) or its proxy (a CPU), in a child process pinned to a Kaggle rank's 2 cores;
    and the T4 forecast from it (gpu_estimate.t4_epoch_estimate)."""
    from .gpu_estimate import flops_per_text, t4_epoch_estimate

    out_json = workdir / "launch_floor.json"
    cmd = [sys.executable, "-m", "distrinews_course.bench.launch_floor", "--out", str(out_json), "--data", data_arg]
    if quick:
        cmd += ["--warmup", "3", "--steps", "3", "--variants", "eager"]
    log(f"\n== floor: {' '.join(cmd[1:])}")
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    if res.returncode != 0:
        return {"error": f"launch_floor exited {res.returncode}", "tail": res.stderr.splitlines()[-15:]}
    floor = json.loads(out_json.read_text())
    for name in ("eager", "cuda_graphs"):
        if name in floor:
            log(f"   {floor['kind']} floor, {name}: {1000 * floor[name]['seconds_per_step']:.2f} ms per step")
    fpt = flops_per_text(data_arg)
    floors = {name: floor[name]["seconds_per_step"] for name in ("eager", "cuda_graphs") if name in floor}
    forecast = t4_epoch_estimate(fpt["flops_per_text"], {"MFU 25% (a conservative guess for a T4)": 0.25}, floors)
    for name, f in forecast.get("floors", {}).items():
        log(
            f"   FORECAST 1x T4 {name}: {f['1x T4 minutes']} min an epoch ({f['bound']}-bound); 2x T4 "
            f"{f['2x T4 minutes']} min, {f['2x speedup']:.2f}x"
        )
    return {"launch_floor": floor, "t4_forecast": forecast, "flops_per_text": fpt}
