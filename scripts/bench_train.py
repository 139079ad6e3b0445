"""Training throughput: our loop vs Hugging Face Trainer, what each fast-path option buys, and DDP scaling.

    python scripts/bench_train.py             # full run (about 10 min on a 2-core CPU): benchmarks/train_<machine>.json + plots
    python scripts/bench_train.py --quick     # a few tiny steps of everything (CI keeps the script working with it)

Every figure is measured side by side in ONE run on ONE machine: the contenders alternate round after
round (the order rotates), each is timed over a fixed number of steps after a warm-up, and the JSON
quotes the median over rounds and the ratios (median of the per-round ratios). On a shared CPU the
absolute numbers move with the neighbours' load; the ratios of contenders measured seconds apart move
much less. The load average and the CPU share of every timed window are recorded so you can judge.

Sections
  compare  our loop (engine.train_one_epoch with the CLI's default fast path) vs transformers.Trainer set up
           as a user would (its defaults, DataCollatorWithPadding, same model/data/batch/precision/threads),
           plus "ours" with one fast-path option switched off (the CLI flag that does it is the name).
  ddp      1 vs N processes on the same global batch and steps: one torchrun launch in which the contenders
           alternate (the 1-process contender runs on rank 0 while the others wait in a collective), so
           1 and N processes are measured seconds apart. Speedup = N-proc samples/s / 1-proc samples/s;
           parallel efficiency = speedup / N. Plus DDP knobs (bucket size, gradient_as_bucket_view, batch).
  script   the same 1-vs-2 check end to end through scripts/train_ddp.py (separate torchrun launches).

On CUDA each line also shows model FLOPs utilisation (MFU, see distrinews_lib.perf for the formula).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run from a checkout without installing

# The in-process contenders get ONE GPU: with several visible, Trainer would wrap the model in
# nn.DataParallel over all of them. The DDP section's launch gets the original set back.
ORIGINAL_CUDA_VISIBLE_DEVICES = os.environ.get("CUDA_VISIBLE_DEVICES")
if "--ddp-worker" not in sys.argv:
    os.environ["CUDA_VISIBLE_DEVICES"] = (ORIGINAL_CUDA_VISIBLE_DEVICES or "0").split(",")[0]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from distrinews_lib import cli, data, engine, perf, recipe  # noqa: E402
from distrinews_lib import distributed as D  # noqa: E402
from distrinews_lib.model import build_model, tiny_tokenizer  # noqa: E402

SHARED_AG_NEWS = REPO.parent / "shared" / "data" / "ag_news"
MODELS = ("tiny", "distilbert-base")


# --------------------------------------------------------------------------- settings

def full_plan(quick: bool, cuda: bool = False) -> dict:
    """Steps, batches and rounds per section. Chosen so the full run takes ~10 min on 2 shared CPU cores
    (on a GPU: more steps, larger batches, and DistilBERT-base for the scaling run, where it means something)."""
    if cuda and not quick:
        return {
            "compare": {"tiny": dict(batch_size=32, warmup=20, steps=200, rounds=5),
                        "distilbert-base": dict(batch_size=32, warmup=10, steps=60, rounds=5)},
            "ablations": {"tiny": "all", "distilbert-base": "all"},
            "ddp": dict(model="distilbert-base", global_batches=[64, 256], knobs=True, warmup=10, steps=(40, 20),
                        rounds=3, ddp1=True),
            "script": None,
            "n_texts": None,
        }
    if quick:
        return {
            "compare": {"tiny": dict(batch_size=16, warmup=1, steps=3, rounds=1)},
            "ablations": {"tiny": ["--no-group_by_length"]},
            "ddp": dict(model="tiny", global_batches=[32], knobs=False, warmup=1, steps=3, rounds=1, ddp1=False),
            "script": None,
            "n_texts": 1000,
        }
    return {
        "compare": {"tiny": dict(batch_size=32, warmup=5, steps=30, rounds=5),
                    "distilbert-base": dict(batch_size=16, warmup=1, steps=3, rounds=2)},
        "ablations": {"tiny": "all", "distilbert-base": ["--amp bf16", "--amp off"]},
        "ddp": dict(model="tiny", global_batches=[64, 256, 512], knobs=True, warmup=2, steps=(30, 10, 6), rounds=3, ddp1=True),
        "script": dict(model="tiny", batch_per_rank=32, max_steps=30, pairs=1),
        "n_texts": None,
    }


def engine_fuses_adamw_on_cpu() -> bool:
    """Whether the shared loop already uses fused AdamW on the CPU (then there is nothing to 'propose')."""
    opt = engine.make_optimizer(torch.nn.Linear(1, 1), 1e-3)
    return bool(opt.param_groups[0].get("fused"))


def ablation_flags(device: torch.device, wanted) -> list:
    """(name, description, runnable here?) for every fast-path option: the name is the CLI flag that turns it
    off (or, where the default is off, on). Follows the CLI's current defaults, so it stays right when they change."""
    cuda = device.type == "cuda"
    defaults = parse_flags([], 32, 128)
    pad_default = defaults.pad_multiple if defaults.pad_multiple is not None else (8 if cuda else 0)
    fused_cpu = engine_fuses_adamw_on_cpu()
    amp_default = engine.resolve_amp(defaults.amp, device).mode
    table = [
        ("--no-group_by_length", "length-grouped batches off: random batches, padded to their longest text", True),
        ("--pad_multiple 0", "no rounding of the padded width up to a multiple of 8", pad_default not in (0, 1)),
        ("--pad_multiple 8", "padded width rounded up to a multiple of 8 (the CUDA default)", pad_default in (0, 1)),
        ("--amp off" if amp_default != "off" else ("--amp bf16" if not cuda else "--amp off"),
         "AMP off (fp32)" if amp_default != "off" else "bf16 autocast (AMP is off by default on the CPU)",
         amp_default != "off" or not cuda),
        ("--no-pin_memory", "pinned host memory + non-blocking copies off", cuda),
        ("--no-fused_adam", "fused AdamW kernel off (foreach AdamW)", cuda or fused_cpu),
        ("fused AdamW on CPU (proposed)", "torch's fused AdamW on the CPU; engine.make_optimizer does not allow it yet",
         not cuda and not fused_cpu),
        ("--compile", "torch.compile the model (compile time excluded: it happens in the warm-up)", True),
    ]
    out = []
    for name, desc, ok in table:
        if wanted != "all" and name not in wanted:
            continue
        out.append((name, desc, ok))
    return out


# --------------------------------------------------------------------------- data and models

def resolve_data(choice: str):
    """(TextSplits, note, resolved choice). auto: $DISTRINEWS_DATA_DIR, else ../shared/data/ag_news, else synthetic (said so)."""
    if choice == "auto":
        env = os.environ.get("DISTRINEWS_DATA_DIR")
        for cand in (env, str(SHARED_AG_NEWS)):
            if cand and Path(cand).is_dir():
                choice = cand
                break
        else:
            choice = "synthetic"
    if choice == "synthetic":
        splits = data.synthetic_agnews()
        return splits, "synthetic", ("SYNTHETIC texts: the real AG News folder is absent here, so the length distribution is the "
                        "synthetic generator's (12-40 words), not AG News'. Ratios are indicative only.")
    splits = data.load_folder(choice)
    return splits, choice, f"real AG News texts from {splits.detail} (their real length distribution)"


