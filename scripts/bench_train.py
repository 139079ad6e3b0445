"""Training throughput of the course's own scripts: against Hugging Face Trainer, what each fast-path option
buys, and DDP scaling.

    python scripts/bench_train.py             # full run (about 10 min on a 2-core CPU): benchmarks/train_<machine>.json + plots
    python scripts/bench_train.py --quick     # a few tiny steps of everything (CI keeps the script working with it)

"Our loop" is scripts/train_single.py and scripts/train_ddp.py themselves, unchanged, run in-process by
distrinews_lib.bench.harness: a global optimizer-step hook marks the clock after warm-up step W and after step
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
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import gc
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run from a checkout without installing
SINGLE, DDP_SCRIPT = REPO / "scripts" / "train_single.py", REPO / "scripts" / "train_ddp.py"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.optim.optimizer import register_optimizer_step_post_hook  # noqa: E402

from distrinews_lib.bench import harness, provenance, throughput, timing  # noqa: E402
from distrinews_lib.course import launch  # noqa: E402
from distrinews_lib.distributed import run_and_end  # noqa: E402
from distrinews_lib.data import batching, sources, texts, tokenization  # noqa: E402
from distrinews_lib.data.texts import AG_NEWS_LABELS  # noqa: E402
from distrinews_lib.data.tokenization import tiny_tokenizer  # noqa: E402
from distrinews_lib.errors import UserError, main_guard  # noqa: E402
from distrinews_lib.models.build import build_model  # noqa: E402
from distrinews_lib.training import config, flops, loop, precision  # noqa: E402
from distrinews_lib.training import plan as run_plan  # noqa: E402
from distrinews_lib.training.config import RunConfig  # noqa: E402

# transformers, datasets, accelerate and matplotlib are imported where they are used: optional here (only the
# Trainer contenders, DistilBERT-base and the plots need them) and slow to import.

MODELS = ("tiny", "distilbert-base")
TRAINER_MEGABATCH = 50     # transformers' LengthGroupedSampler: megabatches of up to 50 batches
CLEAN_CORES = 0.25         # a window is "clean" when other processes used at most this many cores during it
EVAL_SAMPLES = 16          # the scripts evaluate after their epoch; keep that short (it is not timed)


# --------------------------------------------------------------------------- settings

def full_plan(quick: bool, cuda: bool = False) -> dict:
    """Steps, batches and rounds per section. Chosen so the full run takes ~10 min on 2 shared CPU cores
    (on a GPU: more steps, larger batches, and DistilBERT-base for the scaling run, where it means something).
    warmup/steps that are multiples of 50 give whole Trainer megabatches (see the module docstring)."""
    if cuda and not quick:
        return {
            "compare": {"tiny": dict(batch_size=32, warmup=50, steps=100, rounds=5),
                        "distilbert-base": dict(batch_size=32, warmup=50, steps=100, rounds=5)},
            "ablations": {"tiny": "all", "distilbert-base": "all"},
            "ddp": dict(model="distilbert-base", global_batches=[64, 256], knobs=True, warmup=10, steps=(40, 20), rounds=3),
        }
    if quick:
        return {
            "compare": {"tiny": dict(batch_size=16, warmup=1, steps=3, rounds=1)},
            "ablations": {"tiny": ["--no-group_by_length"]},
            "ddp": dict(model="tiny", global_batches=[32], knobs=False, warmup=1, steps=3, rounds=1),
        }
    return {
        "compare": {"tiny": dict(batch_size=32, warmup=50, steps=50, rounds=4),
                    "distilbert-base": dict(batch_size=16, warmup=1, steps=3, rounds=2)},
        "ablations": {"tiny": "all", "distilbert-base": ["--amp bf16"]},
        "ddp": dict(model="tiny", global_batches=[64, 256, 512], knobs=True, warmup=2, steps=(30, 10, 6), rounds=3),
    }


def ablation_flags(device: torch.device, wanted) -> list:
    """(flag, description) for every fast-path option that does something on this device: the flag turns it
    off (or, where the default is off, on). Follows RunConfig's defaults, so it stays right when they change."""
    cuda = device.type == "cuda"
    d = config.RunConfig()
    pad_default = d.pad_multiple if d.pad_multiple is not None else (8 if cuda else 0)
    amp_default = precision.resolve_amp(d.amp, device).mode
    fused_default = loop.fused_adamw_available(device.type) if d.fused_adam is None else d.fused_adam
    table = [
        ("--no-group_by_length", "length-grouped batches off: random batches, padded to their longest text", d.group_by_length),
        ("--pad_multiple 0", "no rounding of the padded width up to a multiple of 8", pad_default not in (0, 1)),
        ("--pad_multiple 8", "padded width rounded up to a multiple of 8 (the CUDA default)", pad_default in (0, 1)),
        ("--amp off", "AMP off (fp32)", amp_default != "off"),
        ("--amp bf16", "bf16 autocast (AMP is off by default on the CPU)", amp_default == "off" and not cuda),
        ("--no-pin_memory", "pinned host memory + non-blocking copies off", cuda),
        ("--no-fused_adam", "fused AdamW kernel off (foreach AdamW)", fused_default),
        ("--compile", "torch.compile the model (compile time excluded: it happens in the warm-up)", True),
    ]
    return [(name, desc) for name, desc, ok in table if ok and (wanted == "all" or name in wanted)]


# --------------------------------------------------------------------------- data and models

def resolve_data(choice: str) -> str:
    """What the scripts get as --data. auto: $DISTRINEWS_DATA_DIR, else the real AG News sample embedded in
    distrinews_lib (never the hub: a benchmark must not depend on the network)."""
    return sources.offline_source(choice, ("embedded", "synthetic", "hub"))


def data_note(splits: texts.TextSplits) -> str:
    if splits.is_synthetic:
        return ("SYNTHETIC texts: their length distribution is the generator's, not AG News'. Ratios are indicative only.")
    return f"real AG News texts ({splits.source}: {splits.detail}): their real length distribution"


def materialise_model(name: str, folder: Path, seed: int) -> str:
    """What the scripts get as --model. distilbert-base: DistilBERT-base's config with random weights and the
    course's offline tokenizer, saved to `folder` (throughput only; nothing is downloaded)."""
    if name == "tiny":
        return "tiny"
    if name == "distilbert-base":
        from transformers import AutoModelForSequenceClassification, DistilBertConfig
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # no "Writing model shards" bar in the benchmark's output
        torch.manual_seed(seed)
        cfg = DistilBertConfig(num_labels=4)  # the defaults ARE distilbert-base-uncased: 6 layers, dim 768, 12 heads
        AutoModelForSequenceClassification.from_config(cfg).save_pretrained(folder)
        tiny_tokenizer().save_pretrained(folder)
        return str(folder)
    raise UserError(f"--models: unknown model {name!r}; choices: {', '.join(MODELS)}.")


