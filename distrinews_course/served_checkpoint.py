"""Chapter 10's first check: what the checkpoint says about itself, against the metrics.json of the run that wrote
it. Nothing here compares it with this notebook's own settings (NPROC may have changed since chapter 02).

    for claim in checkpoint_claims("checkpoints/distilbert_agnews.pt"):
        check(*claim)

Each claim is (holds?, sentence): the sentence says what was found, and when it does not hold, what to do.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from distrinews_lib.checkpoint_format import DDP_PREFIX as MODULE_PREFIX


def _redo(checkpoint) -> str:
    return f"run chapter 02 again, or delete {checkpoint} and run this cell again (it then trains a stand-in)"


def metrics_for(checkpoint, meta: dict, outputs="outputs") -> Path | None:
    """The metrics.json of the run that wrote `checkpoint`: one under `outputs` whose aggregates name this file and
    whose final accuracy and held-out count are the ones the file records (both written from the same evaluation,
    to 6 decimals); the most recently finished if several match. None when no run matches."""
    want = Path(checkpoint).resolve()
    found = []
    for path in Path(outputs).rglob("metrics.json"):
        try:
            m = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        agg = m.get("aggregates") or {}
        named = agg.get("checkpoint")
        if not named or Path(named).resolve() != want:
            continue
        last = (m.get("epochs") or [{}])[-1]
        if agg.get("final_val_accuracy") == meta.get("final_accuracy") and last.get("val_examples") == meta.get(
            "eval_examples"
        ):
            found.append((str(m.get("finished") or ""), path))
    return max(found)[1] if found else None


def saved_names(checkpoint) -> str:
    """What the file's weight names show, printed as a fact of the library's save, not checked: train_ddp.py hands
    save_checkpoint the DDP wrapper, and the library saves the bare model inside it (checkpoint.unwrap); the format
    refuses a `module.` name, so load_checkpoint would already have raised on a wrapped file."""
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
    names, backend = list(saved["state_dict"]), (saved.get("metadata") or {}).get("backend")
    first = names[0] if names else "none"
    how = (
        "its DDP run handed save_checkpoint the wrapper, and the library saved the bare model inside it"
        if backend
        else "a one-process run saved it: there was no DDP wrapper to strip"
    )
    return (
        f"{len(names)} weight names, the first `{first}`, which a DDP wrapper's state_dict would call "
        f"`{MODULE_PREFIX}{first}`: {how}"
    )


def checkpoint_claims(checkpoint, outputs="outputs") -> list[tuple[bool, str]]:
    """One claim about the file: it is the file its own run's metrics.json names (same accuracy and held-out count),
    both recording the same process group of at least one rank. Both are written from the run's one world size: the
    claim catches a stale or foreign file, not a wrongly recorded size."""
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
    meta = saved.get("metadata") or {}
    ws, backend = meta.get("world_size"), meta.get("backend")
    path = metrics_for(checkpoint, meta, outputs)
    run = json.loads(path.read_text())["ddp"] if path else {}
    holds = isinstance(ws, int) and ws >= 1 and run.get("world_size") == ws and run.get("backend") == backend
    if holds:
        text = (
            f"it is the file its run's {path} names (same final accuracy and held-out count), and both record a "
            f"process group of {ws} {backend} rank(s)"
        )
    elif path is None:
        text = (
            f"{checkpoint} records world size {ws}, but no metrics.json under {outputs}/ names this file with its "
            f"accuracy: it is not the file its run left there; {_redo(checkpoint)}"
        )
    else:
        text = (
            f"{checkpoint} records {ws} {backend} rank(s), its run's {path} {run.get('world_size')} "
            f"{run.get('backend')}: the file and its run disagree; {_redo(checkpoint)}"
        )
    return [(holds, text)]


def needs_stand_in(checkpoint) -> bool:
    """True when `checkpoint` is missing or chapter 01's one-process script wrote it (no process-group backend)."""
    from distrinews_lib.serving.inference import read_checkpoint

    return not Path(checkpoint).is_file() or read_checkpoint(checkpoint)["metadata"].get("backend") is None


def ensure_ddp_checkpoint(checkpoint, nproc, output="outputs/serving_ddp", timeout: float = 600) -> None:
    """Keep a checkpoint a DDP run wrote; otherwise train a stand-in as chapter 02 does (train_ddp.py under torchrun,
    one epoch of the CPU smoke preset) and say so in two lines."""
    if not needs_stand_in(checkpoint):
        return
    from .launch import torchrun

    print(f"{checkpoint} is missing or chapter 01 wrote it: training a stand-in, one DDP epoch of cpu_smoke")
    args = ["--config", "cpu_smoke", "--epochs", 1, "--no-progress", "--output", output, "--checkpoint", checkpoint]
    trained = torchrun("scripts/train_ddp.py", nproc, args, echo=False, timeout=timeout)
    print(f"trained in {trained.seconds:.0f} s")
