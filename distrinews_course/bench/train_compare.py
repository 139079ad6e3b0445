"""bench_train's compare section: train_single.py (the CLI's default fast path) against transformers.Trainer, with
its defaults and with our options, and against itself with one fast-path option off; side by side in rounds."""

from __future__ import annotations

import contextlib
import gc
import io
from pathlib import Path

import torch

from distrinews_lib import plan as run_plan
from distrinews_lib.errors import UserError
from distrinews_lib.training import config, flops, precision

from . import global_state, provenance, step_ops, throughput, timing
from .train_bare import our_batches, run_bare
from .train_measure import SINGLE, hf_dataset, run_ours, run_script, run_trainer, trainer_available
from .train_setup import (
    MODEL_DESCRIPTIONS,
    TRAINER_MEGABATCH,
    ablation_flags,
    materialise_model,
    parse_argv,
    script_argv,
)
from .train_stats import headline_ratio, line, paired, paired_ratios, rotate, summarise

OURS = ("ours", "--compile", "--compile_mode reduce-overhead")  # our loop as a user runs it, in its three modes
TRAINERS = ("hf_trainer", "hf_trainer_same_options", "hf_trainer_same_options --torch_compile")
COUNT_WINDOW = (3, 4)  # counted: optimizer steps 5-7 (step 4, the window's first, starts the proxy's tracking)
# On CUDA later steps: by step 30 the graphs path has recorded its graph for each of the 4 batch widths
COUNT_WINDOW_CUDA = (30, 5)


def compare_contenders(model_name: str, plan: dict, device, args, log) -> tuple[dict, dict]:
    cuda = device.type == "cuda"
    contenders = {
        "ours": dict(kind="ours", flags=[], description="scripts/train_single.py, the CLI's default fast path")
    }
    why_no_trainer = trainer_available()
    if why_no_trainer is None:
        contenders["hf_trainer"] = dict(
            kind="trainer",
            same_options=False,
            compile=False,
            description="transformers.Trainer: its defaults + DataCollatorWithPadding, our precision",
        )
        contenders["hf_trainer_same_options"] = dict(
            kind="trainer",
            same_options=True,
            compile=False,
            description=(
                "Trainer with our options: length grouping, fused AdamW, same precision/padding/pinning/decay/warm-up"
            ),
        )
    else:
        log(f"   Trainer contenders SKIPPED: {why_no_trainer}")
    contenders["bare"] = dict(
        kind="bare",
        compile_mode=None,
        description="the bare loop: same model and batches, already on the device; forward, backward, fused AdamW",
    )
    skipped = {}
    for name, desc in ablation_flags(device, plan["ablations"].get(model_name, [])):
        if name.startswith("--compile") and not (cuda or args.compile):
            skipped[name] = "not run on a CPU unless --compile is given (compiling takes minutes there)"
            continue
        contenders[name] = dict(kind="ours", flags=name.split(), description=desc)
        if name == "--compile":
            contenders["bare --compile"] = dict(
                kind="bare", compile_mode="default", description="the bare loop, its model torch.compile'd"
            )
        if name == "--compile" and why_no_trainer is None:
            contenders["hf_trainer_same_options --torch_compile"] = dict(
                kind="trainer",
                same_options=True,
                compile=True,
                description="Trainer with our options and torch_compile=True",
            )
    if not cuda:
        for name in ("--no-pin_memory",):
            skipped[name] = "CUDA-only option: it does nothing on a CPU"
    if why_no_trainer:
        skipped["hf_trainer"] = why_no_trainer
    return contenders, skipped


