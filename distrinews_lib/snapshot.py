"""Training snapshots: everything needed to continue a run exactly where it stopped.

A snapshot holds the model (unwrapped), optimizer, scheduler, GradScaler, the position in the data
(epoch and batches done, the sampler's state) and every rank's RNG states (python, numpy, torch,
CUDA). Rank 0 writes it atomically to <run folder>/snapshots/; the last `keep` are kept so that a
damaged newest one can fall back to the one before. The inference checkpoint is separate.

Exactness: with the same world size, deterministic kernels and num_workers=0, a run resumed from a
snapshot ends with the same weights, bit for bit, as one that never stopped.
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from . import distributed as D
from . import faults
from .checkpoint import atomic_torch_save, unwrap
from .errors import UserError

SNAPSHOT_VERSION = 1
_NAME = re.compile(r"snap_e(\d+)_b(\d+)\.pt$")
# Config keys that must match for a snapshot to fit the model being trained.
_FINGERPRINT_KEYS = ("model_type", "vocab_size", "dim", "n_layers", "n_heads", "hidden_dim", "hidden_size",
                     "num_hidden_layers", "num_attention_heads", "intermediate_size", "num_labels")


class SnapshotError(UserError):
    pass


# ------------------------------------------------------------------ RNG states, as weights_only-safe values

def rng_state() -> dict:
    """This process's RNG states as plain lists: picklable for all_gather_object, loadable with weights_only."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": [version, list(internal), gauss],
             "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
             "torch": torch.get_rng_state().tolist()}
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
    cfg = unwrap(model).config.to_dict()
    return {"config": {k: cfg[k] for k in _FINGERPRINT_KEYS if k in cfg}, "label_names": list(label_names)}


def sampler_state(sampler):
    """What decides this epoch's order: DistributedSampler's (seed, epoch) or a generator's state."""
    if getattr(sampler, "generator", None) is not None:
        return {"generator": sampler.generator.get_state()}
    return {"seed": getattr(sampler, "seed", None), "epoch": getattr(sampler, "epoch", None)}


def restore_sampler(sampler, state) -> None:
    if state and "generator" in state and getattr(sampler, "generator", None) is not None:
        sampler.generator.set_state(state["generator"])


# ------------------------------------------------------------------ files

def list_snapshots(run_dir) -> list[Path]:
    """Snapshots of a run folder, oldest first (ordered by epoch, then batches done)."""
    folder = Path(run_dir) / "snapshots"
    found = [(tuple(map(int, m.groups())), p) for p in folder.glob("snap_e*_b*.pt") if (m := _NAME.search(p.name))]
    return [p for _, p in sorted(found)]


def read_snapshot(path) -> dict:
    path = Path(path)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise SnapshotError(f"snapshot {path} is unreadable ({type(err).__name__}: {str(err).splitlines()[0][:120]}); "
                            "it is probably truncated (the run died while copying it?)") from None
    if not isinstance(payload, dict) or payload.get("snapshot_version") != SNAPSHOT_VERSION:
        raise SnapshotError(f"{path} is not a DistriNews training snapshot.")
    return payload


