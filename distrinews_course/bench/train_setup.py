"""bench_train's settings, data and models, and the command lines its contenders run: the plan of each section
(steps, batches, rounds), the fast-path options to switch off one at a time, --data and --model as the course's
scripts get them. scripts/bench_train.py is the entry point; its docstring says what is measured and why."""

from __future__ import annotations

from pathlib import Path

import torch

from distrinews_lib.data import sources, texts
from distrinews_lib.data.tokenization import tiny_tokenizer
from distrinews_lib.errors import UserError
from distrinews_lib.training import config, optim, precision

# transformers, datasets, accelerate and matplotlib are imported where they are used: optional here (only the
# Trainer contenders, DistilBERT-base and the plots need them) and slow to import.

MODELS = ("tiny", "distilbert-base")
TRAINER_MEGABATCH = 50  # transformers' LengthGroupedSampler: megabatches of up to 50 batches
EVAL_SAMPLES = 16  # the scripts evaluate after their epoch; keep that short (it is not timed)


def full_plan(quick: bool, cuda: bool = False) -> dict:
    """Steps, batches and rounds per section. Chosen so the full run takes ~10 min on 2 shared CPU cores
    (on a GPU: more steps, larger batches, and DistilBERT-base for the scaling run, where it means something).
    warmup/steps that are multiples of 50 give whole Trainer megabatches (see scripts/bench_train.py's
    docstring)."""
    if cuda and not quick:
        return {
            "compare": {
                "tiny": dict(batch_size=32, warmup=50, steps=100, rounds=5),
                "distilbert-base": dict(batch_size=32, warmup=50, steps=100, rounds=5),
            },
            # DistilBERT-base: the compiled modes only (issue 41 measured the other options on an H200; every
            # compiled window compiles afresh, global_state resets the caches, and a lent GPU has ~10 minutes)
            "ablations": {"tiny": "all", "distilbert-base": ["--compile", "--compile_mode reduce-overhead"]},
            "ddp": dict(
                model="distilbert-base", global_batches=[64, 256], knobs=True, warmup=10, steps=(40, 20), rounds=3
            ),
        }
    if quick:
        return {
            "compare": {"tiny": dict(batch_size=16, warmup=1, steps=3, rounds=1)},
            "ablations": {"tiny": ["--no-group_by_length"]},
            "ddp": dict(model="tiny", global_batches=[32], knobs=False, warmup=1, steps=3, rounds=1),
        }
    return {
        "compare": {
            "tiny": dict(batch_size=32, warmup=50, steps=50, rounds=4),
            "distilbert-base": dict(batch_size=16, warmup=1, steps=3, rounds=2),
        },
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
    fused_default = optim.fused_adamw_available(device.type) if d.fused_adam is None else d.fused_adam
    table = [
        (
            "--no-group_by_length",
            "length-grouped batches off: random batches, padded to their longest text",
            d.group_by_length,
        ),
        ("--pad_multiple 0", "no rounding of the padded width up to a multiple of 8", pad_default not in (0, 1)),
        ("--pad_multiple 8", "padded width rounded up to a multiple of 8 (the CUDA default)", pad_default in (0, 1)),
        ("--amp off", "AMP off (fp32)", amp_default != "off"),
        ("--amp bf16", "bf16 autocast (AMP is off by default on the CPU)", amp_default == "off" and not cuda),
        ("--no-pin_memory", "pinned host memory + non-blocking copies off", cuda),
        ("--no-fused_adam", "fused AdamW kernel off (foreach AdamW)", fused_default),
        ("--compile", "torch.compile the model (compile time excluded: it happens in the warm-up)", True),
        (
            "--compile_mode reduce-overhead",
            "CUDA graphs: torch.compile(mode='reduce-overhead'), 4 fixed batch widths (a CPU just compiles)",
            True,
        ),
    ]
    return [(name, desc) for name, desc, ok in table if ok and (wanted == "all" or name in wanted)]


def offline_source(choice: str, keywords: tuple = ("embedded",)) -> str:
    """--data of a benchmark, which never reads the network on its own: auto = sources.data_dir(), else the embedded
    real sample; one of `keywords` as it is; anything else a folder (data_dir's rule)."""
    if choice == "auto":
        return sources.data_dir() or "embedded"
    if choice in keywords:
        return choice
    return sources.data_dir(choice, "--data", ("auto", *keywords))


def resolve_data(choice: str) -> str:
    """What the scripts get as --data. auto: $DISTRINEWS_DATA_DIR, else the real AG News sample embedded in
    distrinews_lib (never the hub: a benchmark must not depend on the network)."""
    return offline_source(choice, ("embedded", "synthetic", "hub"))


def data_note(splits: texts.TextSplits) -> str:
    if splits.is_synthetic:
        return (
            "SYNTHETIC texts: their length distribution is the generator's, not AG News'. Ratios are indicative only."
        )
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


MODEL_DESCRIPTIONS = {
    "tiny": "tiny preset: random 2-layer dim-64 DistilBERT, 30522-token vocabulary",
    "distilbert-base": "DistilBERT-base from its config (6 layers, dim 768, 12 heads), random weights",
}


def script_argv(
    *,
    model: str,
    data_arg: str,
    batch_size: int,
    steps: int,
    num_samples: int,
    max_length: int,
    seed: int,
    threads: int | None,
    out: Path,
    device_type: str,
    flags=(),
    ddp: bool = False,
) -> list:
    """The command line a user could type: the device's preset, then every value that matters spelled out."""
    argv = [
        "--config",
        "cpu_smoke" if device_type == "cpu" else "single_gpu",
        "--model",
        model,
        "--data",
        data_arg,
        "--epochs",
        1,
        "--num_samples",
        num_samples,
        "--eval_samples",
        EVAL_SAMPLES,
        "--batch_size",
        batch_size,
        "--max_length",
        max_length,
        "--lr",
        5e-5,
        "--weight_decay",
        0.01,
        "--warmup_ratio",
        0.06,
        "--amp",
        "auto",
        "--seed",
        seed,
        "--max_steps_per_epoch",
        steps,
        "--no-progress",
        "--no-snapshots",
        "--output",
        out,
        "--checkpoint",
        out / "model.pt",
    ]
    if threads:
        argv += ["--threads", threads]
    if ddp:
        argv += ["--backend", "auto"]
    return [str(a) for a in [*argv, *flags]]


def parse_argv(argv: list, ddp: bool = False) -> config.RunConfig:
    return config.parse("bench", argv, ddp=ddp)