def make_model(name: str, seed: int):
    """(model, tokenizer, description). distilbert-base: DistilBERT-base's config, random weights (throughput only)."""
    if name == "tiny":
        model, tok, info = build_model("tiny", seed=seed)
        return model, tok, "tiny preset: random 2-layer dim-64 DistilBERT, 30522-token vocabulary"
    if name == "distilbert-base":
        from transformers import AutoModelForSequenceClassification, DistilBertConfig

        torch.manual_seed(seed)
        cfg = DistilBertConfig(num_labels=4)  # the defaults ARE distilbert-base-uncased: 6 layers, dim 768, 12 heads
        model = AutoModelForSequenceClassification.from_config(cfg)
        return model, tiny_tokenizer(), "DistilBERT-base built from its config (6 layers, dim 768), random weights"
    raise SystemExit(f"unknown model {name!r}; choices: {', '.join(MODELS)}")


# --------------------------------------------------------------------------- measuring our loop

class RecordingLoader:
    """Passes a DataLoader through unchanged and remembers each batch's real lengths and padded width,
    and this process's CPU clock each time the loop asks for a batch (= the end of the previous step)."""

    def __init__(self, loader):
        self.loader, self.records, self.cpu_marks = loader, [], []

    def __len__(self):
        return len(self.loader)

    def clear(self):
        self.records.clear()
        self.cpu_marks.clear()

    def __iter__(self):
        for batch in self.loader:
            self.cpu_marks.append(time.process_time())
            self.records.append((batch["attention_mask"].sum(1).tolist(), int(batch["attention_mask"].shape[1])))
            yield batch


def window(seconds: float, cpu_s: float, records: list, shape: perf.ModelShape, peak: float | None, n_devices: int = 1,
           busy=(None, None)) -> dict:
    lengths = [n for rec, _ in records for n in rec]
    padded = sum(len(rec) * width for rec, width in records)
    flops = perf.training_flops(shape, lengths)
    out = {
        "steps": len(records), "samples": len(lengths), "tokens": sum(lengths), "padded_tokens": padded,
        "seconds": round(seconds, 5), "cpu_s": round(cpu_s, 5), "cpu_share": round(cpu_s / seconds, 3) if seconds else None,
        "samples_per_s": len(lengths) / seconds, "tokens_per_s": sum(lengths) / seconds,
        # per CPU-second of this process: what a core of one's own would give (robust to neighbours' load
        # for the 1-thread contenders; not meaningful for multi-threaded ones)
        "samples_per_cpu_s": len(lengths) / cpu_s if cpu_s > 0 else None,
        "padding_fraction": round(1 - sum(lengths) / padded, 4) if padded else None,
        "model_tflops": flops / seconds / 1e12, "load_average": perf.load_average(),
        "foreign_cores": perf.foreign_cores(busy[0], busy[1], cpu_s, seconds),  # others' CPU use during the window
    }
    out["mfu"] = perf.mfu(flops / seconds, peak, n_devices)
    return out


def parse_flags(flags: list, batch_size: int, max_length: int, ddp: bool = False) -> argparse.Namespace:
    """The training scripts' own parser, so every contender is a command line a user could type."""
    args = cli.build_parser("bench", ddp=ddp).parse_args(
        [*flags, "--batch_size", str(batch_size), "--max_length", str(max_length), "--no-progress"])
    return args


def build_optimizer(model, args, proposed_fused_cpu: bool = False):
    if proposed_fused_cpu:  # what the engine would do with fused AdamW allowed on CPU (see the report)
        groups = engine.make_optimizer(model, args.lr, args.weight_decay, fused=False).param_groups
        # only params and weight decay: the groups also carry the old optimizer's fused=False/foreach settings
        return torch.optim.AdamW([{"params": g["params"], "weight_decay": g["weight_decay"]} for g in groups],
                                 lr=args.lr, fused=True)
    return engine.make_optimizer(model, args.lr, args.weight_decay, "auto" if args.fused_adam is None else args.fused_adam)


def run_ours(template, dataset, tokenizer, device, flags, *, batch_size, warmup, steps, max_length, seed, shape, peak,
             proposed_fused_cpu=False) -> dict:
    from torch.utils.data import RandomSampler

    args = parse_flags(flags, batch_size, max_length)
    amp = engine.resolve_amp(args.amp, device)
    torch.manual_seed(seed)
    model = copy.deepcopy(template).to(device)
    model = recipe.maybe_compile(model, args.compile)
    opts = recipe.loader_options(args, tokenizer, device)
    sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))  # as scripts/train_single.py
    loader = RecordingLoader(data.make_loader(dataset, batch_size, sampler, seed=seed,
                                              group_by_length=args.group_by_length, **opts))
    optimizer = build_optimizer(model, args, proposed_fused_cpu)
    scheduler = engine.make_scheduler(optimizer, warmup + steps, args.warmup_ratio)
    kw = dict(device=device, amp=amp, grad_accum=1, max_grad_norm=args.max_grad_norm, progress=False,
              non_blocking=opts["pin_memory"])
    engine.train_one_epoch(model, loader, optimizer, scheduler, max_steps=warmup, **kw)
    loader.clear()
    perf.sync(device)
    b0, t0, c0 = perf.cpu_busy_seconds(), time.perf_counter(), time.process_time()
    stats = engine.train_one_epoch(model, loader, optimizer, scheduler, max_steps=steps, **kw)
    seconds, cpu_s, b1 = time.perf_counter() - t0, time.process_time() - c0, perf.cpu_busy_seconds()
    res = window(seconds, cpu_s, loader.records[:steps], shape, peak, busy=(b0, b1))
    res["loop_meter_samples_per_s"] = stats.samples_per_s  # the loop's own meter, for reference
    res["amp"] = amp.mode
    res["threads"] = torch.get_num_threads()
    del model, optimizer
    return res


# --------------------------------------------------------------------------- measuring Hugging Face Trainer

class RecordingCollator:
    """Wraps the collator Trainer would use and remembers each batch's real lengths and padded width."""

    def __init__(self, inner):
        self.inner, self.records = inner, []

    def __call__(self, features):
        batch = self.inner(features)
        self.records.append((batch["attention_mask"].sum(1).tolist(), int(batch["attention_mask"].shape[1])))
        return batch


def hf_dataset(dataset: data.TokenizedDataset):
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
    return None


