"""Training throughput of the course's own scripts: against Hugging Face Trainer, what each fast-path option
buys, and DDP scaling.

    python scripts/bench_train.py             # full run (about 10 min on a 2-core CPU):
                                              # benchmarks/train_<machine>.json + plots
    python scripts/bench_train.py --quick     # a few tiny steps of everything (CI keeps the script working with it)

"Our loop" is scripts/train_single.py and scripts/train_ddp.py themselves, unchanged, run in-process by
distrinews_course.bench.harness: a global optimizer-step hook marks the clock after warm-up step W and after step
W + K, and the batches the scripts' EpochMeter sees in between give the samples, tokens and model FLOPs.

Every figure is measured side by side in ONE run on ONE machine: the contenders alternate round after
round (the order rotates), each is timed over K optimizer steps after W warm-up steps, and the JSON
quotes the median over rounds and the ratios (median of the per-round ratios). On a shared CPU the
absolute numbers move with the neighbours' load; ratios of contenders measured seconds apart move much
less. Before each timed window the run waits (bounded) for the other processes to leave the CPU, and it
records how many cores they used during every window ("clean" rounds: at most 0.25 cores).

Sections
  compare  train_single.py (the CLI's default fast path) vs transformers.Trainer twice:
             hf_trainer              Trainer's defaults (random batches, DataCollatorWithPadding, its optimizer), with
                                     the same mixed precision switched on as ours (bf16=/fp16=; off on a CPU)
             hf_trainer_same_options Trainer given the options our loop uses: length-grouped batches
                                     (train_sampling_strategy="group_by_length"; group_by_length=True before
                                     transformers 5), optim="adamw_torch_fused", the same precision, padding
                                     multiple, pinned memory, weight decay, warm-up and clipping
           plus train_single.py with one fast-path option switched off (the flag that does it is the name),
           and on a GPU torch.compile for both (`--compile`, Trainer's torch_compile=True). Both run the
           same model object (SDPA attention, transformers' default, recorded) on the same texts.
           bare: the bare loop (bench/train_bare.py: the same model and batches, moved to the device first;
           forward, backward, fused AdamW and nothing else), eager and compiled; and our CUDA-graphs path
           (--compile_mode reduce-overhead). Every window starts from the same global state (TF32, cuDNN,
           compile caches: bench/global_state.py, restored and asserted). Then, untimed, each step's kernel
           launches and host syncs, ours against bare (bench/step_ops.py; on a CPU its proxy of a GPU).
  preset   our script at the large_gpu preset's batch (256) and learning rate, compiled and eager: MFU (GPU)
  floor    the CPU launch floor, pinned to a Kaggle rank's 2 cores (bench/launch_floor.py: measured on CUDA, a
           labelled PROXY on a CPU), and the Kaggle T4 FORECAST it implies (each step: max(GPU, floor))
  ddp      1 vs N processes on the same global batch and steps, in ONE torchrun launch: world-1 contenders run
           train_single.py on rank 0 (harness.alone()) while the other ranks wait; world-N contenders run
           train_ddp.py on every rank, with a DDP communication hook that times each bucket's all-reduce.
           Speedup = N-process samples/s / 1-process samples/s; efficiency = speedup / N; plus DDP knobs.

Length grouping and short windows: Trainer's LengthGroupedSampler orders each "megabatch" of 50 batches
longest first, so a window that covers part of one sees a biased slice of lengths. The compare section
therefore times whole megabatches (W and K multiples of 50 over >= 200 batches of texts) where that is
affordable; where it is not (DistilBERT-base on a CPU), the ratios are quoted on model FLOP/s, which
counts each text's real length, and the section says so (`headline_metric`).

On CUDA each line also shows model FLOPs utilisation (MFU; distrinews_lib.training.flops has the formula).

The parts live in distrinews_course/bench/: train_setup (plans, contenders' command lines), train_measure (timing a
script or Trainer), train_bare (the bare loop), train_stats (ratios over rounds), train_compare and train_scaling
(the two first sections; the latter also runs each rank of the --ddp-worker launch), train_preset (preset, floor)
and train_report (plots, targets, headline, --refresh).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run from a checkout without installing

import torch  # noqa: E402

from distrinews_course import launch  # noqa: E402
from distrinews_course.bench import provenance  # noqa: E402
from distrinews_course.bench.train_compare import compare_section  # noqa: E402
from distrinews_course.bench.train_preset import floor_section, preset_plan, preset_section  # noqa: E402
from distrinews_course.bench.train_report import headline, ordered, plot, refresh, targets  # noqa: E402
from distrinews_course.bench.train_scaling import ddp_section, ddp_worker, one_gpu_for_this_process  # noqa: E402
from distrinews_course.bench.train_setup import MODELS, data_note, full_plan, resolve_data  # noqa: E402
from distrinews_lib.data import sources  # noqa: E402
from distrinews_lib.distributed import run_and_end  # noqa: E402
from distrinews_lib.errors import UserError, main_guard  # noqa: E402
from distrinews_lib.training import precision  # noqa: E402

# --------------------------------------------------------------------------- main

SECTIONS = ("compare", "ddp", "preset", "floor")


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="a few tiny steps of every section (CI)")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated: tiny, distilbert-base")
    p.add_argument("--sections", default="compare,ddp", help=f"comma-separated: {', '.join(SECTIONS)}")
    p.add_argument(
        "--data",
        default="auto",
        help="auto ($DISTRINEWS_DATA_DIR, else the AG News sample embedded in "
        "distrinews_lib), embedded, synthetic, hub, or a folder",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads for the in-process contenders (default: 1 on a CPU, robust when it is shared; "
        "torch's choice on a GPU)",
    )
    p.add_argument("--max_length", type=int, default=128)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--rounds", type=int, default=None, help="rounds of every section (default: the plan's, 3-5)")
    p.add_argument(
        "--compile", action="store_true", help="include the torch.compile contenders on a CPU (always on a GPU)"
    )
    p.add_argument("--ddp_nproc", type=int, default=None, help="processes for the scaling run (default: GPUs, or 2)")
    p.add_argument("--ddp_timeout", type=float, default=1200)
    p.add_argument(
        "--quiet_timeout",
        type=float,
        default=None,
        help="before each timed window wait up to this many seconds for other processes to leave the CPU "
        "(default: 4 on a CPU, 0 on a GPU or with --quick)",
    )
    p.add_argument("--quiet_budget", type=float, default=60, help="at most this many seconds of such waiting in all")
    p.add_argument("--quiet_cores", type=float, default=0.3, help="'quiet' = others use at most this many cores")
    p.add_argument(
        "--peak_tflops", type=float, default=None, help="the device's peak for MFU when it is not in flops.PEAK_TFLOPS"
    )
    p.add_argument(
        "--out", default=None, help="JSON path (default: benchmarks/train_<machine>.json; --quick: outputs/bench/...)"
    )
    p.add_argument(
        "--count-steps",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after the rounds, count each step's kernel launches and host syncs for ours and the bare loop "
        "(torch.profiler on CUDA; on a CPU a proxy, see distrinews_course/bench/step_ops.py)",
    )
    p.add_argument("--trace_dir", default=None, help="on CUDA: a Chrome trace (CPU/GPU timeline) per counted contender")
    p.add_argument(
        "--update",
        action="store_true",
        help="merge into an existing --out file: its other sections stay (one GPU session, several device calls)",
    )
    p.add_argument("--no-plots", dest="plots", action="store_false")
    p.add_argument(
        "--refresh",
        default=None,
        metavar="JSON",
        help="no measuring: redraw the plots and recompute the derived summaries (headline, targets) of a result file",
    )
    p.add_argument("--ddp-worker", default=None, help=argparse.SUPPRESS)
    return p


PART_KEYS = {"compare": ("compare",), "ddp": ("ddp",), "preset": ("preset",), "floor": ("launch_floor", "t4_forecast")}


def merge_parts(earlier: dict, now: dict, sections: set) -> dict:
    """--update: the earlier file with this run's sections in place of its own; each run's provenance in 'parts'."""
    parts = earlier.get("parts") or [{k: earlier.get(k) for k in ("git_commit", "started", "command", "settings")}]
    merged = {**earlier}
    for section in sections:
        for key in PART_KEYS[section]:
            if key in now:
                merged[key] = now[key]
    merged["parts"] = [*parts, {k: now.get(k) for k in ("git_commit", "started", "command", "settings")}]
    merged["seconds_total"] = round(earlier.get("seconds_total", 0) + now["seconds_total"], 1)
    return merged


@main_guard
def main(argv=None):
    args = build_arg_parser().parse_args(argv)
    if args.ddp_worker:
        return ddp_worker(args.ddp_worker)
    if args.refresh:
        return refresh(Path(args.refresh))

    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in args.models:
        if m not in MODELS:
            raise UserError(f"--models: unknown model {m!r}; choices: {', '.join(MODELS)}.")
    sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    if sections - set(SECTIONS):
        raise UserError(
            f"--sections: unknown {', '.join(sorted(sections - set(SECTIONS)))}; choices: {', '.join(SECTIONS)}."
        )
    for name in ("rounds", "threads", "ddp_nproc"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UserError(f"--{name} must be at least 1 (got {getattr(args, name)}).")
    data_arg = resolve_data(args.data)

    one_gpu_for_this_process()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here needs the network; --data hub still reaches the hub
    cuda = torch.cuda.is_available()
    if args.threads is None and not cuda:
        args.threads = 1
    if args.threads:
        torch.set_num_threads(args.threads)
    bench_plan = full_plan(args.quick, cuda)
    if args.quiet_timeout is None:
        args.quiet_timeout = 0.0 if args.quick or cuda else 4.0
    device = precision.resolve_device("auto")
    slug = provenance.machine_slug()
    out_path = (
        Path(args.out)
        if args.out
        else (
            REPO / "outputs" / "bench" / f"train_{slug}_quick.json"
            if args.quick
            else REPO / "benchmarks" / f"train_{slug}.json"
        )
    )
    started = time.time()
    result = {
        "benchmark": "train",
        **provenance.provenance(),
        "quick": args.quick,
        "settings": {
            "device": str(device),
            "threads": args.threads,
            "max_length": args.max_length,
            "seed": args.seed,
            "plan": bench_plan,
            "models": args.models,
            "sections": sorted(sections),
            "data": data_arg,
        },
    }
    log = lambda s: print(s, flush=True)  # noqa: E731
    log(
        f"bench_train: {result['machine']} | {device} | torch {torch.__version__} | git {result['git_commit']} | "
        f"load average {provenance.load_average()}"
    )
    splits = sources.load_agnews(data_arg)
    result["data"] = {
        "source": splits.source,
        "detail": splits.detail,
        "is_synthetic": splits.is_synthetic,
        "train_texts": len(splits.train_texts),
        "note": data_note(splits),
        "script_argument": data_arg,
    }
    log(result["data"]["note"])
    args.n_train = len(splits.train_texts)
    del splits
    if args.rounds:
        for sec in [*bench_plan["compare"].values(), bench_plan["ddp"]]:
            sec["rounds"] = args.rounds
    with tempfile.TemporaryDirectory(prefix="bench_train_") as tmp:
        workdir = Path(tmp)
        if "compare" in sections:
            result["compare"] = compare_section(bench_plan, data_arg, device, args, log, workdir)
        if "preset" in sections:
            plan = preset_plan(args.quick, cuda)
            result["preset"] = (
                preset_section(plan, data_arg, device, args, log, workdir)
                if plan
                else {"skipped": "the large_gpu preset's batch of 256 on DistilBERT-base is measured on a GPU"}
            )
        if "floor" in sections:
            result.update(floor_section(data_arg, args, log, workdir, args.quick))
        if "ddp" in sections:
            result["ddp"] = ddp_section(
                bench_plan["ddp"],
                args,
                data_arg,
                device.type,
                log,
                workdir,
                functools.partial(launch.torchrun, Path(__file__)),
            )
    result["seconds_total"] = round(time.time() - started, 1)
    result["load_average_at_end"] = provenance.load_average()
    if args.update and out_path.is_file():  # another part of the same session: keep the sections it measured
        result = merge_parts(json.loads(out_path.read_text()), result, sections)
    result["targets"] = targets(result)
    result["headline"] = headline(result)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if args.plots:
        result["plots"] = [
            str(f.relative_to(REPO)) if f.is_relative_to(REPO) else str(f)
            for f in plot(result, out_path.with_suffix(".png"))
        ]
    out_path.write_text(json.dumps(provenance.as_jsonable(ordered(result)), indent=1))
    log(f"\nheadline: {json.dumps(result['headline'], indent=1)}")
    log(f"targets: {json.dumps(result['targets'], indent=1)}")
    log(f"wrote {out_path} in {result['seconds_total']:.0f} s")
    return result


if __name__ == "__main__":
    run_and_end(main)  # ends without the interpreter's teardown (its --ddp-worker ranks join a gloo group)