def compare_section(plan, data_arg: str, device, args, log, workdir: Path) -> dict:
    out = {}
    for model_name, cfg in plan["compare"].items():
        if model_name not in args.models:
            continue
        W, K, B = cfg["warmup"], cfg["steps"], cfg["batch_size"]
        model_arg = materialise_model(model_name, workdir / model_name, args.seed)
        # Enough texts that Trainer's length groups are full megabatches (>= 4 x 50 batches), and the timed window
        # is a whole number of them when W and K are multiples of 50 (see scripts/bench_train.py's
        # docstring).
        if (W + K) * B > args.n_train:
            raise UserError(
                f"the {model_name} comparison needs {(W + K) * B} training texts ({W}+{K} steps of {B}); "
                f"--data {data_arg} has {args.n_train}. Use a larger folder, or --data embedded."
            )
        n_texts = (W + K) * B if args.quick else min(max((W + K) * B, 4 * TRAINER_MEGABATCH * B), args.n_train)
        counted = sum(COUNT_WINDOW_CUDA if device.type == "cuda" else COUNT_WINDOW) + 1
        n_texts = max(n_texts, counted * B)  # the step count's runs take that many steps
        contenders, skipped = compare_contenders(model_name, plan, device, args, log)
        argv_of = {
            name: script_argv(
                model=model_arg,
                data_arg=data_arg,
                batch_size=B,
                steps=W + K,
                num_samples=n_texts,
                max_length=args.max_length,
                seed=args.seed,
                threads=args.threads,
                out=workdir / "runs" / model_name,
                device_type=device.type,
                flags=c.get("flags", []),
            )
            for name, c in contenders.items()
        }
        cfg_of = {name: parse_argv(argv) for name, argv in argv_of.items()}  # a bad flag stops here, with its message
        argv_of = {n: a for n, a in argv_of.items() if contenders[n]["kind"] == "ours"}
        base = cfg_of["ours"]
        # The very data and model the script builds, for Trainer (and the model's shape for FLOPs).
        with contextlib.redirect_stdout(io.StringIO()):
            prepared = run_plan.prepare(run_plan.decide(base, log=lambda *a: None), log=lambda *a: None)
        shape = flops.model_shape(prepared.model)
        n_real = len(prepared.train_ds)
        whole_groups = (
            not args.quick
            and W % TRAINER_MEGABATCH == 0
            and K % TRAINER_MEGABATCH == 0
            and n_real >= 4 * TRAINER_MEGABATCH * B
        )
        metric = "samples_per_s" if whole_groups else "model_tflops"
        lengths = prepared.train_ds.lengths
        mean_len = sum(lengths) / len(lengths)
        gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None

        def precision_that_ran(res: dict, c: config.RunConfig) -> None:
            """MFU against the peak of the dtype the window's matmuls ran in: its AMP dtype, else TF32 or fp32 as
            the global state stood when the window ended (a contender may have changed it)."""
            res["matmul_dtype"] = flops.matmul_dtype(precision.resolve_amp(c.amp, device).mode, device.type)
            peak = args.peak_tflops or (flops.peak_tflops(gpu, res["matmul_dtype"]) if gpu else None)
            res["peak_tflops"] = peak
            res["mfu"] = flops.mfu(res["model_tflops"] * 1e12, peak) if res.get("model_tflops") else None

        log(
            f"\n== compare: {model_name} ({MODEL_DESCRIPTIONS[model_name]}; {shape.n_params / 1e6:.1f}M params, "
            f"{shape.n_nonembedding / 1e6:.2f}M non-embedding) | batch {B} | {W} warm-up + {K} timed steps | "
            f"{cfg['rounds']} rounds | {args.threads or torch.get_num_threads()} thread(s) | {device}"
        )
        log(
            f"   {n_real} texts, mean {mean_len:.1f} tokens (max_length {args.max_length}); "
            "model FLOPs per text at the "
            f"mean length: {throughput.training_flops(shape, [round(mean_len)]) / 1e6:.1f} M; ratios quoted on {metric}"
        )
        hf_train = hf_dataset(prepared.train_ds) if any(c["kind"] == "trainer" for c in contenders.values()) else None
        bare_batches = our_batches(prepared, base, device, max(W + K, counted))
        results = {name: [] for name in contenders}
        names = list(contenders)
        gate = timing.QuietGate(args.quiet_cores, args.quiet_timeout, args.quiet_budget / 2 / len(plan["compare"]))
        baseline = global_state.GlobalState.capture()  # every window starts from this (TF32, cuDNN, caches...)
        for r in range(cfg["rounds"]):
            log(f"  round {r + 1}/{cfg['rounds']} (load average {provenance.load_average()})")
            for name in rotate(names, r):
                c = contenders[name]
                global_state.start_window(baseline, name)
                if c["kind"] == "ours":
                    res = run_ours(argv_of[name], warmup=W, steps=K, device=device, shape=shape, peak=None, gate=gate)
                elif c["kind"] == "bare":
                    res = run_bare(
                        prepared.model,
                        bare_batches,
                        base,
                        device,
                        warmup=W,
                        steps=K,
                        shape=shape,
                        compile_mode=c["compile_mode"],
                        gate=gate,
                    )
                else:
                    res = run_trainer(
                        prepared.model,
                        hf_train,
                        prepared.tokenizer,
                        base,
                        device,
                        same_options=c["same_options"],
                        compile_=c["compile"],
                        warmup=W,
                        steps=K,
                        shape=shape,
                        peak=None,
                        gate=gate,
                    )
                precision_that_ran(res, cfg_of.get(name, base))
                results[name].append(res)
                log(line(name, res))
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        section = {
            "model": model_name,
            "model_description": MODEL_DESCRIPTIONS[model_name],
            "shape": provenance.as_jsonable(shape),
            "attn_implementation": getattr(prepared.model.config, "_attn_implementation", None),
            "settings": {
                **cfg,
                "max_length": args.max_length,
                "threads": args.threads,
                "device": str(device),
                "amp": precision.resolve_amp(base.amp, device).mode,
                "lr": base.lr,
                "texts": n_real,
                "window_covers_whole_trainer_length_groups": whole_groups,
            },
            "headline_metric": metric,
            "headline_metric_why": (
                "the windows cover whole length groups of both samplers, so samples/s compares like with like"
                if whole_groups
                else "the window is shorter than Trainer's length groups (50 batches, longest first), so the "
                "contenders saw different lengths: model FLOP/s counts each text's real length"
            ),
            "commands": {
                n: "python scripts/train_single.py " + " ".join(a)
                for n, a in argv_of.items()
                if contenders[n]["kind"] == "ours"
            },
            "mean_tokens": mean_len,
            "contenders": {},
            "skipped": skipped,
        }
        for name, rs in results.items():
            section["contenders"][name] = {**{k: v for k, v in contenders[name].items()}, **summarise(rs), "rounds": rs}
        section["ratios"] = paired_ratios(results, "ours", [n for n in results if n != "ours"])
        for a, b in (
            ("--compile", "hf_trainer_same_options --torch_compile"),
            ("--compile", "bare --compile"),
            ("--compile_mode reduce-overhead", "ours"),
        ):
            if a in results and b in results:
                section["ratios"][f"{a} / {b}"] = paired(results[a], results[b], metric)
        section["race"] = race(section, metric)
        if args.count_steps:
            section["step_ops"] = count_step_ops(
                argv_of, prepared, bare_batches, base, device, contenders, args, model_name, log
            )
        out[model_name] = section
        log(summary_lines(model_name, section))
        del prepared, hf_train
        gc.collect()
    return out