def run_trainer(template, hf_train, tokenizer, device, amp_mode, *, batch_size, warmup, steps, seed, lr, shape, peak) -> dict:
    from transformers import DataCollatorWithPadding, Trainer, TrainerCallback, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

    collator = RecordingCollator(DataCollatorWithPadding(tokenizer))  # Trainer's default collator with a tokenizer
    marks = {}

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step in (warmup, warmup + steps):
                perf.sync(device)
                marks[state.global_step] = (time.perf_counter(), time.process_time(), torch.get_num_threads(),
                                            perf.cpu_busy_seconds())

    model = copy.deepcopy(template)
    with tempfile.TemporaryDirectory() as tmp:
        targs = TrainingArguments(
            output_dir=tmp, per_device_train_batch_size=batch_size, max_steps=warmup + steps, learning_rate=lr,
            use_cpu=device.type == "cpu", bf16=amp_mode == "bf16", fp16=amp_mode == "fp16",
            report_to="none", save_strategy="no", disable_tqdm=True, seed=seed)
        trainer = Trainer(model=model, args=targs, train_dataset=hf_train, data_collator=collator, callbacks=[Clock()])
        trainer.remove_callback(PrinterCallback)  # only keeps its end-of-run log line out of our table
        out = trainer.train()
    (t0, c0, _, b0), (t1, c1, threads, b1) = marks[warmup], marks[warmup + steps]
    res = window(t1 - t0, c1 - c0, collator.records[warmup:warmup + steps], shape, peak, busy=(b0, b1))
    res["trainer_reported_samples_per_s"] = out.metrics.get("train_samples_per_second")  # whole run, setup included
    res["optimizer"] = str(targs.optim)
    res["amp"] = amp_mode
    res["threads"] = threads
    del trainer, model
    return res


# --------------------------------------------------------------------------- the compare section

def rotate(items: list, r: int) -> list:
    k = r % len(items)
    return items[k:] + items[:k]


def line(name: str, res: dict) -> str:
    tfl = res.get("model_tflops")
    return (f"  {name:34s} {perf.format_rate(res['samples_per_s'], res['tokens_per_s'], tfl, res.get('mfu'))}"
            f" | pad {100 * (res['padding_fraction'] or 0):.0f}% | cpu share {res['cpu_share']}"
            f" | others {res['foreign_cores'] if res['foreign_cores'] is None else round(res['foreign_cores'], 2)} cores")


def compare_section(plan, splits, device, args, log) -> dict:
    out = {}
    amp_default = engine.resolve_amp("auto", device)
    dtype = perf.matmul_dtype(amp_default.mode, device.type)
    for model_name, cfg in plan["compare"].items():
        if model_name not in args.models:
            continue
        template, tokenizer, desc = make_model(model_name, args.seed)
        shape = perf.model_shape(template)
        gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
        peak_for = lambda dt: args.peak_tflops or (perf.peak_tflops(gpu, dt) if gpu else None)  # noqa: E731
        texts, labels = splits.train_texts, splits.train_labels
        if plan["n_texts"]:
            texts, labels = texts[:plan["n_texts"]], labels[:plan["n_texts"]]
        ids = data.tokenize_texts(texts, tokenizer, args.max_length)
        dataset = data.TokenizedDataset(ids, labels)
        lengths = dataset.lengths
        log(f"\n== compare: {model_name} ({desc}; {shape.n_params / 1e6:.1f}M params, "
            f"{shape.n_nonembedding / 1e6:.2f}M non-embedding) | batch {cfg['batch_size']} | {cfg['warmup']} warm-up + "
            f"{cfg['steps']} timed steps | {cfg['rounds']} rounds | {torch.get_num_threads()} thread(s) | {device}")
        log(f"   {len(dataset)} texts, mean {sum(lengths) / len(lengths):.1f} tokens (max_length {args.max_length}); "
            f"FLOPs/token at the mean length: {perf.flops_per_token(shape, sum(lengths) / len(lengths)) / 1e6:.1f} M")

        contenders = {"ours": dict(kind="ours", flags=[], description="our loop, default fast path (CLI defaults)")}
        why_no_trainer = trainer_available()
        if why_no_trainer is None:
            contenders["hf_trainer"] = dict(kind="trainer", amp=amp_default.mode,
                                            description="transformers.Trainer, its defaults + DataCollatorWithPadding")
        else:
            log(f"   hf_trainer SKIPPED: {why_no_trainer}")
        skipped = {}
        for name, desc_, ok in ablation_flags(device, plan["ablations"].get(model_name, [])):
            if name == "--compile" and not args.compile:
                skipped[name] = "not run: pass --compile to include it (compiling takes minutes on a CPU)"
                continue
            if not ok:
                if name in ("--no-pin_memory", "--no-fused_adam") and device.type != "cuda":
                    skipped[name] = "CUDA-only option: it does nothing on a CPU"
                continue
            flags = [] if name.endswith("(proposed)") else name.split()
            contenders[name] = dict(kind="ours", flags=flags, description=desc_, proposed_fused_cpu=name.endswith("(proposed)"))
        if model_name == "distilbert-base" and "--amp bf16" in contenders and why_no_trainer is None and device.type == "cpu":
            contenders["hf_trainer --bf16"] = dict(kind="trainer", amp="bf16", description="Trainer with bf16=True")
        hf_train = hf_dataset(dataset) if "hf_trainer" in contenders else None

        results = {name: [] for name in contenders}
        names = list(contenders)
        gate = perf.QuietGate(args.quiet_cores, args.quiet_timeout, args.quiet_budget / 2 / len(plan["compare"]))
        for r in range(cfg["rounds"]):
            log(f"  round {r + 1}/{cfg['rounds']} (load average {perf.load_average()})")
            for name in rotate(names, r):
                c = contenders[name]
                quiet = gate.wait()
                common = dict(batch_size=cfg["batch_size"], warmup=cfg["warmup"], steps=cfg["steps"], seed=args.seed, shape=shape)
                if c["kind"] == "ours":
                    pa = parse_flags(c["flags"], cfg["batch_size"], args.max_length)
                    amp_mode = engine.resolve_amp(pa.amp, device).mode
                    res = run_ours(template, dataset, tokenizer, device, c["flags"], max_length=args.max_length,
                                   peak=peak_for(perf.matmul_dtype(amp_mode, device.type)),
                                   proposed_fused_cpu=c.get("proposed_fused_cpu", False), **common)
                else:
                    res = run_trainer(template, hf_train, tokenizer, device, c["amp"], lr=5e-5,
                                      peak=peak_for(perf.matmul_dtype(c["amp"], device.type)), **common)
                res["waited_for_quiet"] = quiet
                results[name].append(res)
                log(line(name, res))
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()

        section = {"model": model_name, "model_description": desc, "shape": perf.as_jsonable(shape),
                   "settings": {**cfg, "max_length": args.max_length, "threads": torch.get_num_threads(),
                                "amp_default": amp_default.mode, "matmul_dtype_default": dtype, "device": str(device),
                                "lr": 5e-5},
                   "texts": len(dataset), "mean_tokens": sum(lengths) / len(lengths), "contenders": {}, "skipped": skipped}
        for name, rs in results.items():
            section["contenders"][name] = {
                **{k: v for k, v in contenders[name].items() if k != "kind"}, "kind": contenders[name]["kind"],
                "samples_per_s": perf.summary(r["samples_per_s"] for r in rs),
                "tokens_per_s": perf.summary(r["tokens_per_s"] for r in rs),
                "samples_per_cpu_s": perf.summary(r["samples_per_cpu_s"] for r in rs),
                "model_tflops": perf.summary(r["model_tflops"] for r in rs),
                "mfu": perf.summary(r["mfu"] for r in rs) if any(r["mfu"] for r in rs) else None,
                "padding_fraction": perf.summary(r["padding_fraction"] for r in rs),
                "cpu_share": perf.summary(r["cpu_share"] for r in rs),
                "foreign_cores": perf.summary(r["foreign_cores"] for r in rs),
                "rounds": rs,
            }
        section["ratios"] = paired_ratios(results, "ours", [n for n in results if n != "ours"])
        if "hf_trainer --bf16" in results and "--amp bf16" in results:
            section["ratios"]["ours --amp bf16 / hf_trainer --bf16"] = paired(results["--amp bf16"], results["hf_trainer --bf16"])
        out[model_name] = section
        log(summary_lines(model_name, section))
        del template
        gc.collect()
    return out