MODEL_DESCRIPTIONS = {"tiny": "tiny preset: random 2-layer dim-64 DistilBERT, 30522-token vocabulary",
                      "distilbert-base": "DistilBERT-base from its config (6 layers, dim 768, 12 heads), random weights"}


def script_argv(*, model: str, data_arg: str, batch_size: int, steps: int, num_samples: int, max_length: int, seed: int,
                threads: int | None, out: Path, device_type: str, flags=(), ddp: bool = False) -> list:
    """The command line a user could type: the device's preset, then every value that matters spelled out."""
    argv = ["--config", "cpu_smoke" if device_type == "cpu" else "single_gpu",
            "--model", model, "--data", data_arg, "--epochs", 1, "--num_samples", num_samples,
            "--eval_samples", EVAL_SAMPLES, "--batch_size", batch_size, "--max_length", max_length,
            "--lr", 5e-5, "--weight_decay", 0.01, "--warmup_ratio", 0.06, "--amp", "auto", "--seed", seed,
            "--max_steps_per_epoch", steps, "--no-progress", "--no-snapshots",
            "--output", out, "--checkpoint", out / "model.pt"]
    if threads:
        argv += ["--threads", threads]
    if ddp:
        argv += ["--backend", "auto"]
    return [str(a) for a in [*argv, *flags]]


def parse_argv(argv: list, ddp: bool = False) -> config.RunConfig:
    return config.parse("bench", argv, ddp=ddp)


# --------------------------------------------------------------------------- measuring the scripts

class StepProbe:
    """A global optimizer-step hook registered BEFORE harness.run's own, so it runs first at every step:
    it records this process's CPU clock after each step, and at step `warmup` calls `wait()` (wait for a
    quiet CPU, and under DDP a barrier) before the harness starts its clock."""

    def __init__(self, warmup: int, wait=None):
        self.warmup, self.wait, self.cpu, self.quiet = warmup, wait, [], None

    def __call__(self, *_):
        if len(self.cpu) + 1 == self.warmup and self.wait is not None:
            self.quiet = self.wait()
        self.cpu.append(time.process_time())

    def __enter__(self):
        self.handle = register_optimizer_step_post_hook(self)
        return self

    def __exit__(self, *exc):
        self.handle.remove()

    def step_cpu_seconds(self, steps: int) -> list:
        """CPU seconds of each timed step (steps warmup+1 .. warmup+steps)."""
        marks = self.cpu[self.warmup - 1:self.warmup + steps]
        return [b - a for a, b in zip(marks, marks[1:])]


def run_script(script: Path, argv: list, *, warmup: int, steps: int, device, wait=None, comm: bool = False):
    """(harness Window, StepProbe, captured output) of one run of a course script, its own output kept quiet."""
    buf = io.StringIO()
    try:
        with StepProbe(warmup, wait) as probe, contextlib.redirect_stdout(buf):
            window = harness.run(script, argv, warmup=warmup, steps=steps, device=device, comm=comm)
    except SystemExit as stop:  # the script's main_guard already printed the user's mistake on stderr
        raise UserError(f"{script.name} {' '.join(argv)} stopped (exit code {stop.code}). Its output:\n{buf.getvalue()[-2000:]}") from None
    return window, probe, buf.getvalue()


def run_ours(argv, *, warmup, steps, device, shape, peak, gate) -> dict:
    window, probe, _ = run_script(SINGLE, argv, warmup=warmup, steps=steps, device=device, wait=gate.wait)
    res = window.result(shape, peak)
    res["waited_for_quiet"] = probe.quiet
    res["threads"] = torch.get_num_threads()
    return res


# --------------------------------------------------------------------------- measuring Hugging Face Trainer

class RecordingCollator:
    """Wraps the collator Trainer uses and remembers each batch's real lengths and padded width."""

    def __init__(self, inner):
        self.inner, self.records = inner, []

    def __call__(self, features):
        batch = self.inner(features)
        self.records.append((batch["attention_mask"].sum(1).tolist(), int(batch["attention_mask"].shape[1])))
        return batch


def hf_dataset(dataset: tokenization.TokenizedDataset):
    """What a user has after `Dataset.from_dict(...).map(tokenizer, batched=True)`: input_ids, attention_mask, label."""
    from datasets import Dataset

    return Dataset.from_dict({"input_ids": dataset.input_ids,
                              "attention_mask": [[1] * len(x) for x in dataset.input_ids],
                              "label": list(dataset.labels)})


def trainer_available() -> str | None:
    """None when transformers.Trainer can run here, else why not."""
    try:
        import accelerate  # noqa: F401
        from transformers import Trainer  # noqa: F401
    except ImportError as err:
        return f"transformers.Trainer needs accelerate ({err}); pip install accelerate"
    try:
        import datasets  # noqa: F401  (hf_dataset: Trainer is fed a datasets.Dataset, as its users do)
    except ImportError as err:
        return f"the Trainer contenders read a datasets.Dataset ({err}); pip install datasets"
    return None


def trainer_options(cfg: config.RunConfig, device, same_options: bool, compile_: bool) -> dict:
    """TrainingArguments beyond the common ones. same_options: what our loop does, in Trainer's words.

    transformers 5 spells length grouping train_sampling_strategy="group_by_length" (4.x: group_by_length=True)
    and takes a warm-up ratio as a float warmup_steps (4.x: warmup_ratio)."""
    from transformers import TrainingArguments

    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    out = {}
    if same_options:
        if cfg.group_by_length:
            out.update({"train_sampling_strategy": "group_by_length"} if "train_sampling_strategy" in fields
                       else {"group_by_length": True})
        fused = loop.fused_adamw_available(device.type) if cfg.fused_adam is None else cfg.fused_adam
        out["optim"] = "adamw_torch_fused" if fused else "adamw_torch"
        out["weight_decay"] = cfg.weight_decay
        out["max_grad_norm"] = cfg.max_grad_norm
        out.update({"warmup_ratio": cfg.warmup_ratio} if "warmup_ratio" in fields else {"warmup_steps": cfg.warmup_ratio})
        out["dataloader_pin_memory"] = batching.loader_options(cfg, 0, device)["pin_memory"]
    if compile_:
        out["torch_compile"] = True
    return out