def summary_lines(model_name: str, section: dict) -> str:
    metric = section["headline_metric"]
    rows = [f"  -- {model_name}: medians over rounds (ratio = ours / other, median of per-round ratios of {metric})"]
    for name, c in section["contenders"].items():
        s, t = c["samples_per_s"]["median"], c["tokens_per_s"]["median"]
        mfu = c["mfu"]["median"] if c["mfu"] else None
        r = headline_ratio(section, f"ours / {name}")
        rows.append(
            f"     {name:34s} {timing.format_rate(s, t, c['model_tflops']['median'], mfu)}"
            + (f" | ours is {r:.2f}x" if r else "")
        )
    for key, rr in section["ratios"].items():
        if not key.startswith("ours / ") and rr.get("median_of_rounds"):
            rows.append(f"     {key}: {rr['median_of_rounds']:.2f}x")
    return "\n".join(rows)


def race(section: dict, metric: str) -> dict:
    """Issue 41's questions, answered from the per-round ratios: ours against the bare loop (eager, compiled), the
    CUDA-graphs path against ours eager, and ours at its best against Trainer at its best (best: the highest median
    of `metric` among each side's contenders that ran)."""
    c, ratios = section["contenders"], section["ratios"]

    def ratio(key):
        r = ratios.get(key)
        if r and metric != "samples_per_s" and "by_model_flops" in r:
            r = r["by_model_flops"]
        return r["median_of_rounds"] if r else None

    def best(names):
        ran = [n for n in names if n in c and c[n][metric]["median"]]
        return max(ran, key=lambda n: c[n][metric]["median"]) if ran else None

    ours, trainer = best(OURS), best(TRAINERS)
    out = {
        "metric": metric,
        "ours_vs_bare_eager": ratio("ours / bare"),
        "ours_vs_bare_compiled": ratio("--compile / bare --compile"),
        "graphs_vs_ours_eager": ratio("--compile_mode reduce-overhead / ours"),
        "best_ours": ours,
        "best_trainer": trainer,
    }
    if ours and trainer:
        out["best_ours_vs_best_trainer"] = c[ours][metric]["median"] / c[trainer][metric]["median"]
    return out


def count_step_ops(argv_of, prepared, bare_batches, cfg, device, contenders, args, model_name, log) -> dict:
    """Not timed: a few steps of ours and of the bare loop (and on CUDA of every compiled contender) again, counting
    what each step launches and where it waits for the device (step_ops). On a CPU the counts are the proxy's."""
    cuda, out = device.type == "cuda", {}
    first, n = COUNT_WINDOW_CUDA if cuda else COUNT_WINDOW
    wanted = [name for name in ("ours", "bare", "--compile_mode reduce-overhead") if name in contenders]
    if not cuda:
        wanted = [name for name in wanted if name in ("ours", "bare")]  # compiled code is invisible to the proxy
    for name in wanted:
        c = contenders[name]
        trace = (
            str(Path(args.trace_dir) / f"{model_name}_{name.strip('-').replace(' ', '_')}.json")
            if (cuda and args.trace_dir)
            else None
        )
        window = step_ops.ProfileWindow(first, n, trace) if cuda else step_ops.StepWindow(first, n, proxy=True)
        if c["kind"] == "ours":
            argv = [*argv_of[name]]
            argv[argv.index("--max_steps_per_epoch") + 1] = str(first + n + 1)
            with window:
                run_script(SINGLE, argv, warmup=1, steps=first + n, device=device)
        else:
            run_bare(
                prepared.model,
                bare_batches,
                cfg,
                device,
                warmup=1,
                steps=first + n,
                compile_mode=c["compile_mode"],
                window=window,
            )
        out[name] = window.summary()
        log(
            f"   {name:34s} per step: {out[name]['launches_per_step']:.0f} launches, "
            f"{out[name]['syncs_per_step']:.1f} host syncs ({out[name]['what']})"
        )
    return out