CLEAN_CORES = 0.25  # a window is "clean" when other processes used at most this many cores during it


def paired(a: list, b: list, key: str = "samples_per_s") -> dict:
    """a/b round by round. 'clean' keeps the rounds where neither window shared the CPU with other processes."""
    per_round = [x[key] / y[key] for x, y in zip(a, b) if x.get(key) and y.get(key)]
    clean = [x[key] / y[key] for x, y in zip(a, b) if x.get(key) and y.get(key)
             and _clean(x) and _clean(y)]
    med_a = perf.summary(x.get(key) for x in a)["median"]
    med_b = perf.summary(y.get(key) for y in b)["median"]
    return {"median_of_rounds": perf.summary(per_round)["median"], "ratio_of_medians": perf.ratio(med_a, med_b),
            "per_round": per_round, "metric": key,
            "clean_rounds": len(clean), "median_of_clean_rounds": perf.summary(clean)["median"] if clean else None}


def _clean(res: dict) -> bool:
    f = res.get("foreign_cores")
    return f is not None and f <= CLEAN_CORES


def paired_ratios(results: dict, base: str, others: list) -> dict:
    """ours / X for every other contender X: >1 means ours is faster than X (what that option buys).
    Wall-clock samples/s is the figure; the per-CPU-second ratio is the cross-check that neighbours' load
    on a shared CPU cannot move (single-thread contenders)."""
    out = {}
    for o in others:
        out[f"{base} / {o}"] = paired(results[base], results[o])
        out[f"{base} / {o}"]["per_cpu_second"] = paired(results[base], results[o], "samples_per_cpu_s")
    return out


def summary_lines(model_name: str, section: dict) -> str:
    rows = [f"  -- {model_name}: medians over rounds (ratio = ours / other, median of per-round ratios)"]
    for name, c in section["contenders"].items():
        s, t = c["samples_per_s"]["median"], c["tokens_per_s"]["median"]
        mfu = c["mfu"]["median"] if c["mfu"] else None
        rr = section["ratios"].get(f"ours / {name}", {})
        r, rc = rr.get("median_of_rounds"), rr.get("per_cpu_second", {}).get("median_of_rounds")
        rows.append(f"     {name:34s} {perf.format_rate(s, t, c['model_tflops']['median'], mfu)}"
                    + (f" | ours is {r:.2f}x (per CPU-s {rc:.2f}x)" if r and rc else ""))
    for key, rr in section["ratios"].items():
        if not key.startswith("ours / "):
            rows.append(f"     {key}: {rr['median_of_rounds']:.2f}x")
    return "\n".join(rows)


# --------------------------------------------------------------------------- the DDP section (parent side)

def ddp_configs(plan: dict, nproc: int, device_type: str) -> list:
    """Contenders of the DDP launch. world=1 'bare' is the 1-process baseline (no DDP wrapper, like train_single.py)."""
    worlds = sorted({1, nproc} | {2 ** i for i in range(1, 8) if 2 ** i < nproc})
    out = []
    for gi, g in enumerate(plan["global_batches"]):
        steps = plan["steps"][gi] if isinstance(plan["steps"], (list, tuple)) else plan["steps"]
        for w in worlds:
            out.append(dict(name=f"G{g} x{w}" + ("" if w > 1 else " (no DDP)"), world=w, ddp=w > 1, global_batch=g,
                            batch_per_rank=g // w, steps=steps, warmup=plan["warmup"], bucket_cap_mb=25.0,
                            gradient_as_bucket_view=True, fused_cpu=False))
        if gi == 0 and plan.get("ddp1"):
            out.append(dict(out[0], name=f"G{g} x1 (DDP wrapper)", ddp=True))
        if plan.get("knobs"):
            base = next(c for c in out if c["global_batch"] == g and c["world"] == nproc)
            if gi == 0:
                out.append(dict(base, name=f"G{g} x{nproc} --bucket_cap_mb 1", bucket_cap_mb=1.0))
                out.append(dict(base, name=f"G{g} x{nproc} --no-gradient_as_bucket_view", gradient_as_bucket_view=False))
            if device_type == "cpu" and not engine_fuses_adamw_on_cpu():
                one = next(c for c in out if c["global_batch"] == g and c["world"] == 1 and not c["ddp"])
                out.append(dict(one, name=f"G{g} x1 (no DDP) fused AdamW (proposed)", fused_cpu=True))
                out.append(dict(base, name=f"G{g} x{nproc} fused AdamW (proposed)", fused_cpu=True))
    return out


class original_cuda_devices:
    """Child processes started inside this block see every GPU this script was given (not just the first)."""

    def __enter__(self):
        self.saved = os.environ.get("CUDA_VISIBLE_DEVICES")
        if ORIGINAL_CUDA_VISIBLE_DEVICES is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = ORIGINAL_CUDA_VISIBLE_DEVICES

    def __exit__(self, *exc):
        if self.saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = self.saved


def all_gpu_count() -> int:
    """GPUs this script was given (this process itself sees only the first)."""
    if not torch.cuda.is_available():
        return 0
    import subprocess

    with original_cuda_devices():
        out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                             capture_output=True, text=True, timeout=120, env=dict(os.environ))
    return int(out.stdout.strip() or 1)


def ddp_section(plan, args, data_arg: str, device_type: str, log) -> dict:
    from distrinews_lib import launch

    nproc = args.ddp_nproc or (all_gpu_count() or 2)
    configs = ddp_configs(plan, nproc, device_type)
    with tempfile.TemporaryDirectory() as tmp:
        spec = dict(model=plan["model"], data=data_arg, max_length=args.max_length, threads=1, seed=args.seed,
                    quiet_cores=args.quiet_cores, quiet_timeout=args.quiet_timeout, quiet_budget=args.quiet_budget / 2,
                    rounds=plan["rounds"], configs=configs, n_texts=args.n_texts_override, out=str(Path(tmp) / "ddp.json"))
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        log(f"\n== ddp: 1 vs {nproc} processes, {'gloo, 1 thread each' if device_type == 'cpu' else 'nccl, 1 GPU each'}; "
            f"{len(configs)} contenders x {plan['rounds']} rounds in one torchrun launch")
        t = time.time()
        with original_cuda_devices():
            res = launch.torchrun(Path(__file__), nproc, ["--ddp-worker", str(spec_path)], timeout=args.ddp_timeout,
                                  echo=True, cpu_threads=1, env={"OMP_NUM_THREADS": "1"} if device_type == "cpu" else None)
        raw = json.loads(Path(spec["out"]).read_text())
    raw["launch_seconds"] = round(time.time() - t, 1)
    raw["launch_command"] = " ".join(res.command[:-1] + ["<spec.json>"])
    raw["nproc"] = nproc
    return summarize_ddp(raw, nproc, log)


