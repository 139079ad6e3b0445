"""The steps both training scripts share that are not the DDP lesson: data + model, run records, metadata."""

from __future__ import annotations

import time
from dataclasses import asdict

import torch

from . import LABEL_NAMES, data, perf
from .model import build_model
from .tracking import RunTracker, versions


def load_data_and_model(args, log=print):
    """Texts from --data, the model from --model, tokenized once. Returns (splits, model, tokenizer, info, train_ds, val_ds)."""
    splits = data.load_agnews(args.data, args.num_samples, args.eval_samples, seed=args.seed)
    log(splits.describe())
    if splits.is_synthetic:
        log("NOTE: " + data.SYNTHETIC_NOTE)
    model, tokenizer, info = build_model(args.model, seed=args.seed)
    log(f"model: {info.resolved} ({info.kind}, {info.num_parameters / 1e6:.1f}M parameters"
        f"{', pretrained' if info.pretrained else ', random init'})")
    train_ds, val_ds = data.tokenize_splits(splits, tokenizer, args.max_length)
    return splits, model, tokenizer, info, train_ds, val_ds


def loader_options(args, tokenizer, device) -> dict:
    """DataLoader options from the fast-path flags (pinned memory only helps host-to-GPU copies)."""
    pin = device.type == "cuda" if args.pin_memory is None else bool(args.pin_memory) and device.type == "cuda"
    # Multiples of 8 feed tensor cores; a CPU has none, so there they are only extra pad tokens (4-8% more CPU time per sample).
    multiple = (8 if device.type == "cuda" else None) if args.pad_multiple is None else (args.pad_multiple or None)
    return dict(pad_id=tokenizer.pad_token_id or 0, pad_to_multiple_of=multiple, pin_memory=pin)


def make_tracker(args, splits, info, *, world_size: int, backend: str | None, enabled: bool) -> RunTracker:
    return RunTracker(
        args.output, {k: v for k, v in vars(args).items()},
        data={"source": splits.source, "detail": splits.detail, "is_synthetic": splits.is_synthetic,
              "train_size": len(splits.train_texts), "test_size": len(splits.test_texts), "full_sizes": splits.full_sizes},
        ddp={"world_size": world_size, "backend": backend, "global_batch_size": args.batch_size * world_size * args.grad_accum},
        model=asdict(info), enabled=enabled)


def checkpoint_metadata(args, splits, info, *, world_size: int, backend: str | None, final) -> dict:
    return {"data_source": splits.source, "data_detail": splits.detail, "is_synthetic": splits.is_synthetic,
            "preset": args.preset, "model": info.resolved, "model_requested": info.name, "world_size": world_size,
            "backend": backend, "final_accuracy": final.accuracy, "final_val_loss": final.loss, "eval_examples": final.n,
            "epochs": args.epochs, "seed": args.seed, "max_length": args.max_length, "label_names": LABEL_NAMES,
            "versions": versions(), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def mfu_setup(model, device, amp):
    """(model shape, device peak TFLOP/s or None) for epoch_mfu; the peak is known for common NVIDIA GPUs only."""
    shape = perf.model_shape(model)
    if device.type != "cuda":
        return shape, None
    return shape, perf.peak_tflops(torch.cuda.get_device_name(device), perf.matmul_dtype(amp.mode, device.type))


def epoch_mfu(train, shape, peak_tflops, n_devices: int = 1):
    """Model FLOPs utilisation of an epoch: (6N + 12·L·d·T) per real token, T the mean text length (perf.py)."""
    if not peak_tflops or not train.seconds or not train.samples:
        return None
    flops = train.tokens * perf.flops_per_token(shape, train.tokens / train.samples)
    return perf.mfu(flops / train.seconds, peak_tflops, n_devices)


def epoch_line(epoch: int, epochs: int, train, val, mfu: float | None = None) -> str:
    return (f"epoch {epoch}/{epochs} | train loss {train.loss:.4f} | val loss {val.loss:.4f} | "
            f"val acc {100 * val.accuracy:.2f}% ({val.n} texts) | {train.seconds:.1f}s | "
            f"{train.samples_per_s:.0f} samples/s" + (f" | MFU {100 * mfu:.1f}%" if mfu is not None else ""))


def maybe_compile(model, enabled: bool):
    return torch.compile(model) if enabled else model
