"""Training snapshots: everything needed to continue a run exactly where it stopped (model, optimizer,
schedule, scaler, position in the data, metrics, every rank's RNG states and partial epoch counters), written
atomically by rank 0 to <run folder>/snapshots/, the last `keep` kept. Rank 0 chooses the snapshot and every
rank loads that one, so with several nodes --output must be shared storage. Same world size: the resumed run
ends bit-identical.
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
from ..process_group.collectives import agree, barrier
from ..process_group.ranks import get_rank, get_world_size, node_name, print0
from .epochs import EpochMeter

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


@dataclass(frozen=True)
class ResumeChoice:
    """Rank 0's choice of snapshot, shared with every rank in the run plan."""

    path: str  # as every rank should open it: relative to the run folder when found there
    epoch: int
    batches_done: int
    global_step: int

    def file(self, run_dir) -> Path:
        p = Path(self.path)
        return p if p.is_absolute() else Path(run_dir) / p


def choose(run_dir, how: str | None, log=print) -> ResumeChoice | None:
    """--resume auto: the newest readable snapshot (a damaged one is skipped); PATH: that file (or the newest
    in that folder); off/None: none. Rank 0 calls this."""
    if not how or how == "off":
        return None
    run_dir = Path(run_dir)
    if how == "auto":
        candidates = list(reversed(list_snapshots(run_dir)))
        if not candidates:
            log(f"resume auto: no snapshot in {run_dir / 'snapshots'}; starting from the beginning")
            return None
    else:
        path = Path(how).expanduser()
        if path.is_dir():
            path = next(reversed(list_snapshots(path)), None) or path / "snapshots"
        if not path.is_file():
            raise SnapshotError(
                f"--resume {how}: no snapshot there. Use --resume auto (the newest in "
                f"{run_dir / 'snapshots'}) or the path of a snap_e*_b*.pt file."
            )
        candidates = [path]
    for path in candidates:
        try:
            head = read_snapshot(path, mmap=True)
        except SnapshotError as err:
            if how != "auto":
                raise
            log(f"warning: {err} Falling back to the previous snapshot.")
            continue
        try:
            shown = str(path.relative_to(run_dir))
        except ValueError:
            shown = str(path.resolve())
        return ResumeChoice(shown, head["epoch"], head["batches_done"], head["global_step"])
    log(f"resume auto: no readable snapshot in {run_dir / 'snapshots'}; starting from the beginning")
    return None


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

    def resume(self, choice: ResumeChoice | None) -> ResumePoint:
        """Load rank 0's choice on every rank (call it BEFORE wrapping the model in DDP). Collective."""
        if choice is None:
            return ResumePoint()
        path = choice.file(self.run_dir)

        def load():
            payload = read_snapshot(path) if path.is_file() else None
            where = f"rank {self.rank} ({node_name()})"
            if payload is None:
                raise SnapshotError(
                    f"{where} cannot find the snapshot {path} that rank 0 chose to resume from. With several nodes, "
                    "--output must be on storage that every node can read (a shared filesystem), not a node-local disk."
                )
            if (payload["epoch"], payload["batches_done"], payload["global_step"]) != (
                choice.epoch,
                choice.batches_done,
                choice.global_step,
            ):
                raise SnapshotError(
                    f"{where} reads a different file at {path} than rank 0 did (epoch {payload['epoch']}, batch "
                    f"{payload['batches_done']} instead of epoch {choice.epoch}, batch {choice.batches_done}): the run "
                    "folder is not the same storage on every node. Put --output on a shared filesystem."
                )
            self._check_fits(payload, path)
            return payload

        payload = agree(load)
        self.model.load_state_dict(payload["model"])
        self.optimizer.load_state_dict(payload["optimizer"])
        if self.scheduler is not None and payload["scheduler"] is not None:
            self.scheduler.load_state_dict(payload["scheduler"])
        if self.scaler is not None and payload["scaler"] is not None:
            self.scaler.load_state_dict(payload["scaler"])
        self.tracker.load_state_dict(payload["tracker"])
        self.global_step = payload["global_step"]
        epoch, done = payload["epoch"], payload["batches_done"]
        meters = payload.get("meters")
        old_world = payload["world_size"]
        rngs = payload["rng"]
        if old_world == self.world_size:
            set_rng_state(rngs[self.rank])
            meter = meters[self.rank] if meters else None
        else:
            # The same global position in samples, cut into different shards: the order changes.
            done = done * old_world // self.world_size
            self._rescale_schedule(old_world / self.world_size)
            set_rng_state(rngs[self.rank % old_world])
            meter = EpochMeter.merged(meters, self.rank == 0, done, old_world / self.world_size) if meters else None
            self.log(
                f"resume: the snapshot was taken with {old_world} process(es), this run has {self.world_size}; "
                f"the data order changes accordingly (each rank now sees a different shard), so the result "
                f"will not be bit-identical to an uninterrupted run"
            )
        self.log(f"resumed from {path} (epoch {epoch}, {done} batches into it, step {self.global_step})")
        return ResumePoint(epoch, done, {epoch: meter} if meter else {})

    def _rescale_schedule(self, ratio: float) -> None:
        """Steps count per-rank batches: on another world size the same samples are `ratio` times as many
        steps. Move the LR schedule (and the step counter) there."""
        self.global_step = int(round(self.global_step * ratio))
        sched = self.scheduler
        if sched is None or not hasattr(sched, "lr_lambdas"):
            return
        sched.last_epoch = int(round(sched.last_epoch * ratio))
        for group, base, fn in zip(self.optimizer.param_groups, sched.base_lrs, sched.lr_lambdas):
            group["lr"] = base * fn(sched.last_epoch)

    def _check_fits(self, payload, path) -> None:
        want = fingerprint(self.model, self.label_names)
        have = payload["fingerprint"]
        diffs = [
            f"{k}: snapshot {have['config'].get(k)!r}, model {v!r}"
            for k, v in want["config"].items()
            if have["config"].get(k) != v
        ]
        if have["label_names"] != want["label_names"]:
            diffs.append(f"labels: snapshot {have['label_names']}, run {want['label_names']}")
        if payload["grad_accum"] != self.grad_accum:
            diffs.append(
                f"--grad_accum: snapshot {payload['grad_accum']}, run {self.grad_accum} (a step would be "
                "resumed inside an accumulation group, and the schedule counts steps)"
            )
        if diffs:
            raise SnapshotError(
                f"snapshot {path} does not fit this run ({'; '.join(diffs)}). Resume with the same "
                "--model, labels and --grad_accum, or start a new run folder with --output."
            )