def summarize_ddp(raw: dict, nproc: int, log) -> dict:
    by_name = {}
    for rec in raw["results"]:
        by_name.setdefault(rec["name"], []).append(rec)
    configs = {c["name"]: c for c in raw["configs"]}
    out = {"settings": {k: v for k, v in raw.items() if k not in ("results", "configs")}, "contenders": {}, "scaling": [],
           "knobs": {}}
    for name, rs in by_name.items():
        out["contenders"][name] = {"config": configs[name], "samples_per_s": perf.summary(r["samples_per_s"] for r in rs),
                                   "tokens_per_s": perf.summary(r["tokens_per_s"] for r in rs),
                                   "mfu": perf.summary(r["mfu"] for r in rs) if any(r.get("mfu") for r in rs) else None,
                                   "foreign_cores": perf.summary(r["foreign_cores"] for r in rs),
                                   "rounds": rs}
    log("  -- ddp: medians over rounds; speedup = N-process / 1-process (no DDP) samples/s on the same global batch")
    for name, c in out["contenders"].items():
        s = c["samples_per_s"]["median"]
        log(f"     {name:48s} {s:9.1f} samples/s")
    for g in sorted({c["global_batch"] for c in configs.values()}):
        for fused in (False, True):
            base = next((n for n, c in configs.items() if c["global_batch"] == g and c["world"] == 1 and not c["ddp"]
                         and c["fused_cpu"] == fused), None)
            if base is None:
                continue
            for n, c in configs.items():
                if c["global_batch"] != g or c["world"] == 1 or c["fused_cpu"] != fused or c["bucket_cap_mb"] != 25.0 \
                        or not c["gradient_as_bucket_view"]:
                    continue
                p = paired(by_name[n], by_name[base])
                pc = paired(by_name[n], by_name[base], "samples_per_cpu_s")
                pdc = paired(by_name[n], by_name[base], "samples_per_s_dedicated_estimate")
                sp, spc = p["median_of_rounds"], p["median_of_clean_rounds"]
                row = {"global_batch": g, "processes": c["world"], "batch_per_rank": c["batch_per_rank"], "contender": n,
                       "baseline": base, "speedup": sp, "speedup_ratio_of_medians": p["ratio_of_medians"],
                       "efficiency": sp / c["world"] if sp else None, "per_round": p["per_round"],
                       "clean_rounds": p["clean_rounds"], "speedup_clean_rounds": spc,
                       "efficiency_clean_rounds": spc / c["world"] if spc else None,
                       # samples per CPU-second of the average rank: no waiting, no neighbours; an upper bound
                       "speedup_cpu_time_upper_bound": pc["median_of_rounds"],
                       # per step, the slowest rank's CPU time: waits for a slower rank count, neighbours do not
                       "speedup_dedicated_core_estimate": pdc["median_of_rounds"],
                       "fused_adamw_cpu_proposed": fused}
                out["scaling"].append(row)
                log(f"     speedup {n!r} vs {base!r}: {sp:.2f}x, efficiency {100 * sp / c['world']:.0f}% | "
                    f"clean rounds ({p['clean_rounds']}): {spc if spc is None else round(spc, 2)} | "
                    f"dedicated-core estimate {pdc['median_of_rounds']:.2f}x | CPU-time upper bound {pc['median_of_rounds']:.2f}x")
    for n, c in configs.items():
        if "--" in n or "DDP wrapper" in n:
            ref = next(m for m, d in configs.items() if d["global_batch"] == c["global_batch"] and d["world"] == c["world"]
                       and not d["fused_cpu"] and d["bucket_cap_mb"] == 25.0 and d["gradient_as_bucket_view"]
                       and ("DDP wrapper" not in m) and d["ddp"] == (c["world"] > 1))
            p = paired(by_name[n], by_name[ref])
            out["knobs"][n] = {"vs": ref, "ratio": p["median_of_rounds"], "per_round": p["per_round"],
                               "clean_rounds": p["clean_rounds"], "ratio_clean_rounds": p["median_of_clean_rounds"],
                               "ratio_cpu_time": paired(by_name[n], by_name[ref], "samples_per_cpu_s")["median_of_rounds"],
                               "ratio_dedicated_core_estimate": paired(by_name[n], by_name[ref],
                                                                       "samples_per_s_dedicated_estimate")["median_of_rounds"]}
            log(f"     knob {n!r} / {ref!r}: {p['median_of_rounds']:.3f}x (clean rounds: {p['median_of_clean_rounds']}; "
                f"dedicated-core estimate {out['knobs'][n]['ratio_dedicated_core_estimate']:.3f}x)")
    return out


# --------------------------------------------------------------------------- the DDP worker (runs under torchrun)