def run_trainer(template, hf_train, tokenizer, cfg: config.RunConfig, device, *, same_options: bool, compile_: bool,
                warmup: int, steps: int, shape, peak, gate) -> dict:
    from transformers import DataCollatorWithPadding, Trainer, TrainerCallback, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

    amp = precision.resolve_amp(cfg.amp, device)
    pad = batching.loader_options(cfg, 0, device)["pad_to_multiple_of"] if same_options else None
    collator = RecordingCollator(DataCollatorWithPadding(tokenizer, pad_to_multiple_of=pad))
    marks, quiet = {}, [None]

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == warmup:
                quiet[0] = gate.wait()
            if state.global_step in (warmup, warmup + steps):
                timing.sync(device)
                marks[state.global_step] = (time.perf_counter(), time.process_time(), timing.cpu_busy_seconds())

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model = copy.deepcopy(template)
    extra = trainer_options(cfg, device, same_options, compile_)
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        targs = TrainingArguments(
            output_dir=tmp, per_device_train_batch_size=cfg.batch_size, max_steps=warmup + steps, learning_rate=cfg.lr,
            use_cpu=device.type == "cpu", bf16=amp.mode == "bf16", fp16=amp.mode == "fp16", report_to="none",
            save_strategy="no", logging_strategy="no", disable_tqdm=True, seed=cfg.seed, **extra)
        trainer = Trainer(model=model, args=targs, train_dataset=hf_train, data_collator=collator, callbacks=[Clock()])
        trainer.remove_callback(PrinterCallback)
        trainer.train()
    (t0, c0, b0), (t1, c1, b1) = marks[warmup], marks[warmup + steps]
    res = throughput.window(steps, t1 - t0, c1 - c0, collator.records[warmup:warmup + steps], busy=(b0, b1),
                            shape=shape, peak=peak)
    res.update(waited_for_quiet=quiet[0], threads=torch.get_num_threads(), amp=amp.mode, optimizer=str(targs.optim),
               options={k: str(v) for k, v in extra.items()}, pad_to_multiple_of=pad)
    del trainer, model
    return res


# --------------------------------------------------------------------------- statistics

def rotate(items: list, r: int) -> list:
    k = r % len(items)
    return items[k:] + items[:k]


def _clean(res: dict) -> bool:
    f = res.get("foreign_cores")
    return f is not None and f <= CLEAN_CORES


def paired(a: list, b: list, key: str = "samples_per_s") -> dict:
    """a/b round by round. 'clean' keeps the rounds where neither window shared the CPU with other processes."""
    per_round = [x[key] / y[key] for x, y in zip(a, b) if x.get(key) and y.get(key)]
    clean = [x[key] / y[key] for x, y in zip(a, b) if x.get(key) and y.get(key) and _clean(x) and _clean(y)]
    med_a = timing.summary(x.get(key) for x in a)["median"]
    med_b = timing.summary(y.get(key) for y in b)["median"]
    return {"median_of_rounds": timing.summary(per_round)["median"], "ratio_of_medians": timing.ratio(med_a, med_b),
            "per_round": per_round, "metric": key,
            "clean_rounds": len(clean), "median_of_clean_rounds": timing.summary(clean)["median"] if clean else None}


def paired_ratios(results: dict, base: str, others: list) -> dict:
    """ours / X for every other contender X: > 1 means ours is faster than X (what that option buys).
    samples/s is the figure; model FLOP/s counts each text's real length (fair when the windows saw different
    lengths); per CPU-second is the cross-check that neighbours' load cannot move (1-thread contenders)."""
    out = {}
    for o in others:
        out[f"{base} / {o}"] = {**paired(results[base], results[o]),
                                "by_model_flops": paired(results[base], results[o], "model_tflops"),
                                "per_cpu_second": paired(results[base], results[o], "samples_per_cpu_s")}
    return out


def summarise(rs: list, keys=("samples_per_s", "tokens_per_s", "samples_per_cpu_s", "model_tflops", "padding_fraction",
                              "cpu_share", "foreign_cores")) -> dict:
    out = {k: timing.summary(r.get(k) for r in rs) for k in keys}
    out["mfu"] = timing.summary(r.get("mfu") for r in rs) if any(r.get("mfu") for r in rs) else None
    return out


def line(name: str, res: dict) -> str:
    fc = res.get("foreign_cores")
    return (f"  {name:34s} {timing.format_rate(res['samples_per_s'], res['tokens_per_s'], res.get('model_tflops'), res.get('mfu'))}"
            f" | pad {100 * (res.get('padding_fraction') or 0):.0f}% | others {'?' if fc is None else round(fc, 2)} cores")


# --------------------------------------------------------------------------- the compare section