class Snapshotter:
    """Saves snapshots during training and restores one at start. Every rank makes one; rank 0 writes.

    In the scripts:
        snap = Snapshotter(args, model, optimizer, scheduler, scaler, train_sampler, tracker, LABEL_NAMES)
        start_epoch = snap.resume(args.resume)
        for epoch in range(start_epoch, args.epochs + 1):
            train = engine.train_one_epoch(..., skip_batches=snap.skip_batches(epoch), on_step=snap.on_step(epoch))
            ...
            snap.save_epoch_end(epoch)
    """

    def __init__(self, args, model, optimizer, scheduler, scaler, sampler, tracker, label_names, log=print):
        self.run_dir = Path(args.output)
        self.every = int(getattr(args, "snapshot_every", 0) or 0)
        self.keep = max(2, int(getattr(args, "keep_snapshots", 2) or 2))
        self.enabled = getattr(args, "snapshots", True)
        self.model, self.optimizer, self.scheduler, self.scaler = model, optimizer, scheduler, scaler
        self.sampler, self.tracker, self.label_names, self.log = sampler, tracker, list(label_names), log
        self.grad_accum = args.grad_accum
        self.world_size = D.get_world_size()
        self.rank = D.get_rank()
        self.global_step = 0
        self._resume_batches: dict[int, int] = {}
        self._epoch_sampler_state = None

    # -------------------------------------------------------------- saving
    def on_step(self, epoch: int):
        """A callback for train_one_epoch: saves every `every` optimizer steps. Call before the epoch starts."""
        self._epoch_sampler_state = sampler_state(self.sampler)  # captured before the loader draws the order

        def callback(batches_done: int):
            self.global_step += 1
            if self.enabled and self.every and self.global_step % self.every == 0:
                self.save(epoch, batches_done)
            faults.maybe_inject(self.global_step)  # no-op unless DISTRINEWS_FAULT asks (tests, the course demo)

        return callback

    def save_epoch_end(self, epoch: int) -> None:
        if self.enabled:
            self.save(epoch + 1, 0)

    def save(self, epoch: int, batches_done: int) -> Path | None:
        """Snapshot at (epoch, batches_done of that epoch). Collective: every rank must call it."""
        states = [None] * self.world_size
        if self.world_size > 1:
            dist.all_gather_object(states, rng_state())
        else:
            states = [rng_state()]
        path = None
        if self.rank == 0:
            payload = {
                "snapshot_version": SNAPSHOT_VERSION,
                "epoch": epoch, "batches_done": batches_done, "global_step": self.global_step,
                "world_size": self.world_size, "grad_accum": self.grad_accum,
                "model": {k: v.detach().cpu() for k, v in unwrap(self.model).state_dict().items()},
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
                "scaler": self.scaler.state_dict() if self.scaler is not None else None,
                "sampler": self._epoch_sampler_state if batches_done else sampler_state(self.sampler),
                "rng": states,
                "fingerprint": fingerprint(self.model, self.label_names),
                "tracker": {"rows": self.tracker.rows, "epochs": self.tracker.record["epochs"]},
            }
            path = self.run_dir / "snapshots" / f"snap_e{epoch:03d}_b{batches_done:06d}.pt"
            atomic_torch_save(payload, path)
            for old in list_snapshots(self.run_dir)[: -self.keep]:
                old.unlink(missing_ok=True)
        D.barrier()  # nobody races ahead (or dies) before the snapshot is on disk
        return path

    # -------------------------------------------------------------- resuming
    def resume(self, how: str | None) -> int:
        """Load a snapshot ('auto': the newest readable one in the run folder, or a path). Returns the start epoch."""
        if not how or how == "off":
            return 1
        payload, path = self._pick(how)
        if payload is None:
            self.log(f"resume {how}: no snapshot in {self.run_dir / 'snapshots'}; starting from the beginning")
            return 1
        self._check_fits(payload, path)
        unwrap(self.model).load_state_dict(payload["model"])
        self.optimizer.load_state_dict(payload["optimizer"])
        if self.scheduler is not None and payload["scheduler"] is not None:
            self.scheduler.load_state_dict(payload["scheduler"])
        if self.scaler is not None and payload["scaler"] is not None:
            self.scaler.load_state_dict(payload["scaler"])
        self.global_step = payload["global_step"]
        self.tracker.rows = list(payload["tracker"]["rows"])
        self.tracker.record["epochs"] = list(payload["tracker"]["epochs"])
        epoch, done = payload["epoch"], payload["batches_done"]
        old_world = payload["world_size"]
        if old_world != self.world_size:
            # The same global position in samples, but cut into different shards: the order changes.
            done = done * old_world // self.world_size
            self._rescale_schedule(old_world / self.world_size)
            self.log(f"resume: the snapshot was taken with {old_world} process(es), this run has {self.world_size}; "
                     f"the data order changes accordingly (each rank now sees a different shard), so the result "
                     f"will not be bit-identical to an uninterrupted run")
        restore_sampler(self.sampler, payload["sampler"])
        rngs = payload["rng"]
        set_rng_state(rngs[self.rank] if self.rank < len(rngs) else rngs[0])
        if done:
            self._resume_batches[epoch] = done
        self.log(f"resumed from {path} (epoch {epoch}, {done} batches into it, step {self.global_step})")
        return epoch

    def _rescale_schedule(self, ratio: float) -> None:
        """Steps count per-rank batches: with a different world size, the same number of samples is
        ratio times as many steps. Move the LR schedule (and the step counter) to that position."""
        self.global_step = int(round(self.global_step * ratio))
        sched = self.scheduler
        if sched is None or not hasattr(sched, "lr_lambdas"):
            return
        sched.last_epoch = int(round(sched.last_epoch * ratio))
        for group, base, fn in zip(self.optimizer.param_groups, sched.base_lrs, sched.lr_lambdas):
            group["lr"] = base * fn(sched.last_epoch)

    def skip_batches(self, epoch: int) -> int:
        """Batches of this epoch that the snapshot had already trained on (0 except in the resumed epoch)."""
        return self._resume_batches.pop(epoch, 0)

    def _pick(self, how: str):
        if how != "auto":
            path = Path(how)
            if path.is_dir():
                path = next(reversed(list_snapshots(path)), None) or path / "snapshots"
            if not Path(path).is_file():
                raise SnapshotError(f"--resume {how}: no snapshot there. Use --resume auto (the newest in "
                                    f"{self.run_dir / 'snapshots'}) or the path of a snap_e*_b*.pt file.")
            return read_snapshot(path), Path(path)
        for path in reversed(list_snapshots(self.run_dir)):
            try:
                return read_snapshot(path), path
            except SnapshotError as err:
                self.log(f"warning: {err} Falling back to the previous snapshot.")
        return None, None

    def _check_fits(self, payload, path) -> None:
        want = fingerprint(self.model, self.label_names)
        have = payload["fingerprint"]
        diffs = [f"{k}: snapshot {have['config'].get(k)!r}, model {v!r}" for k, v in want["config"].items()
                 if have["config"].get(k) != v]
        if have["label_names"] != want["label_names"]:
            diffs.append(f"labels: snapshot {have['label_names']}, run {want['label_names']}")
        if diffs:
            raise SnapshotError(f"snapshot {path} does not fit this run ({'; '.join(diffs)}). Resume with the same "
                                "--model and labels, or start a new run folder with --output.")
