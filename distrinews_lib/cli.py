"""Command-line flags shared by the training scripts, with YAML presets from configs/.

Precedence: built-in defaults < the preset (--config) < flags given on the command line.
--config auto picks kaggle_t4x2 with 2+ GPUs, single_gpu with one, cpu_smoke without.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import yaml

from .errors import UserError

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
PRESETS = ("cpu_smoke", "single_gpu", "kaggle_t4x2")


def auto_preset() -> str:
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return "kaggle_t4x2" if n >= 2 else "single_gpu" if n == 1 else "cpu_smoke"


def preset_path(name: str) -> Path:
    """A preset name (configs/<name>.yaml) or a path to a YAML file."""
    if name.endswith((".yaml", ".yml")) or os.sep in name:
        path = Path(name).expanduser()
    else:
        path = CONFIG_DIR / f"{name}.yaml"
    if not path.is_file():
        raise UserError(f"--config {name}: no such preset. Choices: auto, {', '.join(PRESETS)}, or a path to a YAML file "
                        f"(presets live in {CONFIG_DIR}).")
    return path


def load_preset(name: str) -> tuple[str, dict]:
    if name == "auto":
        name = auto_preset()
    path = preset_path(name)
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise UserError(f"{path} is not valid YAML: {err}") from None
    if not isinstance(values, dict):
        raise UserError(f"{path} must hold a mapping of flag: value (e.g. 'epochs: 3').")
    return Path(name).stem, values


def build_parser(description: str, ddp: bool = False) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    B = argparse.BooleanOptionalAction
    a = p.add_argument
    a("--config", default="auto", help="preset: auto, cpu_smoke, single_gpu, kaggle_t4x2, or a YAML path")
    a("--epochs", type=int, default=3)
    a("--num_samples", type=int, default=None, help="class-balanced subset of the training split (default: all)")
    a("--eval_samples", type=int, default=None, help="class-balanced subset of the test split (default: all)")
    a("--batch_size", type=int, default=32, help="per process" if ddp else "examples per step")
    a("--eval_batch_size", type=int, default=128)
    a("--lr", type=float, default=5e-5)
    a("--weight_decay", type=float, default=0.01)
    a("--warmup_ratio", type=float, default=0.06)
    a("--max_length", type=int, default=128, help="tokens per text (longer texts are truncated)")
    a("--max_grad_norm", type=float, default=1.0, help="gradient clipping (0 turns it off)")
    a("--model", default="auto", help="tiny, minilm, auto, a hub id (distilbert-base-uncased) or a local folder")
    a("--data", default="auto", help="auto, hub, synthetic, or a folder with train.csv/test.csv (.gz ok)")
    a("--amp", default="auto", choices=["auto", "fp16", "bf16", "off"], help="mixed precision")
    a("--grad_accum", type=int, default=1, help="micro-batches per optimizer step")
    a("--seed", type=int, default=42)
    a("--output", default=None, help="run folder for metrics.csv / metrics.json")
    a("--checkpoint", default="checkpoints/distilbert_agnews.pt", help="where the trained model is saved")
    a("--threads", type=int, default=None, help="torch CPU threads per process (default: torch's choice)")
    a("--progress", action=B, default=True, help="tqdm bar on rank 0")
    a("--max_steps", type=int, default=None, help="stop each epoch after this many optimizer steps (benchmarks)")
    # The fast path: each option can be switched off to measure what it buys.
    a("--group_by_length", action=B, default=True, help="batch texts of similar length (less padding)")
    a("--pad_multiple", type=int, default=None,
      help="pad each batch to a multiple of this (0: no rounding; default: 8 on CUDA for tensor cores, none on CPU)")
    a("--pin_memory", action=B, default=None, help="pinned host memory + non-blocking copies (default: on with CUDA)")
    a("--fused_adam", action=B, default=None, help="fused AdamW kernel (default: on where torch has it: CUDA, and CPU with torch >= 2.4)")
    a("--compile", action=B, default=False, help="torch.compile the model")
    # Fault tolerance: snapshots in <output>/snapshots/, resumed with --resume auto (or a path).
    a("--resume", default=None, help="auto (newest good snapshot in --output), a snapshot path, or off")
    a("--snapshot_every", type=int, default=500, help="optimizer steps between snapshots (0: only at epoch ends)")
    a("--keep_snapshots", type=int, default=2, help="snapshots kept (>= 2, so a damaged one can fall back)")
    a("--snapshots", action=B, default=True, help="write training snapshots")
    if ddp:
        a("--backend", default="auto", choices=["auto", "nccl", "gloo"], help="process-group backend")
        a("--ddp_timeout", type=float, default=300, help="seconds a collective may wait before failing")
        a("--no_sync", action=B, default=True, help="skip the all-reduce on non-final accumulation micro-steps")
        a("--bucket_cap_mb", type=float, default=25, help="DDP gradient bucket size")
        a("--gradient_as_bucket_view", action=B, default=True, help="gradients live in DDP's buckets (saves a copy)")
    return p


def parse_train_args(description: str, argv=None, ddp: bool = False) -> argparse.Namespace:
    parser = build_parser(description, ddp)
    first, _ = parser.parse_known_args(argv)
    preset_name, values = load_preset(first.config)
    known = {a.dest for a in parser._actions}
    unknown = sorted(set(values) - known)
    if unknown:
        raise UserError(f"preset {preset_name} sets unknown option(s): {', '.join(unknown)}. "
                        f"Known: {', '.join(sorted(known - {'help', 'config'}))}.")
    parser.set_defaults(**values)
    args = parser.parse_args(argv)
    args.preset = preset_name
    validate(args)
    if args.output is None:
        args.output = str(Path("outputs") / ("ddp" if ddp else "single"))
    return args


def validate(args) -> None:
    checks = [
        (args.epochs >= 1, "--epochs must be at least 1"),
        (args.batch_size >= 1, "--batch_size must be at least 1"),
        (args.eval_batch_size >= 1, "--eval_batch_size must be at least 1"),
        (args.lr > 0, "--lr must be positive"),
        (8 <= args.max_length <= 512, "--max_length must be between 8 and 512 (DistilBERT's limit)"),
        (args.grad_accum >= 1, "--grad_accum must be at least 1"),
        (args.num_samples is None or args.num_samples >= 4, "--num_samples must be at least 4 (one per class)"),
        (args.eval_samples is None or args.eval_samples >= 4, "--eval_samples must be at least 4 (one per class)"),
        (args.threads is None or args.threads >= 1, "--threads must be at least 1"),
        (args.max_steps is None or args.max_steps >= 1, "--max_steps must be at least 1"),
        (args.snapshot_every >= 0, "--snapshot_every must be 0 or more"),
    ]
    for ok, msg in checks:
        if not ok:
            raise UserError(msg + ".")