def ddp_worker(spec_path: str) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import RandomSampler
    from torch.utils.data.distributed import DistributedSampler
    from datetime import timedelta

    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(spec["threads"])
    D.ensure_torchrun_env()
    rank, local_rank, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    backend, why = D.choose_backend("auto")
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=900))
    try:
        device = D.device_for(backend, local_rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        splits, _, _ = resolve_data(spec["data"])
        template, tokenizer, _ = make_model(spec["model"], spec["seed"])
        shape = perf.model_shape(template)
        texts, labels = splits.train_texts, splits.train_labels
        if spec.get("n_texts"):
            texts, labels = texts[:spec["n_texts"]], labels[:spec["n_texts"]]
        ids = data.tokenize_texts(texts, tokenizer, spec["max_length"])
        dataset = data.TokenizedDataset(ids, labels)
        gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
        groups = {w: dist.new_group(list(range(w))) for w in sorted({c["world"] for c in spec["configs"]}) if w < world}
        groups[world] = None  # the default group
        gate = perf.QuietGate(spec["quiet_cores"], spec["quiet_timeout"], spec["quiet_budget"])
        idle_model = torch.nn.Linear(1, 1)
        idle_opt = torch.optim.SGD(idle_model.parameters(), lr=0.0)
        results = []
        D.print0(f"   worker: {world} ranks | {why} | {torch.get_num_threads()} thread(s) each | {len(dataset)} texts")
        for r in range(spec["rounds"]):
            D.print0(f"  round {r + 1}/{spec['rounds']} (load average {perf.load_average()})")
            for cfg in rotate(spec["configs"], r):
                active = rank < cfg["world"]
                args = parse_flags([], cfg["batch_per_rank"], spec["max_length"], ddp=True)
                amp = engine.resolve_amp(args.amp, device)
                if active:
                    torch.manual_seed(spec["seed"])
                    model = copy.deepcopy(template).to(device)
                    if cfg["ddp"]:
                        model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None,
                                    process_group=groups[cfg["world"]], bucket_cap_mb=cfg["bucket_cap_mb"],
                                    gradient_as_bucket_view=cfg["gradient_as_bucket_view"])
                        sampler = DistributedSampler(dataset, num_replicas=cfg["world"], rank=rank, shuffle=True, seed=spec["seed"])
                    else:
                        sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(spec["seed"]))
                    opts = recipe.loader_options(args, tokenizer, device)
                    loader = RecordingLoader(data.make_loader(dataset, cfg["batch_per_rank"], sampler, seed=spec["seed"],
                                                              group_by_length=args.group_by_length, **opts))
                    optimizer = build_optimizer(model, args, cfg["fused_cpu"] and device.type == "cpu")
                    nb = opts["pin_memory"]
                else:  # this rank sits the contender out, but joins the loop's end-of-epoch collectives
                    model, loader, optimizer, nb = idle_model, RecordingLoader([]), idle_opt, False
                kw = dict(device=device, amp=amp if active else engine.resolve_amp("off", device),
                          grad_accum=1, max_grad_norm=args.max_grad_norm, progress=False, non_blocking=nb)
                engine.train_one_epoch(model, loader, optimizer, None, max_steps=cfg["warmup"], **kw)
                loader.clear()
                dist.barrier()
                quiet = gate.wait() if rank == 0 else None
                dist.barrier()
                b0, t0, c0 = perf.cpu_busy_seconds(), time.perf_counter(), time.process_time()
                engine.train_one_epoch(model, loader, optimizer, None, max_steps=cfg["steps"], **kw)
                seconds, cpu_s, b1 = time.perf_counter() - t0, time.process_time() - c0, perf.cpu_busy_seconds()
                # every rank's lengths, so the counts and FLOPs cover all of them
                recs = loader.records[:cfg["steps"]] if active else []
                mine = window(seconds, cpu_s, recs, shape, None) if recs else None
                vec = torch.tensor([mine["samples"] if mine else 0, mine["tokens"] if mine else 0,
                                    mine["padded_tokens"] if mine else 0,
                                    perf.training_flops(shape, [n for rec, _ in recs for n in rec]) if recs else 0.0,
                                    cpu_s if active else 0.0, 0.0 if active else cpu_s], dtype=torch.float64)
                tot = D.all_reduce_sum(vec.to(device) if backend == "nccl" else vec).cpu().tolist()
                # Each step's CPU time on every rank. With a core per rank and nobody else on it, a DDP step
                # lasts about as long as its slowest rank's step: sum over steps of the max over ranks is a
                # dedicated-core estimate of the window that the neighbours' load cannot inflate.
                marks = loader.cpu_marks[:cfg["steps"] + 1] if active else []
                per_step = torch.zeros(cfg["steps"], dtype=torch.float64)
                if len(marks) > 1:
                    d = torch.tensor(marks, dtype=torch.float64).diff()
                    per_step[:d.numel()] = d
                gathered = [torch.zeros_like(per_step) for _ in range(world)]
                if backend == "nccl":
                    g_dev = [t.to(device) for t in gathered]
                    dist.all_gather(g_dev, per_step.to(device))
                    gathered = [t.cpu() for t in g_dev]
                else:
                    dist.all_gather(gathered, per_step)
                dedicated_s = float(torch.stack(gathered[:cfg["world"]]).max(0).values.sum())
                if rank == 0:
                    peak = perf.peak_tflops(gpu, perf.matmul_dtype(amp.mode, device.type)) if gpu else None
                    res = {"name": cfg["name"], "round": r, "world": cfg["world"], "seconds": seconds,
                           "samples": int(tot[0]), "tokens": int(tot[1]), "padded_tokens": int(tot[2]),
                           "samples_per_s": tot[0] / seconds, "tokens_per_s": tot[1] / seconds,
                           "model_tflops": tot[3] / seconds / 1e12,
                           "mfu": perf.mfu(tot[3] / seconds, peak, cfg["world"]),
                           "cpu_share_per_rank": round(tot[4] / seconds / cfg["world"], 3),
                           "idle_ranks_cpu_s": round(tot[5], 4),
                           "foreign_cores": perf.foreign_cores(b0, b1, tot[4] + tot[5], seconds),
                           "samples_per_cpu_s": tot[0] / tot[4] * cfg["world"] if tot[4] else None,
                           "dedicated_core_estimate_s": dedicated_s,
                           "samples_per_s_dedicated_estimate": tot[0] / dedicated_s if dedicated_s > 0 else None,
                           "waited_for_quiet": quiet, "load_average": perf.load_average()}
                    results.append(res)
                    print(f"  {cfg['name']:48s} {perf.format_rate(res['samples_per_s'], res['tokens_per_s'], res['model_tflops'], res['mfu'])}"
                          f" | cpu share/rank {res['cpu_share_per_rank']} | others {res['foreign_cores']:.2f} cores", flush=True)
                del model, optimizer, loader
                gc.collect()
        if rank == 0:
            Path(spec["out"]).write_text(json.dumps({"backend": backend, "backend_reason": why, "world_size": world,
                                                     "threads_per_rank": spec["threads"], "texts": len(dataset),
                                                     "model": spec["model"], "configs": spec["configs"],
                                                     "rounds": spec["rounds"], "results": results}))
        dist.barrier()
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------- end to end through scripts/train_ddp.py

def script_section(plan, args, data_arg, log) -> dict:
    """1 vs 2 processes through the course's own script (separate launches, so noisier than the ddp section)."""
    from distrinews_lib import launch

    out = {"runs": [], "note": "separate torchrun launches of scripts/train_ddp.py; epoch 2 (after a warm-up epoch) timed "
                               "by the loop's own meter; same global batch and steps"}
    with tempfile.TemporaryDirectory() as tmp:
        for nproc in (1, 2) * plan["pairs"]:
            bs = plan["batch_per_rank"] * 2 // nproc
            run_dir = Path(tmp) / f"n{nproc}_{len(out['runs'])}"
            cmd_args = ["--config", "cpu_smoke", "--model", plan["model"], "--data", data_arg, "--num_samples", "100000",
                        "--eval_samples", "64", "--epochs", "2", "--max_steps", str(plan["max_steps"]), "--batch_size",
                        str(bs), "--max_length", str(args.max_length), "--threads", "1", "--no-progress", "--amp", "off",
                        "--output", str(run_dir), "--checkpoint", str(run_dir / "ck.pt")]
            t = time.time()
            res = launch.torchrun(REPO / "scripts" / "train_ddp.py", nproc, cmd_args, echo=False, cpu_threads=1,
                                  timeout=600, cwd=REPO)
            m = json.loads((run_dir / "metrics.json").read_text())
            sps = m["epochs"][-1]["samples_per_s"]
            out["runs"].append({"nproc": nproc, "batch_per_rank": bs, "samples_per_s_epoch2": sps, "wall_s": round(time.time() - t, 1),
                                "command": " ".join(res.command), "load_average": perf.load_average()})
            log(f"  train_ddp.py x{nproc} (batch {bs}/rank): epoch 2 {sps:.1f} samples/s")
    one = [r["samples_per_s_epoch2"] for r in out["runs"] if r["nproc"] == 1]
    two = [r["samples_per_s_epoch2"] for r in out["runs"] if r["nproc"] == 2]
    pairs = [b / a for a, b in zip(one, two)]
    out["speedup_per_pair"] = pairs
    out["speedup"] = perf.summary(pairs)["median"]
    out["efficiency"] = out["speedup"] / 2 if out["speedup"] else None
    log(f"  course script: 2-process speedup {out['speedup']:.2f}x (pairs {', '.join(f'{p:.2f}' for p in pairs)})")
    return out


