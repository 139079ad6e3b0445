"""Training snapshots: everything needed to continue a run exactly where it stopped (model, optimizer,
schedule, scaler, position in the data, metrics, every rank's RNG states and partial epoch counters), written
atomically by rank 0 to <run folder>/snapshots/, the last `keep` kept. Rank 0 chooses the snapshot and every
rank loads that one, so with several nodes --output must be shared storage. Same world size: the resumed run
ends bit-identical. Reading one back into a run is resume.py's (only a run given --resume loads it).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from ..errors import UserError, first_line
from ..files import atomic_torch_save
from ..process_group.collectives import barrier
from ..process_group.ranks import get_rank, get_world_size, print0

SNAPSHOT_VERSION = 2
_NAME = re.compile(r"snap_e(\d+)_b(\d+)\.pt$")
# Config keys that must match for a snapshot to fit the model being trained.
_FINGERPRINT_KEYS = (
    "model_type",
    "vocab_size",
    "dim",
    "n_layers",
    "n_heads",
    "hidden_dim",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "num_labels",
)


class SnapshotError(UserError):
    pass


def rng_state() -> dict:
    """This process's RNG states as plain lists: picklable for all_gather_object, loadable with weights_only."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state().tolist(),
    }
    if torch.cuda.is_available():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        n = torch.cuda.device_count()
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"][:n]])


def fingerprint(model, label_names) -> dict:
    cfg = model.config.to_dict()
    return {"config": {k: cfg[k] for k in _FINGERPRINT_KEYS if k in cfg}, "label_names": list(label_names)}


def list_snapshots(run_dir) -> list[Path]:
    """Snapshots of a run folder, oldest first (ordered by epoch, then batches done)."""
    folder = Path(run_dir) / "snapshots"
    found = [(tuple(map(int, m.groups())), p) for p in folder.glob("snap_e*_b*.pt") if (m := _NAME.search(p.name))]
    return [p for _, p in sorted(found)]


def read_snapshot(path, mmap: bool = False) -> dict:
    """The payload of a snapshot file; mmap=True only maps it (cheap: enough to tell a damaged file)."""
    path = Path(path)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as err:
        raise SnapshotError(
            f"snapshot {path} is unreadable ({type(err).__name__}: {first_line(err, 120)}); "
            "it is probably truncated (the run died while copying it?)"
        ) from None
    if not isinstance(payload, dict) or payload.get("snapshot_version") != SNAPSHOT_VERSION:
        raise SnapshotError(f"{path} is not a DistriNews training snapshot (version {SNAPSHOT_VERSION}).")
    return payload


@dataclass
class ResumePoint:
    """Where training continues: the first epoch to run and, in it, the batches already done."""

    epoch: int = 1
    batches_done: int = 0
    meter_states: dict = field(default_factory=dict)  # {epoch: this rank's partial EpochMeter counters}

    def skip(self, epoch: int) -> int:
        return self.batches_done if epoch == self.epoch else 0

    def meter_state(self, epoch: int) -> dict | None:
        return self.meter_states.get(epoch)


class Snapshotter:
    """Saves snapshots during training and restores one at start. Every rank makes one; rank 0 writes."""

    def __init__(self, cfg, *, model, optimizer, scheduler, scaler, tracker, label_names, log=print0):
        self.run_dir = Path(cfg.output)
        self.every, self.keep, self.enabled = cfg.snapshot_every, cfg.keep_snapshots, cfg.snapshots
        self.grad_accum = cfg.grad_accum
        self.model, self.optimizer, self.scheduler, self.scaler = model, optimizer, scheduler, scaler
        self.tracker, self.label_names, self.log = tracker, list(label_names), log
        self.world_size, self.rank = get_world_size(), get_rank()
        self.global_step = 0

    def step(self, epoch: int, meter) -> Path | None:
        """After every optimizer step: count it, and snapshot every `every` steps (collective)."""
        self.global_step += 1
        if self.enabled and self.every and self.global_step % self.every == 0:
            meter.check_finite()  # never snapshot a model that has gone NaN
            return self.save(epoch, meter.batches, meter.state_dict())
        return None

    def epoch_end(self, epoch: int) -> Path | None:
        return self.save(epoch + 1, 0, None) if self.enabled else None

    def save(self, epoch: int, batches_done: int, meter_state: dict | None) -> Path | None:
        """Snapshot at (epoch, batches_done of that epoch). Collective: every rank must call it."""
        mine = {"rng": rng_state(), "meter": meter_state}
        ranks = [None] * self.world_size
        if self.world_size > 1:
            dist.all_gather_object(ranks, mine)
        else:
            ranks = [mine]
        path = None
        if self.rank == 0:
            payload = {
                "snapshot_version": SNAPSHOT_VERSION,
                "epoch": epoch,
                "batches_done": batches_done,
                "global_step": self.global_step,
                "world_size": self.world_size,
                "grad_accum": self.grad_accum,
                "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
                "scaler": self.scaler.state_dict() if self.scaler is not None else None,
                "rng": [r["rng"] for r in ranks],
                "meters": [r["meter"] for r in ranks] if meter_state is not None else None,
                "fingerprint": fingerprint(self.model, self.label_names),
                "tracker": self.tracker.state_dict(),
            }
            path = self.run_dir / "snapshots" / f"snap_e{epoch:03d}_b{batches_done:06d}.pt"
            atomic_torch_save(payload, path)
            for old in list_snapshots(self.run_dir)[: -self.keep]:
                old.unlink(missing_ok=True)
        barrier()  # nobody races ahead (or dies) before the snapshot is on disk
        return path

    def resume(self, choice) -> ResumePoint:
        """Load rank 0's choice of snapshot (a resume.ResumeChoice, from the run plan) on every rank; call it BEFORE
        wrapping the model in DDP. Collective. None: a fresh start, and nothing of resume.py is loaded."""
        return ResumePoint() if choice is None else choice.load_into(self)
