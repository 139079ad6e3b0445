"""The host's side of a training step: the CPU time it takes to ISSUE one step (the CPU launch floor), measured with
the process pinned to the 2 cores a Kaggle rank gets, and the Kaggle T4 forecast that counts it.

A GPU step cannot take less time than the CPU needs to launch its kernels: at DistilBERT-base's batch of 32 an H200
ran our loop at 2.1% MFU (issue 41), bound by launching, not computing. A T4 is ~15x slower than an H200 at bf16
matrix work, so its step may be GPU-bound, or still host-bound on Kaggle's slower vCPUs (2 ranks share 4). The
forecast takes each T4 step as max(the GPU's time at the T4's rate, the CPU floor).

    python -m distrinews_course.bench.launch_floor --out floor.json      # pins itself to 2 cores

On CUDA it MEASURES the floor: the course's train_single.py, unchanged, with --amp fp16 (what a T4 runs) at batch
32, eager and with CUDA graphs (--compile_mode reduce-overhead); on an H100 the GPU finishes each step's kernels
long before the CPU has issued the next, so the wall time per step is the host's time to issue it.
On a CPU there is no launch to time, and it gives a PROXY, labelled so (PROXY below says exactly what): the same
script with DistilBERT-base's structure at a width where the CPU's arithmetic vanishes, so that a step takes what
issuing it takes, plus an assumed cost per CUDA launch call, which a CPU does not make.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from distrinews_lib.data import sources

from . import provenance, step_ops
from .train_setup import offline_source

KAGGLE_CORES = 2  # a Kaggle rank's share of the machine: 4 vCPUs for 2 ranks on "GPU T4 x2"
LAUNCH_API_S = 4e-6  # ASSUMED host cost of one CUDA kernel launch call (cudaLaunchKernel: a few microseconds)
GRAPH_REPLAY_S = 20e-6  # ASSUMED host cost of replaying one CUDA graph (cudaGraphLaunch)
PROXY_BATCH = 2  # the proxy's batch: the operations of batch 32, with arithmetic the CPU finishes at once
T4_FP16_PEAK_TFLOPS = 65.0  # NVIDIA's datasheet, dense (flops.PEAK_TFLOPS["T4"])


MEASURED = (
    "wall seconds per step of train_single.py --amp fp16, DistilBERT-base, batch 32, on a GPU fast enough that the "
    "host's issuing of the step is what the step takes"
)
PROXY = (
    "NOT a measurement of a GPU: train_single.py, unchanged, --amp bf16 on real AG News lengths, with "
    "DistilBERT-base's structure (6 layers, 12 heads) at width 12 and batch 2 (the operations of batch 32; the "
    "loader's extra time at 32 added), so that the CPU's arithmetic is negligible and a step's time is the host's "
    f"work of issuing it; plus {LAUNCH_API_S * 1e6:.0f} us per kernel launch (assumed: "
    "a CPU makes no CUDA calls; the launches counted by step_ops' proxy). CUDA graphs: the run compiled "
    f"(reduce-overhead, which on a CPU only compiles), plus the launches outside the model and one replay "
    f"({GRAPH_REPLAY_S * 1e6:.0f} us, assumed). On this machine's cores, which are not Kaggle's."
)


def pin(cores: int = KAGGLE_CORES) -> list:
    """Pin this process (as `taskset` would) to the first `cores` cores it may use; returns them."""
    allowed = sorted(os.sched_getaffinity(0))
    chosen = allowed[:cores]
    os.sched_setaffinity(0, chosen)
    torch.set_num_threads(len(chosen))
    return chosen


# --------------------------------------------------------------------------- the runs


def narrow_distilbert(folder: Path) -> str:
    """DistilBERT-base's structure (6 layers, 12 heads, the same modules and operations in the same order) at width
    12: on a CPU its arithmetic is negligible, so a step's time is the host's work of issuing it."""
    from transformers import AutoModelForSequenceClassification, DistilBertConfig

    from distrinews_lib.data.tokenization import tiny_tokenizer

    torch.manual_seed(1)
    # n_layers 6 and n_heads 12 (1 wide) as the base. No attention dropout: a GPU fuses it into its attention kernel,
    # and without it the CPU runs its fused attention kernel too (with it, 12 separate operations per layer).
    cfg = DistilBertConfig(num_labels=4, dim=12, hidden_dim=48, attention_dropout=0.0)
    AutoModelForSequenceClassification.from_config(cfg).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return str(folder)


VARIANTS = {"eager": [], "cuda_graphs": ["--compile_mode", "reduce-overhead"]}


def script_floor(
    data_arg: str,
    *,
    cuda: bool,
    warmup: int,
    steps: int,
    batch_size: int = 32,
    max_length: int = 128,
    variants=VARIANTS,
):
    """Seconds per step of train_single.py, unchanged, at batch 32, eager and with --compile_mode reduce-overhead.
    On CUDA: DistilBERT-base, --amp fp16 (a T4's precision). On a CPU: narrow_distilbert, --amp bf16 (the casts a
    GPU run makes), at batch PROXY_BATCH, which issues the same operations as batch 32 with even less arithmetic
    (the loader's extra work at 32 is measured apart and added), plus the launch calls the CPU does not make
    (LAUNCH_API_S per kernel, counted by step_ops' proxy; with CUDA graphs those outside the model, plus one
    replay)."""
    from . import harness
    from .train_setup import materialise_model, script_argv

    out = {}
    script = Path(__file__).resolve().parents[2] / "scripts" / "train_single.py"
    device = torch.device("cuda" if cuda else "cpu")
    with tempfile.TemporaryDirectory(prefix="floor_") as tmp:
        folder = Path(tmp) / "model"
        model = materialise_model("distilbert-base", folder, seed=1) if cuda else narrow_distilbert(folder)
        batch = batch_size if cuda else PROXY_BATCH
        extra_collate = 0.0 if cuda else collate_seconds(data_arg, batch_size) - collate_seconds(data_arg, batch)
        for name in variants:
            flags = VARIANTS[name]
            argv = script_argv(
                model=model, data_arg=data_arg, batch_size=batch, steps=warmup + steps,
                num_samples=(warmup + steps) * batch, max_length=max_length, seed=1, threads=None if cuda else 1,
                out=Path(tmp) / name, device_type=device.type, flags=["--amp", "fp16" if cuda else "bf16", *flags],
            )  # fmt: skip
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                res = harness.run(script, argv, warmup=warmup, steps=steps, device=device).result()
            row = {
                "seconds_per_step": res["seconds"] / steps,
                "cpu_seconds_per_step": res["cpu_s"] / steps,
                "command": "python scripts/train_single.py " + " ".join(argv),
            }
            if not cuda:
                row["host_seconds_per_step"] = row["seconds_per_step"]
                row["launches_per_step"] = _launches(script, argv, name, device)
                row["loader_extra_seconds_at_batch_32"] = extra_collate
                row["seconds_per_step"] += (
                    extra_collate
                    + row["launches_per_step"] * LAUNCH_API_S
                    + (GRAPH_REPLAY_S if name == "cuda_graphs" else 0.0)
                )
            out[name] = row
    return out


def collate_seconds(data_arg: str, batch_size: int, batches: int = 40) -> float:
    """Host seconds our loader takes per batch (length-grouped, padded to multiples of 8) on real AG News texts."""
    from distrinews_lib.data import batching, tokenization

    splits = sources.load_agnews(data_arg, num_samples=max(batch_size * batches, 64))
    ids = tokenization.tokenize_texts(splits.train_texts, tokenization.tiny_tokenizer(), 128)
    ds = tokenization.TokenizedDataset(ids, splits.train_labels)
    loader = batching.make_loader(ds, batch_size, group_by_length=True, pad_to_multiple_of=8)
    next(iter(loader))
    t = time.perf_counter()
    n = sum(1 for _ in loader)
    return (time.perf_counter() - t) / n


def _launches(script, argv, name, device) -> float:
    """Kernel launches per step by step_ops' CPU proxy; with CUDA graphs only those outside the model's forward and
    backward (the graph replays those)."""
    from . import harness

    window = step_ops.StepWindow(3, 3, proxy=True)
    eager_argv = [a for a in argv if a not in ("--compile_mode", "reduce-overhead")]
    with window, contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        harness.run(script, eager_argv, warmup=1, steps=6, device=device)
    sites = window.summary()["launch_sites_per_step"]
    if name == "eager":
        return sum(sites.values())
    lines = Path(script).read_text().splitlines()
    model_lines = [i + 1 for i, text in enumerate(lines) if ".backward()" in text]

    def in_graph(site):
        line = int(site.split(" ")[0].rsplit(":", 1)[1]) if ":" in site else -1
        return "(in the model)" in site or line in model_lines

    return sum(n for site, n in sites.items() if not in_graph(site))


# --------------------------------------------------------------------------- the forecast


def t4_gpu_seconds(flops_per_step: float, mfu: float = 0.25) -> float:
    """A T4's time for a step's FLOPs at `mfu` of its dense fp16 peak."""
    return flops_per_step / (T4_FP16_PEAK_TFLOPS * 1e12 * mfu)


def t4_step_forecast(gpu_s: float, floor_s: float, *, ddp_efficiency: float = 0.9) -> dict:
    """A FORECAST of one T4 step: max(the GPU's time, the CPU floor); on 2x T4 each rank's GPU time grows by DDP's
    communication (1 / ddp_efficiency) and its floor stays (each rank has its own 2 vCPUs)."""
    one, two = max(gpu_s, floor_s), max(gpu_s / ddp_efficiency, floor_s)
    return {
        "gpu_seconds": gpu_s,
        "floor_seconds": floor_s,
        "bound": "CPU launch floor" if floor_s > gpu_s else "GPU",
        "1x_step_seconds": one,
        "2x_step_seconds": two,
        "2x_speedup": 2 * one / two,  # twice the texts per step, each step as long as `two`
    }


def known_floor(benchmarks: Path) -> dict | None:
    """The floor to forecast with: the newest MEASURED one (a GPU run of bench_train, benchmarks/train_*.json), else
    the newest PROXY (benchmarks/launch_floor_*.json, this module's CLI on a CPU); None if neither exists."""
    found = {"MEASURED": [], "PROXY": []}
    for path in sorted(Path(benchmarks).glob("train_*.json")) + sorted(Path(benchmarks).glob("launch_floor_*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        floor = data.get("launch_floor", data if "kind" in data else None)
        if floor and floor.get("kind") in found and "eager" in floor:
            found[floor["kind"]].append({**floor, "file": path.name})
    for kind in ("MEASURED", "PROXY"):
        if found[kind]:
            return max(found[kind], key=lambda f: f.get("started", ""))
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--data", default="auto", help="auto ($DISTRINEWS_DATA_DIR, else the embedded sample), or a folder")
    p.add_argument("--cores", type=int, default=KAGGLE_CORES)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--steps", type=int, default=None, help="timed steps (default: 50 on CUDA, 10 for the proxy)")
    p.add_argument("--warmup", type=int, default=30, help="steps before the clock (CUDA graphs are recorded in them)")
    args = p.parse_args(argv)
    data_arg = offline_source(args.data, ("embedded",))
    cores = pin(args.cores)
    started = time.time()
    cuda = torch.cuda.is_available()
    res = {"kind": "MEASURED" if cuda else "PROXY", "what": MEASURED if cuda else PROXY}
    res["device"] = torch.cuda.get_device_name(0) if cuda else "cpu"
    res.update(
        script_floor(
            data_arg, cuda=cuda, warmup=args.warmup, steps=args.steps or (50 if cuda else 10), variants=args.variants
        )
    )
    res.update(cores=cores, seconds_total=round(time.time() - started, 1), **provenance.provenance())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(provenance.as_jsonable(res), indent=1))
    for name in args.variants:
        print(f"{res['kind']} launch floor, {name}: {1000 * res[name]['seconds_per_step']:.2f} ms per step")
    return 0


def t4_forecast_line(benchmarks, tensors, efficiency: float) -> str:
    """The 2x T4 row again, as a FORECAST that counts the host: a step takes at least the CPU time that issues its
    kernels (this module), measured on a GPU where a run left one in benchmarks/, else a CPU PROXY."""
    from ..cluster_model import gpu_step_s

    floor = known_floor(benchmarks)
    if floor is None:
        return "no launch floor in benchmarks/: python -m distrinews_course.bench.launch_floor measures one"
    gpu_s = gpu_step_s(sum(b for b, _ in tensors) / 4, "T4")
    parts = []
    for name in ("eager", "cuda_graphs"):
        if name in floor:
            f = t4_step_forecast(gpu_s, floor[name]["seconds_per_step"], ddp_efficiency=efficiency)
            parts.append(
                f"{name} {1000 * f['floor_seconds']:.1f} ms ({f['bound']}-bound, 2x T4 {f['2x_speedup']:.2f}x)"
            )
    how = (
        "measured on a GPU"
        if floor["kind"] == "MEASURED"
        else "a PROXY: no GPU run left one, so it was timed on a CPU, the model's structure at a width where its "
        "arithmetic vanishes"
    )
    return (
        f"FORECAST that counts the host. The launch floor is the CPU time a step takes just to issue its GPU kernels, "
        f"here {how} ({floor['file']}). Each 2x T4 step is max(the GPU's {1000 * gpu_s:.1f} ms, the floor): "
        + "; ".join(parts)
    )


if __name__ == "__main__":
    sys.exit(main())