# --------------------------------------------------------------------------- plots

def plot(result: dict, base: Path) -> list:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    comp = result.get("compare") or {}
    if comp:
        fig, axes = plt.subplots(1, len(comp), figsize=(7 * len(comp), 4.8), squeeze=False)
        for ax, (model_name, sec) in zip(axes[0], comp.items()):
            names = list(sec["contenders"])[::-1]
            vals = [sec["contenders"][n]["samples_per_s"]["median"] for n in names]
            cpu = [sec["contenders"][n]["samples_per_cpu_s"]["median"] or 0 for n in names]
            colors = ["tab:green" if n == "ours" else "tab:red" if n.startswith("hf_trainer") else "tab:gray" for n in names]
            y = list(range(len(names)))
            ax.barh([i + 0.2 for i in y], vals, height=0.4, color=colors, label="samples/s (wall clock)")
            ax.barh([i - 0.2 for i in y], cpu, height=0.4, color=colors, alpha=0.45, hatch="//",
                    label="samples per CPU-second (neighbours' load removed)")
            for i, (v, c) in enumerate(zip(vals, cpu)):
                ax.text(v, i + 0.2, f" {v:.{0 if v >= 10 else 1}f}", va="center", fontsize=7)
                ax.text(c, i - 0.2, f" {c:.{0 if c >= 10 else 1}f}", va="center", fontsize=7, alpha=0.7)
            ax.set_yticks(y, names)
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)
            ax.set_xlabel("median over rounds")
            ax.set_title(f"{model_name}: our loop vs Trainer and fast-path options off", fontsize=10)
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
        if n == 2:  # 1 vs 2 processes: bars per global batch
            groups = sorted({r["global_batch"] for r in rows})
            kinds = [("measured", False, "speedup"), ("dedicated-core estimate", False, "speedup_dedicated_core_estimate"),
                     ("measured, fused AdamW (proposed)", True, "speedup"),
                     ("estimate, fused AdamW (proposed)", True, "speedup_dedicated_core_estimate")]
            width = 0.8 / len(kinds)
            for k, (label, fused, key) in enumerate(kinds):
                xs, ys = [], []
                for gi, g in enumerate(groups):
                    r = next((r for r in rows if r["global_batch"] == g and r["fused_adamw_cpu_proposed"] == fused), None)
                    if r and r.get(key):
                        xs.append(gi + (k - (len(kinds) - 1) / 2) * width)
                        ys.append(r[key])
                bars = ax.bar(xs, ys, width, label=label, color=["tab:blue", "tab:blue", "tab:orange", "tab:orange"][k],
                              alpha=1.0 if key == "speedup" else 0.45, hatch=None if key == "speedup" else "//")
                ax.bar_label(bars, fmt="%.2f", fontsize=7)
            ax.set_xticks(range(len(groups)), [f"global batch {g}\n({g // 2} per process)" for g in groups])
            ax.axhline(2.0, color="k", ls="--", lw=1, label="ideal (2x)")
            target = (result.get("targets") or {}).get("cpu_tiny_ddp2_speedup")
            if target:
                ax.axhline(1.85, color="tab:red", ls=":", lw=1, label="target 1.85x")
            ax.set_ylabel("2 processes vs 1 (same global work)")
            ax.set_ylim(0, 2.3)
        else:  # 1..N GPUs
            for g in sorted({r["global_batch"] for r in rows}):
                rs = sorted((r for r in rows if r["global_batch"] == g and not r["fused_adamw_cpu_proposed"]),
                            key=lambda r: r["processes"])
                ax.plot([1] + [r["processes"] for r in rs], [1] + [r["speedup"] for r in rs], "o-", label=f"global batch {g}")
            ax.plot([1, n], [1, n], "k--", lw=1, label="ideal")
            ax.set_xlabel("processes")
            ax.set_ylabel("speedup vs 1 process (same global work)")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
        ax.set_title(f"DDP scaling, {ddp['settings'].get('backend')}, {result['ddp']['settings'].get('model', '')} model | "
                     f"{result['machine']}", fontsize=10)
        fig.tight_layout()
        path = base.with_name(base.stem + "_ddp.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(path)
    return files


# --------------------------------------------------------------------------- main

def targets(result: dict) -> dict:
    out = {}
    tiny = (result.get("compare") or {}).get("tiny")
    cpu = result["settings"]["device"] == "cpu"
    if tiny and cpu:
        r = tiny["ratios"].get("ours / hf_trainer", {}).get("median_of_rounds")
        rc = tiny["ratios"].get("ours / hf_trainer", {}).get("per_cpu_second", {}).get("median_of_rounds")
        out["cpu_tiny_ours_vs_trainer"] = {"target": ">= 1.3x", "value": r, "met": bool(r and r >= 1.3),
                                           "value_per_cpu_second": rc}
    rows = [r for r in (result.get("ddp") or {}).get("scaling", []) if r["processes"] == 2]
    if rows and cpu:
        default = [r for r in rows if not r["fused_adamw_cpu_proposed"]]
        best = max(default, key=lambda r: r["speedup"] or 0)
        first = default[0]
        out["cpu_tiny_ddp2_speedup"] = {"target": ">= 1.85x", "value_default_batch": first["speedup"],
                                        "default_global_batch": first["global_batch"], "best_value": best["speedup"],
                                        "best_global_batch": best["global_batch"],
                                        "met": bool(first["speedup"] and first["speedup"] >= 1.85),
                                        "met_at_best": bool(best["speedup"] and best["speedup"] >= 1.85),
                                        # not the measured figure: what the per-step CPU times say 2 dedicated cores
                                        # would give (see ddp.scaling); shown because the CPU here is shared
                                        "dedicated_core_estimate_by_global_batch": {
                                            r["global_batch"]: r.get("speedup_dedicated_core_estimate") for r in default},
                                        "others_cpu_use_median_cores": perf.summary(
                                            x.get("foreign_cores") for c in result["ddp"]["contenders"].values()
                                            for x in c["rounds"])["median"]}
        proposed = [r for r in rows if r["fused_adamw_cpu_proposed"]]
        if proposed:
            out["cpu_tiny_ddp2_speedup_with_proposed_fused_adamw"] = {r["global_batch"]: r["speedup"] for r in proposed}
    if not result.get("gpu"):
        out["gpu"] = "not measured: no CUDA GPU on this machine (the CUDA path - AMP, fused AdamW, pinned memory, MFU, nccl - runs where one is)"
    return out


def headline(result: dict) -> dict:
    """The figures a reader wants first, flattened (derived from the measured figures in the same file)."""
    out = {}
    for model, sec in (result.get("compare") or {}).items():
        m = model.replace("-", "_")
        for name, key in (("ours", "ours"), ("hf_trainer", "trainer")):
            c = sec["contenders"].get(name)
            if c:
                out[f"{m}_{key}_samples_per_s"] = c["samples_per_s"]["median"]
                out[f"{m}_{key}_tokens_per_s"] = c["tokens_per_s"]["median"]
                if c.get("mfu"):
                    out[f"{m}_{key}_mfu"] = c["mfu"]["median"]
        r = sec["ratios"].get("ours / hf_trainer")
        if r:
            out[f"{m}_ours_vs_trainer_speedup"] = r["median_of_rounds"]
            out[f"{m}_ours_vs_trainer_speedup_per_cpu_second"] = r["per_cpu_second"]["median_of_rounds"]
        for key, r in sec["ratios"].items():
            if key.startswith("ours / ") and key != "ours / hf_trainer" and not key.startswith("ours / hf_"):
                flag = key[len("ours / "):]
                out[f"{m}_option_{flag}_ours_over_it"] = r["median_of_rounds"]
    for row in (result.get("ddp") or {}).get("scaling", []):
        k = f"ddp{row['processes']}_global_batch{row['global_batch']}" + ("_fused_adamw_proposed" if row["fused_adamw_cpu_proposed"] else "")
        out[f"{k}_speedup"] = row["speedup"]
        out[f"{k}_efficiency"] = row["efficiency"]
        if row.get("speedup_dedicated_core_estimate"):
            out[f"{k}_speedup_dedicated_core_estimate"] = row["speedup_dedicated_core_estimate"]
    sc = result.get("script_check")
    if sc and sc.get("speedup"):
        out["ddp2_course_script_speedup"] = sc["speedup"]
    return out


def ordered(result: dict) -> dict:
    """Provenance first, then the headline, then everything else (readers and notebooks scan from the top)."""
    first = ("benchmark", "machine", "cpu", "gpu", "command", "git_commit", "git_dirty", "started", "versions", "headline", "targets")
    return {**{k: result[k] for k in first if k in result}, **{k: v for k, v in result.items() if k not in first}}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a few tiny steps of every section (CI)")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated: tiny, distilbert-base")
    p.add_argument("--sections", default="compare,ddp,script", help="comma-separated: compare, ddp, script")
    p.add_argument("--data", default="auto", help="auto ($DISTRINEWS_DATA_DIR, ../shared/data/ag_news, else synthetic), a folder, or synthetic")
    p.add_argument("--threads", type=int, default=1, help="torch threads for the in-process contenders (1: robust on a shared CPU)")
    p.add_argument("--max_length", type=int, default=128)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--compile", action="store_true", help="include the torch.compile contender (slow to compile on a CPU)")
    p.add_argument("--ddp_nproc", type=int, default=None, help="processes for the scaling run (default: GPUs, or 2)")
    p.add_argument("--ddp_timeout", type=float, default=900)
    p.add_argument("--quiet_timeout", type=float, default=None,
                   help="before each timed window wait up to this many seconds for other processes to leave the CPU "
                        "(default: 4 on a CPU, 0 on a GPU or with --quick)")
    p.add_argument("--quiet_budget", type=float, default=60, help="at most this many seconds of such waiting in all")
    p.add_argument("--quiet_cores", type=float, default=0.3, help="'quiet' = others use at most this many cores")
    p.add_argument("--peak_tflops", type=float, default=None, help="the device's peak for MFU when it is not in perf.PEAK_TFLOPS")
    p.add_argument("--out", default=None, help="JSON path (default: benchmarks/train_<machine>.json; --quick: outputs/bench/...)")
    p.add_argument("--no-plots", dest="plots", action="store_false")
    p.add_argument("--refresh", default=None, metavar="JSON",
                   help="no measuring: redraw the plots and recompute the derived summaries (headline, targets) of a result file")
    p.add_argument("--ddp-worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.ddp_worker:
        return ddp_worker(args.ddp_worker)
    if args.refresh:
        path = Path(args.refresh)
        result = json.loads(path.read_text())
        result["targets"] = targets(result)
        result["headline"] = headline(result)
        result["refreshed"] = {"command": " ".join(["python", *sys.argv]), "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                               "what": "plots, headline and targets recomputed from this file's measured figures"}
        path.write_text(json.dumps(perf.as_jsonable(ordered(result)), indent=1))
        for f in plot(result, path.with_suffix(".png")):
            print(f"wrote {f}")
        return result

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    sections = {s.strip() for s in args.sections.split(",")}
    plan = full_plan(args.quick, torch.cuda.is_available())
    if args.quiet_timeout is None:
        args.quiet_timeout = 0.0 if args.quick or torch.cuda.is_available() else 4.0
    args.n_texts_override = plan["n_texts"]
    device = engine.pick_device("auto")
    slug = perf.machine_slug()
    out_path = Path(args.out) if args.out else (REPO / "outputs" / "bench" / f"train_{slug}_quick.json" if args.quick
                                                else REPO / "benchmarks" / f"train_{slug}.json")
    started = time.time()
    result = {"benchmark": "train", **perf.provenance(), "quick": args.quick,
              "settings": {"device": str(device), "threads": args.threads, "max_length": args.max_length, "seed": args.seed,
                           "plan": plan, "models": args.models, "sections": sorted(sections)}}
    log = lambda s: print(s, flush=True)  # noqa: E731
    log(f"bench_train: {result['machine']} | {device} | torch {torch.__version__} | git {result['git_commit']} | "
        f"load average {perf.load_average()}")
    splits, data_arg, data_note = resolve_data(args.data)
    result["data"] = {"source": splits.source, "detail": splits.detail, "is_synthetic": splits.is_synthetic,
                      "train_texts": len(splits.train_texts), "note": data_note}
    log(data_note)
    if "compare" in sections:
        result["compare"] = compare_section(plan, splits, device, args, log)
    if "ddp" in sections:
        result["ddp"] = ddp_section(plan["ddp"], args, data_arg, device.type, log)
    if "script" in sections and plan["script"] and device.type == "cpu":
        log("\n== script: 1 vs 2 processes through scripts/train_ddp.py")
        result["script_check"] = script_section(plan["script"], args, data_arg, log)
    result["targets"] = targets(result)
    result["headline"] = headline(result)
    result["seconds_total"] = round(time.time() - started, 1)
    result["load_average_at_end"] = perf.load_average()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if args.plots:
        result["plots"] = [str(f.relative_to(REPO)) if f.is_relative_to(REPO) else str(f)
                           for f in plot(result, out_path.with_suffix(".png"))]
    out_path.write_text(json.dumps(perf.as_jsonable(ordered(result)), indent=1))
    log(f"\nheadline: {json.dumps(result['headline'], indent=1)}")
    log(f"targets: {json.dumps(result['targets'], indent=1)}")
    log(f"wrote {out_path} in {result['seconds_total']:.0f} s")
    return result


if __name__ == "__main__":
    main()