def compare_contenders(model_name: str, plan: dict, device, args, log) -> tuple[dict, dict]:
    cuda = device.type == "cuda"
    contenders = {"ours": dict(kind="ours", flags=[], description="scripts/train_single.py, the CLI's default fast path")}
    why_no_trainer = trainer_available()
    if why_no_trainer is None:
        contenders["hf_trainer"] = dict(kind="trainer", same_options=False, compile=False,
                                        description="transformers.Trainer: its defaults + DataCollatorWithPadding, our precision")
        contenders["hf_trainer_same_options"] = dict(
            kind="trainer", same_options=True, compile=False,
            description="Trainer with our options: length grouping, fused AdamW, same precision/padding/pinning/decay/warm-up")
    else:
        log(f"   Trainer contenders SKIPPED: {why_no_trainer}")
    skipped = {}
    for name, desc in ablation_flags(device, plan["ablations"].get(model_name, [])):
        if name == "--compile" and not (cuda or args.compile):
            skipped[name] = "not run on a CPU unless --compile is given (compiling takes minutes there)"
            continue
        contenders[name] = dict(kind="ours", flags=name.split(), description=desc)
        if name == "--compile" and why_no_trainer is None:
            contenders["hf_trainer_same_options --torch_compile"] = dict(
                kind="trainer", same_options=True, compile=True, description="Trainer with our options and torch_compile=True")
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
        # is a whole number of them when W and K are multiples of 50 (see the module docstring).
        if (W + K) * B > args.n_train:
            raise UserError(f"the {model_name} comparison needs {(W + K) * B} training texts ({W}+{K} steps of {B}); "
                            f"--data {data_arg} has {args.n_train}. Use a larger folder, or --data embedded.")
        n_texts = (W + K) * B if args.quick else min(max((W + K) * B, 4 * TRAINER_MEGABATCH * B), args.n_train)
        contenders, skipped = compare_contenders(model_name, plan, device, args, log)
        argv_of = {name: script_argv(model=model_arg, data_arg=data_arg, batch_size=B, steps=W + K, num_samples=n_texts,
                                     max_length=args.max_length, seed=args.seed, threads=args.threads,
                                     out=workdir / "runs" / model_name, device_type=device.type, flags=c.get("flags", []))
                   for name, c in contenders.items()}
        cfg_of = {name: parse_argv(argv) for name, argv in argv_of.items()}  # a bad flag stops here, with its message
        base = cfg_of["ours"]
        # The very data and model the script builds, for Trainer (and the model's shape for FLOPs).
        with contextlib.redirect_stdout(io.StringIO()):
            prepared = run_plan.prepare(run_plan.decide(base, log=lambda *a: None), log=lambda *a: None)
        shape = flops.model_shape(prepared.model)
        n_real = len(prepared.train_ds)
        whole_groups = (not args.quick and W % TRAINER_MEGABATCH == 0 and K % TRAINER_MEGABATCH == 0
                        and n_real >= 4 * TRAINER_MEGABATCH * B)
        metric = "samples_per_s" if whole_groups else "model_tflops"
        lengths = prepared.train_ds.lengths
        mean_len = sum(lengths) / len(lengths)
        gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None

        def peak_for(c: config.RunConfig):
            dtype = flops.matmul_dtype(precision.resolve_amp(c.amp, device).mode, device.type)
            return args.peak_tflops or (flops.peak_tflops(gpu, dtype) if gpu else None)

        log(f"\n== compare: {model_name} ({MODEL_DESCRIPTIONS[model_name]}; {shape.n_params / 1e6:.1f}M params, "
            f"{shape.n_nonembedding / 1e6:.2f}M non-embedding) | batch {B} | {W} warm-up + {K} timed steps | "
            f"{cfg['rounds']} rounds | {args.threads or torch.get_num_threads()} thread(s) | {device}")
        log(f"   {n_real} texts, mean {mean_len:.1f} tokens (max_length {args.max_length}); model FLOPs per text at the "
            f"mean length: {throughput.training_flops(shape, [round(mean_len)]) / 1e6:.1f} M; ratios quoted on {metric}")
        hf_train = hf_dataset(prepared.train_ds) if any(c["kind"] == "trainer" for c in contenders.values()) else None
        results = {name: [] for name in contenders}
        names = list(contenders)
        gate = timing.QuietGate(args.quiet_cores, args.quiet_timeout, args.quiet_budget / 2 / len(plan["compare"]))
        for r in range(cfg["rounds"]):
            log(f"  round {r + 1}/{cfg['rounds']} (load average {provenance.load_average()})")
            for name in rotate(names, r):
                c = contenders[name]
                if c["kind"] == "ours":
                    res = run_ours(argv_of[name], warmup=W, steps=K, device=device, shape=shape, peak=peak_for(cfg_of[name]),
                                   gate=gate)
                else:
                    res = run_trainer(prepared.model, hf_train, prepared.tokenizer, base, device,
                                      same_options=c["same_options"], compile_=c["compile"], warmup=W, steps=K,
                                      shape=shape, peak=peak_for(base), gate=gate)
                results[name].append(res)
                log(line(name, res))
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        section = {
            "model": model_name, "model_description": MODEL_DESCRIPTIONS[model_name], "shape": provenance.as_jsonable(shape),
            "attn_implementation": getattr(prepared.model.config, "_attn_implementation", None),
            "settings": {**cfg, "max_length": args.max_length, "threads": args.threads, "device": str(device),
                         "amp": precision.resolve_amp(base.amp, device).mode, "lr": base.lr, "texts": n_real,
                         "window_covers_whole_trainer_length_groups": whole_groups},
            "headline_metric": metric,
            "headline_metric_why": ("the windows cover whole length groups of both samplers, so samples/s compares like with like"
                                    if whole_groups else
                                    "the window is shorter than Trainer's length groups (50 batches, longest first), so the "
                                    "contenders saw different lengths: model FLOP/s counts each text's real length"),
            "commands": {n: "python scripts/train_single.py " + " ".join(a) for n, a in argv_of.items()
                         if contenders[n]["kind"] == "ours"},
            "mean_tokens": mean_len, "contenders": {}, "skipped": skipped,
        }
        for name, rs in results.items():
            section["contenders"][name] = {**{k: v for k, v in contenders[name].items()}, **summarise(rs), "rounds": rs}
        section["ratios"] = paired_ratios(results, "ours", [n for n in results if n != "ours"])
        if "--compile" in results and "hf_trainer_same_options --torch_compile" in results:
            section["ratios"]["ours --compile / hf_trainer_same_options --torch_compile"] = paired(
                results["--compile"], results["hf_trainer_same_options --torch_compile"], metric)
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
        rows.append(f"     {name:34s} {timing.format_rate(s, t, c['model_tflops']['median'], mfu)}"
                    + (f" | ours is {r:.2f}x" if r else ""))
    for key, rr in section["ratios"].items():
        if not key.startswith("ours / ") and rr.get("median_of_rounds"):
            rows.append(f"     {key}: {rr['median_of_rounds']:.2f}x")
    return "\n".join(rows)


def headline_ratio(section: dict, key: str):
    rr = section["ratios"].get(key)
    if not rr:
        return None
    return rr["median_of_rounds"] if section.get("headline_metric", "samples_per_s") == "samples_per_s" \
        else rr["by_model_flops"]["median_of_rounds"]


# --------------------------------------------------------------------------- the DDP section (parent side)

