"""Continuing a run from a snapshot: rank 0 chooses the file (--resume auto, or a PATH), every rank loads that one
into its model, optimizer, schedule, scaler and tracker, checks that it fits the run, and learns where in the data
to continue (on another world size, the same samples cut into other shards). snapshot.py writes the files; a run
that does not resume never loads this module: the plan imports it only when --resume is given, and
Snapshotter.resume hands the loading to the choice it is given."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..process_group.collectives import agree
from ..process_group.ranks import node_name
from .epochs import EpochMeter
from .snapshot import ResumePoint, SnapshotError, fingerprint, list_snapshots, read_snapshot, set_rng_state


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

    def load_into(self, snap) -> ResumePoint:
        """Load this snapshot into a snapshot.Snapshotter's model, optimizer, schedule, scaler and tracker, on every
        rank (Snapshotter.resume calls it). Collective: one rank's failure stops every rank with its message."""
        path = self.file(snap.run_dir)

        def load():
            payload = read_snapshot(path) if path.is_file() else None
            where = f"rank {snap.rank} ({node_name()})"
            if payload is None:
                raise SnapshotError(
                    f"{where} cannot find the snapshot {path} that rank 0 chose to resume from. With several nodes, "
                    "--output must be on storage that every node can read (a shared filesystem), not a node-local disk."
                )
            if (payload["epoch"], payload["batches_done"], payload["global_step"]) != (
                self.epoch,
                self.batches_done,
                self.global_step,
            ):
                raise SnapshotError(
                    f"{where} reads a different file at {path} than rank 0 did (epoch {payload['epoch']}, batch "
                    f"{payload['batches_done']} instead of epoch {self.epoch}, batch {self.batches_done}): the run "
                    "folder is not the same storage on every node. Put --output on a shared filesystem."
                )
            check_fits(snap, payload, path)
            return payload

        payload = agree(load)
        snap.model.load_state_dict(payload["model"])
        snap.optimizer.load_state_dict(payload["optimizer"])
        if snap.scheduler is not None and payload["scheduler"] is not None:
            snap.scheduler.load_state_dict(payload["scheduler"])
        if snap.scaler is not None and payload["scaler"] is not None:
            snap.scaler.load_state_dict(payload["scaler"])
        snap.tracker.load_state_dict(payload["tracker"])
        snap.global_step = payload["global_step"]
        epoch, done = payload["epoch"], payload["batches_done"]
        meters = payload.get("meters")
        old_world = payload["world_size"]
        rngs = payload["rng"]
        if old_world == snap.world_size:
            set_rng_state(rngs[snap.rank])
            meter = meters[snap.rank] if meters else None
        else:
            # The same global position in samples, cut into different shards: the order changes.
            done = done * old_world // snap.world_size
            rescale_schedule(snap, old_world / snap.world_size)
            set_rng_state(rngs[snap.rank % old_world])
            meter = merged_meter(meters, snap.rank == 0, done, old_world / snap.world_size) if meters else None
            snap.log(
                f"resume: the snapshot was taken with {old_world} process(es), this run has {snap.world_size}; "
                f"the data order changes accordingly (each rank now sees a different shard), so the result "
                f"will not be bit-identical to an uninterrupted run"
            )
        snap.log(f"resumed from {path} (epoch {epoch}, {done} batches into it, step {snap.global_step})")
        return ResumePoint(epoch, done, {epoch: meter} if meter else {})


def merged_meter(states: list, first: bool, batches_done: int, ratio: float) -> dict:
    """An EpochMeter's counters to resume with on another world size: the first new rank carries the sums, steps
    scale by `ratio` (old world / new world), the time is the old ranks' mean."""
    merged = {k: (sum(s[k] for s in states) if first else 0) for k in EpochMeter.SUMMED}
    merged.update(
        steps=int(round(states[0]["steps"] * ratio)),
        batches=batches_done,
        seconds=sum(s["seconds"] for s in states) / len(states),
    )
    return merged


def rescale_schedule(snap, ratio: float) -> None:
    """Steps count per-rank batches: on another world size the same samples are `ratio` times as many steps. Move
    the Snapshotter's LR schedule (and its step counter) there."""
    snap.global_step = int(round(snap.global_step * ratio))
    sched = snap.scheduler
    if sched is None or not hasattr(sched, "lr_lambdas"):
        return
    sched.last_epoch = int(round(sched.last_epoch * ratio))
    for group, base, fn in zip(snap.optimizer.param_groups, sched.base_lrs, sched.lr_lambdas):
        group["lr"] = base * fn(sched.last_epoch)


def check_fits(snap, payload, path) -> None:
    """A snapshot fits the run that the Snapshotter saves: the same model's shape, labels and --grad_accum."""
    want = fingerprint(snap.model, snap.label_names)
    have = payload["fingerprint"]
    diffs = [
        f"{k}: snapshot {have['config'].get(k)!r}, model {v!r}"
        for k, v in want["config"].items()
        if have["config"].get(k) != v
    ]
    if have["label_names"] != want["label_names"]:
        diffs.append(f"labels: snapshot {have['label_names']}, run {want['label_names']}")
    if payload["grad_accum"] != snap.grad_accum:
        diffs.append(
            f"--grad_accum: snapshot {payload['grad_accum']}, run {snap.grad_accum} (a step would be "
            "resumed inside an accumulation group, and the schedule counts steps)"
        )
    if diffs:
        raise SnapshotError(
            f"snapshot {path} does not fit this run ({'; '.join(diffs)}). Resume with the same "
            "--model, labels and --grad_accum, or start a new run folder with --output."
        )