def ddp_configs(plan: dict, nproc: int) -> list:
    """Contenders of the DDP launch: for every global batch G, G on 1 process (train_single.py) and G/N on each
    of N processes (train_ddp.py); plus DDP knobs on the first global batch."""
    out = []
    for gi, g in enumerate(plan["global_batches"]):
        if g % nproc:
            raise UserError(f"global batch {g} is not divisible by {nproc} processes; pick --ddp_nproc that divides it.")
        steps = plan["steps"][gi] if isinstance(plan["steps"], (list, tuple)) else plan["steps"]
        common = dict(global_batch=g, steps=steps, warmup=plan["warmup"], flags=[])
        out.append(dict(common, name=f"G{g} x1 (train_single.py)", world=1, batch_per_rank=g))
        out.append(dict(common, name=f"G{g} x{nproc}", world=nproc, batch_per_rank=g // nproc))
        if plan.get("knobs") and gi == 0:
            for flag in ("--bucket_cap_mb 1", "--no-gradient_as_bucket_view"):
                out.append(dict(out[-1] if flag.startswith("--bucket") else out[-2], name=f"G{g} x{nproc} {flag}",
                                flags=flag.split()))
    return out


# The in-process contenders get ONE GPU: with several visible, Trainer would wrap the model in
# nn.DataParallel over all of them. main() narrows CUDA_VISIBLE_DEVICES before anything touches CUDA;
# the DDP section's launch gets the original set back.
ORIGINAL_CUDA_VISIBLE_DEVICES = os.environ.get("CUDA_VISIBLE_DEVICES")


def one_gpu_for_this_process() -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = (ORIGINAL_CUDA_VISIBLE_DEVICES or "0").split(",")[0]


class original_cuda_devices:
    """Child processes started inside this block see every GPU this script was given (not just the first)."""

    def __enter__(self):
        self.saved = os.environ.get("CUDA_VISIBLE_DEVICES")
        _set_cuda_visible(ORIGINAL_CUDA_VISIBLE_DEVICES)

    def __exit__(self, *exc):
        _set_cuda_visible(self.saved)


def _set_cuda_visible(value):
    if value is None:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = value


def all_gpu_count() -> int:
    """GPUs this script was given (this process itself sees only the first)."""
    if not torch.cuda.is_available():
        return 0
    with original_cuda_devices():
        out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                             capture_output=True, text=True, timeout=120, env=dict(os.environ))
    return int(out.stdout.strip() or 1)


def ddp_section(plan, args, data_arg: str, device_type: str, log, workdir: Path) -> dict:
    nproc = args.ddp_nproc or (all_gpu_count() or 2)
    configs = ddp_configs(plan, nproc)
    need = max((c["warmup"] + c["steps"]) * c["global_batch"] for c in configs)
    if need > args.n_train:
        raise UserError(f"the ddp section needs {need} training texts; --data {data_arg} has {args.n_train}. "
                        "Use a larger folder, or --data embedded.")
    model_arg = materialise_model(plan["model"], workdir / f"ddp_{plan['model']}", args.seed)
    spec = dict(model=model_arg, model_name=plan["model"], data=data_arg, max_length=args.max_length, seed=args.seed,
                quiet_cores=args.quiet_cores, quiet_timeout=args.quiet_timeout, quiet_budget=args.quiet_budget / 2,
                rounds=plan["rounds"], configs=configs, workdir=str(workdir / "ddp_runs"), timeout=args.ddp_timeout,
                peak_tflops=args.peak_tflops, out=str(workdir / "ddp.json"))
    spec_path = workdir / "ddp_spec.json"
    spec_path.write_text(json.dumps(spec))
    for c in configs:  # every contender's command line is checked here, before the launch
        parse_argv(worker_argv(spec, c, device_type), ddp=c["world"] > 1)
    log(f"\n== ddp: 1 vs {nproc} processes, {'gloo, 1 thread each' if device_type == 'cpu' else 'nccl, 1 GPU each'}; "
        f"{len(configs)} contenders x {plan['rounds']} rounds in one torchrun launch")
    t = time.time()
    with original_cuda_devices():
        res = launch.torchrun(Path(__file__), nproc, ["--ddp-worker", str(spec_path)], timeout=args.ddp_timeout,
                              echo=True, cpu_threads=1, cwd=REPO)
    raw = json.loads(Path(spec["out"]).read_text())
    raw["launch_seconds"] = round(time.time() - t, 1)
    raw["launch_command"] = " ".join(res.command[res.command.index("-m"):])
    raw["nproc"] = nproc
    return summarize_ddp(raw, log)


def worker_argv(spec: dict, c: dict, device_type: str) -> list:
    out = Path(spec["workdir"]) / c["name"].replace(" ", "_").replace("(", "").replace(")", "")
    return script_argv(model=spec["model"], data_arg=spec["data"], batch_size=c["batch_per_rank"], steps=c["warmup"] + c["steps"],
                       num_samples=(c["warmup"] + c["steps"]) * c["global_batch"], max_length=spec["max_length"],
                       seed=spec["seed"], threads=1 if device_type == "cpu" else None, out=out, device_type=device_type,
                       flags=c["flags"], ddp=c["world"] > 1)


def summarize_ddp(raw: dict, log) -> dict:
    by_name = {}
    for rec in raw["results"]:
        by_name.setdefault(rec["name"], []).append(rec)
    configs = {c["name"]: c for c in raw["configs"]}
    out = {"settings": {k: v for k, v in raw.items() if k not in ("results", "configs")}, "contenders": {}, "scaling": [],
           "knobs": {}}
    for name, rs in by_name.items():
        out["contenders"][name] = {"config": configs[name], **summarise(rs, ("samples_per_s", "tokens_per_s", "model_tflops",
                                                                             "foreign_cores", "comm_fraction")),
                                   "command": rs[0].get("command"), "rounds": rs}
    log("  -- ddp: medians over rounds; speedup = N-process / 1-process samples/s on the same global batch")
    for name, c in out["contenders"].items():
        comm = c["comm_fraction"]["median"]
        log(f"     {name:48s} {c['samples_per_s']['median']:9.1f} samples/s"
            + (f" | all-reduce in flight {100 * comm:.0f}% of the window" if comm is not None else ""))
    for g in sorted({c["global_batch"] for c in configs.values()}):
        base = next(n for n, c in configs.items() if c["global_batch"] == g and c["world"] == 1)
        for n, c in configs.items():
            if c["global_batch"] != g or c["world"] == 1 or c["flags"]:
                continue
            p = paired(by_name[n], by_name[base])
            pdc = paired(by_name[n], by_name[base], "samples_per_s_dedicated_estimate")
            sp, spc = p["median_of_rounds"], p["median_of_clean_rounds"]
            row = {"global_batch": g, "processes": c["world"], "batch_per_rank": c["batch_per_rank"], "contender": n,
                   "baseline": base, "speedup": sp, "speedup_ratio_of_medians": p["ratio_of_medians"],
                   "efficiency": sp / c["world"] if sp else None, "per_round": p["per_round"],
                   "clean_rounds": p["clean_rounds"], "speedup_clean_rounds": spc,
                   "efficiency_clean_rounds": spc / c["world"] if spc else None,
                   # samples per CPU-second of the average rank: no waiting, no neighbours; an upper bound
                   "speedup_cpu_time_upper_bound": paired(by_name[n], by_name[base], "samples_per_cpu_s")["median_of_rounds"],
                   # per step, the slowest rank's CPU time: waits for a slower rank count, neighbours do not
                   "speedup_dedicated_core_estimate": pdc["median_of_rounds"],
                   "comm_fraction": out["contenders"][n]["comm_fraction"]["median"]}
            out["scaling"].append(row)
            log(f"     speedup {n!r} vs {base!r}: {sp:.2f}x, efficiency {100 * sp / c['world']:.0f}% | clean rounds "
                f"({p['clean_rounds']}): {spc if spc is None else round(spc, 2)} | dedicated-core estimate "
                f"{_fmt(pdc['median_of_rounds'])}x")
    for n, c in configs.items():
        if c["flags"]:
            ref = next(m for m, d in configs.items() if d["global_batch"] == c["global_batch"] and d["world"] == c["world"]
                       and not d["flags"])
            p = paired(by_name[n], by_name[ref])
            per_step = lambda name: by_name[name][0].get("allreduces", 0) / configs[name]["steps"]  # noqa: E731
            out["knobs"][n] = {"vs": ref, "ratio": p["median_of_rounds"], "per_round": p["per_round"],
                               # a knob that leaves the buckets as they were can only measure noise (e.g. 1 MB buckets
                               # on the tiny model: the 7.8 MB embedding joins the 0.4 MB rest in one bucket)
                               "allreduces_per_step": {n: per_step(n), ref: per_step(ref)},
                               "clean_rounds": p["clean_rounds"], "ratio_clean_rounds": p["median_of_clean_rounds"],
                               "ratio_dedicated_core_estimate": paired(by_name[n], by_name[ref],
                                                                       "samples_per_s_dedicated_estimate")["median_of_rounds"]}
            log(f"     knob {n!r} / {ref!r}: {_fmt(p['median_of_rounds'], 3)}x (clean rounds: {p['median_of_clean_rounds']})")
    return out


def _fmt(x, digits: int = 2) -> str:
    return "?" if x is None else f"{x:.{digits}f}"


# --------------------------------------------------------------------------- the DDP worker (runs under torchrun)

def ddp_worker(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    if not torch.cuda.is_available():
        torch.set_num_threads(1)
    with harness.shared_process_group(timeout_s=spec["timeout"]) as (backend, why):
        rank, world = dist.get_rank(), dist.get_world_size()
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if backend == "nccl" else torch.device("cpu")
        with contextlib.redirect_stdout(io.StringIO()):
            shape = flops.model_shape(build_model(RunConfig(model=spec["model"], seed=spec["seed"]), AG_NEWS_LABELS)[0])
        gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
        gate = timing.QuietGate(spec["quiet_cores"], spec["quiet_timeout"], spec["quiet_budget"])
        results = []
        if rank == 0:
            print(f"   worker: {world} ranks | {why} | {torch.get_num_threads()} thread(s) each", flush=True)
        for r in range(spec["rounds"]):
            if rank == 0:
                print(f"  round {r + 1}/{spec['rounds']} (load average {provenance.load_average()})", flush=True)
            for c in rotate(spec["configs"], r):
                argv = worker_argv(spec, c, device.type)
                amp = precision.resolve_amp(parse_argv(argv, ddp=c["world"] > 1).amp, device)
                peak = spec["peak_tflops"] or (flops.peak_tflops(gpu, flops.matmul_dtype(amp.mode, device.type)) if gpu else None)
                res = _worker_contender(c, argv, device, shape, peak, gate, rank, world)
                if rank == 0:
                    res.update(name=c["name"], round=r, world=c["world"], load_average=provenance.load_average(),
                               command=("python scripts/train_single.py " if c["world"] == 1
                                        else f"torchrun --nproc_per_node={world} scripts/train_ddp.py ") + " ".join(argv))
                    results.append(res)
                    print(f"  {c['name']:48s} {timing.format_rate(res['samples_per_s'], res['tokens_per_s'], res['model_tflops'], res['mfu'])}"
                          f" | others {_fmt(res['foreign_cores'])} cores"
                          + (f" | all-reduce {100 * res['comm_fraction']:.0f}% of the window" if res.get("comm_fraction") is not None else ""),
                          flush=True)
                if rank == 0:
                    shutil.rmtree(argv[argv.index("--output") + 1], ignore_errors=True)
                gc.collect()
        if rank == 0:
            Path(spec["out"]).write_text(json.dumps(provenance.as_jsonable(
                {"backend": backend, "backend_reason": why, "world_size": world, "model": spec["model_name"],
                 "configs": spec["configs"], "rounds": spec["rounds"], "results": results})))
        dist.barrier()


def _worker_contender(c: dict, argv: list, device, shape, peak, gate, rank: int, world: int) -> dict:
    """One timed run of a contender on every rank; rank 0 returns the combined figures."""
    W, K = c["warmup"], c["steps"]
    if c["world"] == 1:  # train_single.py on rank 0; the other ranks wait in the barrier below
        mine = None
        c0, t0 = time.process_time(), time.perf_counter()
        if rank == 0:
            with harness.alone():
                window, probe, _ = run_script(SINGLE, argv, warmup=W, steps=K, device=device, wait=gate.wait)
            mine = (window.result(shape, peak), window.marks, probe.step_cpu_seconds(K), probe.quiet)
        dist.barrier()
        waiting = None if rank == 0 else (time.process_time() - c0) / max(time.perf_counter() - t0, 1e-9)
        gathered = [None] * world
        dist.all_gather_object(gathered, (mine, waiting))
        if rank != 0:
            return {}
        res, marks, step_cpu, quiet = gathered[0][0]
        waiting_share = sum(w for _, w in gathered[1:] if w) if world > 1 else 0.0
        (_, _, b0), (_, _, b1) = marks[W], marks[W + K]
        res["waiting_ranks_cpu_share"] = waiting_share
        res["foreign_cores"] = timing.foreign_cores(b0, b1, res["cpu_s"] + waiting_share * res["seconds"], res["seconds"])
        dedicated = sum(step_cpu)
    else:
        def wait():  # rank 0 waits for a quiet CPU; every rank starts the window together
            q = gate.wait() if rank == 0 else None
            dist.barrier()
            return q

        window, probe, _ = run_script(DDP_SCRIPT, argv, warmup=W, steps=K, device=device, wait=wait, comm=True)
        part = (window.result(shape, None), window.marks, probe.step_cpu_seconds(K), probe.quiet)
        gathered = [None] * world
        dist.all_gather_object(gathered, part)
        if rank != 0:
            return {}
        parts = [g[0] for g in gathered]
        (_, _, b0), (_, _, b1) = gathered[0][1][W], gathered[0][1][W + K]
        # rank 0's all-reduce timings; the throughput of all ranks together
        res = {**parts[0], **throughput.over_ranks(parts, busy=(b0, b1), peak=peak)}
        quiet = gathered[0][3]
        # With a core per rank and nobody else on it, a DDP step lasts about as long as its slowest rank's step:
        # the sum over steps of the max over ranks is a dedicated-core estimate the neighbours cannot inflate.
        dedicated = sum(max(g[2][i] for g in gathered) for i in range(min(len(g[2]) for g in gathered)))
    res["waited_for_quiet"] = quiet
    res["dedicated_core_estimate_s"] = dedicated
    res["samples_per_s_dedicated_estimate"] = res["samples"] / dedicated if dedicated > 0 else None
    return res


# --------------------------------------------------------------------------- plots

def plot(result: dict, base: Path) -> list:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    comp = result.get("compare") or {}
    if comp:
        fig, axes = plt.subplots(1, len(comp), figsize=(7.5 * len(comp), 5.0), squeeze=False)
        for ax, (model_name, sec) in zip(axes[0], comp.items()):
            metric = sec.get("headline_metric", "samples_per_s")
            label = "samples/s" if metric == "samples_per_s" else "model TFLOP/s"
            names = list(sec["contenders"])[::-1]
            vals = [sec["contenders"][n][metric]["median"] or 0 for n in names]
            colors = ["tab:green" if n == "ours" else "tab:red" if n.startswith("hf_trainer") else "tab:gray" for n in names]
            y = list(range(len(names)))
            bars = ax.barh(y, vals, color=colors)
            ax.bar_label(bars, labels=[f"{v:.0f}" if v >= 100 else f"{v:.3g}" for v in vals], fontsize=7, padding=2)
            ax.set_yticks(y, names, fontsize=8)
            ax.set_xlabel(f"{label}, median over rounds (wall clock)")
            ax.set_title(f"{model_name}: the course's script vs Trainer, and fast-path options off", fontsize=10)
        fig.suptitle(f"{result['machine']} | {result['settings']['device']} | {result['settings']['threads']} thread(s)", fontsize=9)
        fig.tight_layout()
        path = base.with_name(base.stem + "_compare.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(path)
    ddp = result.get("ddp") or {}
    if ddp.get("scaling"):
        rows = ddp["scaling"]
        n = max(r["processes"] for r in rows)
        fig, ax = plt.subplots(figsize=(7.5, 4.6))
        groups = sorted({r["global_batch"] for r in rows})
        kinds = [("measured", "speedup"), ("dedicated-core estimate", "speedup_dedicated_core_estimate")]
        width = 0.8 / len(kinds)
        for k, (label, key) in enumerate(kinds):
            xs, ys = [], []
            for gi, g in enumerate(groups):
                r = next((r for r in rows if r["global_batch"] == g), None)
                if r and r.get(key):
                    xs.append(gi + (k - (len(kinds) - 1) / 2) * width)
                    ys.append(r[key])
            bars = ax.bar(xs, ys, width, label=label, color="tab:blue", alpha=1.0 if k == 0 else 0.45,
                          hatch=None if k == 0 else "//")
            ax.bar_label(bars, fmt="%.2f", fontsize=7)
        ax.set_xticks(range(len(groups)), [f"global batch {g}\n({g // n} per process)" for g in groups])
        ax.axhline(n, color="k", ls="--", lw=1, label=f"ideal ({n}x)")
        ax.set_ylabel(f"{n} processes vs 1 (same global work)")
        ax.set_ylim(0, n * 1.15)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
        ax.set_title(f"DDP scaling through the course's scripts, {ddp['settings'].get('backend')}, "
                     f"{ddp['settings'].get('model', '')} model | {result['machine']}", fontsize=9)
        fig.tight_layout()
        path = base.with_name(base.stem + "_ddp.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(path)
    return files


# --------------------------------------------------------------------------- summaries

def targets(result: dict) -> dict:
    out = {}
    comp = result.get("compare") or {}
    cpu = result["settings"]["device"] == "cpu"
    tiny = comp.get("tiny")
    if tiny and cpu:
        d, s = headline_ratio(tiny, "ours / hf_trainer"), headline_ratio(tiny, "ours / hf_trainer_same_options")
        out["cpu_tiny_ours_vs_trainer_defaults"] = {"target": ">= 1.3x", "value": d, "met": bool(d and d >= 1.3)}
        out["cpu_tiny_ours_vs_trainer_same_options"] = {"target": ">= 1.0x", "value": s, "met": bool(s and s >= 1.0)}
    base = comp.get("distilbert-base")
    if base and not cpu:  # issue 13's GPU targets: DistilBERT-base, sequence 128, bf16
        ours = base["contenders"]["ours"]
        m = ours["mfu"]["median"] if ours.get("mfu") else None
        d, s = headline_ratio(base, "ours / hf_trainer"), headline_ratio(base, "ours / hf_trainer_same_options")
        out["gpu_distilbert_base_mfu"] = {"target": ">= 35%", "value": m, "met": bool(m and m >= 0.35),
                                          "amp": base["settings"]["amp"], "max_length": base["settings"]["max_length"]}
        out["gpu_distilbert_base_vs_trainer_same_options"] = {"target": ">= 1.0x", "value": s, "met": bool(s and s >= 1.0)}
        out["gpu_distilbert_base_vs_trainer_defaults"] = {"target": ">= 1.5x", "value": d, "met": bool(d and d >= 1.5)}
    rows = [r for r in (result.get("ddp") or {}).get("scaling", []) if r["processes"] == 2]
    if rows and cpu:
        best = max(rows, key=lambda r: r["speedup"] or 0)
        first = rows[0]
        out["cpu_tiny_ddp2_speedup"] = {
            "target": ">= 1.85x", "value_default_batch": first["speedup"], "default_global_batch": first["global_batch"],
            "best_value": best["speedup"], "best_global_batch": best["global_batch"],
            "met": bool(first["speedup"] and first["speedup"] >= 1.85),
            "met_at_best": bool(best["speedup"] and best["speedup"] >= 1.85),
            # not the measured figure: what the per-step CPU times say dedicated cores would give (see ddp.scaling)
            "dedicated_core_estimate_by_global_batch": {r["global_batch"]: r.get("speedup_dedicated_core_estimate") for r in rows},
            "others_cpu_use_median_cores": timing.summary(
                x.get("foreign_cores") for c in result["ddp"]["contenders"].values() for x in c["rounds"])["median"]}
    if not result.get("gpu"):
        out["gpu"] = ("not measured: no CUDA GPU on this machine (scripts/gpu_check.py measures the CUDA path - AMP, fused "
                      "AdamW, pinned memory, MFU, nccl - where one is)")
    return out


def headline(result: dict) -> dict:
    """The figures a reader wants first, flattened (derived from the measured figures in the same file)."""
    out = {}
    for model, sec in (result.get("compare") or {}).items():
        m = model.replace("-", "_")
        for name, key in (("ours", "ours"), ("hf_trainer", "trainer_defaults"), ("hf_trainer_same_options", "trainer_same_options")):
            c = sec["contenders"].get(name)
            if c:
                out[f"{m}_{key}_samples_per_s"] = c["samples_per_s"]["median"]
                out[f"{m}_{key}_tokens_per_s"] = c["tokens_per_s"]["median"]
                if c.get("mfu"):
                    out[f"{m}_{key}_mfu"] = c["mfu"]["median"]
        for name, key in (("hf_trainer", "defaults"), ("hf_trainer_same_options", "same_options")):
            r = headline_ratio(sec, f"ours / {name}")
            if r:
                out[f"{m}_ours_vs_trainer_{key}_speedup"] = r
        out[f"{m}_ratios_measured_on"] = sec.get("headline_metric", "samples_per_s")
        for key in sec["ratios"]:
            if key.startswith("ours / --"):
                out[f"{m}_option_{key[len('ours / '):]}_ours_over_it"] = headline_ratio(sec, key)
        r = sec["ratios"].get("ours --compile / hf_trainer_same_options --torch_compile")
        if r:
            out[f"{m}_compiled_ours_vs_compiled_trainer_same_options"] = r["median_of_rounds"]
    for row in (result.get("ddp") or {}).get("scaling", []):
        k = f"ddp{row['processes']}_global_batch{row['global_batch']}"
        out[f"{k}_speedup"] = row["speedup"]
        out[f"{k}_efficiency"] = row["efficiency"]
        if row.get("speedup_dedicated_core_estimate"):
            out[f"{k}_speedup_dedicated_core_estimate"] = row["speedup_dedicated_core_estimate"]
        if row.get("comm_fraction") is not None:
            out[f"{k}_allreduce_in_flight_fraction"] = row["comm_fraction"]
    return out


def ordered(result: dict) -> dict:
    """Provenance first, then the headline, then everything else (readers and notebooks scan from the top)."""
    first = ("benchmark", "machine", "cpu", "gpu", "command", "git_commit", "git_dirty", "started", "versions", "headline", "targets")
    return {**{k: result[k] for k in first if k in result}, **{k: v for k, v in result.items() if k not in first}}


# --------------------------------------------------------------------------- main

def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a few tiny steps of every section (CI)")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated: tiny, distilbert-base")
    p.add_argument("--sections", default="compare,ddp", help="comma-separated: compare, ddp")
    p.add_argument("--data", default="auto", help="auto ($DISTRINEWS_DATA_DIR, else the AG News sample embedded in "
                                                  "distrinews_lib), embedded, synthetic, hub, or a folder")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads for the in-process contenders (default: 1 on a CPU, robust when it is shared; "
                        "torch's choice on a GPU)")
    p.add_argument("--max_length", type=int, default=128)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--rounds", type=int, default=None, help="rounds of every section (default: the plan's, 3-5)")
    p.add_argument("--compile", action="store_true", help="include the torch.compile contenders on a CPU (always on a GPU)")
    p.add_argument("--ddp_nproc", type=int, default=None, help="processes for the scaling run (default: GPUs, or 2)")
    p.add_argument("--ddp_timeout", type=float, default=1200)
    p.add_argument("--quiet_timeout", type=float, default=None,
                   help="before each timed window wait up to this many seconds for other processes to leave the CPU "
                        "(default: 4 on a CPU, 0 on a GPU or with --quick)")
    p.add_argument("--quiet_budget", type=float, default=60, help="at most this many seconds of such waiting in all")
    p.add_argument("--quiet_cores", type=float, default=0.3, help="'quiet' = others use at most this many cores")
    p.add_argument("--peak_tflops", type=float, default=None, help="the device's peak for MFU when it is not in flops.PEAK_TFLOPS")
    p.add_argument("--out", default=None, help="JSON path (default: benchmarks/train_<machine>.json; --quick: outputs/bench/...)")
    p.add_argument("--no-plots", dest="plots", action="store_false")
    p.add_argument("--refresh", default=None, metavar="JSON",
                   help="no measuring: redraw the plots and recompute the derived summaries (headline, targets) of a result file")
    p.add_argument("--ddp-worker", default=None, help=argparse.SUPPRESS)
    return p


def refresh(path: Path) -> dict:
    try:
        result = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise UserError(f"--refresh {path}: cannot read it as JSON ({err}).") from None
    if result.get("benchmark") != "train":
        raise UserError(f"--refresh {path}: not a bench_train.py result (no \"benchmark\": \"train\").")
    result["targets"] = targets(result)
    result["headline"] = headline(result)
    result["refreshed"] = {"command": " ".join(["python", *sys.argv]), "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                           "what": "plots, headline and targets recomputed from this file's measured figures"}
    path.write_text(json.dumps(provenance.as_jsonable(ordered(result)), indent=1))
    for f in plot(result, path.with_suffix(".png")):
        print(f"wrote {f}")
    return result


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
    if sections - {"compare", "ddp"}:
        raise UserError(f"--sections: unknown {', '.join(sorted(sections - {'compare', 'ddp'}))}; choices: compare, ddp.")
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
    out_path = Path(args.out) if args.out else (REPO / "outputs" / "bench" / f"train_{slug}_quick.json" if args.quick
                                                else REPO / "benchmarks" / f"train_{slug}.json")
    started = time.time()
    result = {"benchmark": "train", **provenance.provenance(), "quick": args.quick,
              "settings": {"device": str(device), "threads": args.threads, "max_length": args.max_length, "seed": args.seed,
                           "plan": bench_plan, "models": args.models, "sections": sorted(sections), "data": data_arg}}
    log = lambda s: print(s, flush=True)  # noqa: E731
    log(f"bench_train: {result['machine']} | {device} | torch {torch.__version__} | git {result['git_commit']} | "
        f"load average {provenance.load_average()}")
    splits = sources.load_agnews(data_arg)
    result["data"] = {"source": splits.source, "detail": splits.detail, "is_synthetic": splits.is_synthetic,
                      "train_texts": len(splits.train_texts), "note": data_note(splits), "script_argument": data_arg}
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
        if "ddp" in sections:
            result["ddp"] = ddp_section(bench_plan["ddp"], args, data_arg, device.type, log, workdir)
    result["targets"] = targets(result)
    result["headline"] = headline(result)
    result["seconds_total"] = round(time.time() - started, 1)
    result["load_average_at_end"] = provenance.load_average()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if args.plots:
        result["plots"] = [str(f.relative_to(REPO)) if f.is_relative_to(REPO) else str(f)
                           for f in plot(result, out_path.with_suffix(".png"))]
    out_path.write_text(json.dumps(provenance.as_jsonable(ordered(result)), indent=1))
    log(f"\nheadline: {json.dumps(result['headline'], indent=1)}")
    log(f"targets: {json.dumps(result['targets'], indent=1)}")
    log(f"wrote {out_path} in {result['seconds_total']:.0f} s")
    return result


if __name__ == "__main__":
    run_and_end(main)  # ends without the interpreter's teardown (its --ddp-worker ranks join a gloo group)
