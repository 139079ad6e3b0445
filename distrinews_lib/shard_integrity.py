"""Which sharded checkpoint folders are complete and intact: the names on disk (ROOT/step_SSSSSSSS, a .partial folder
being written, DCP's .metadata, the commit's manifest.json) and the check of every file against the manifest. The
single-file reader (checkpoint.py) asks it what a folder handed over as a checkpoint is; sharded_checkpoint.py saves,
commits, loads and converts with it. It reads files only: no torch.distributed here.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

from .errors import UserError

FORMAT = 1  # manifest.json's format
MANIFEST = "manifest.json"
METADATA = ".metadata"  # DCP's own file: what every byte range of every shard holds
PARTIAL = ".partial"  # a folder being written; committed by renaming it without this suffix
_STEP = re.compile(r"^step_(\d{8})$")
_CHUNK = 1 << 20


class ShardedCheckpointError(UserError):
    """A sharded checkpoint that is incomplete, damaged, or not one of ours: the message names the file."""


def folder_for(root, step: int) -> Path:
    return Path(root) / f"step_{step:08d}"


def committed(root) -> list[Path]:
    """The committed checkpoint folders under `root`, oldest first (by step; .partial folders are not listed)."""
    root = Path(root)
    found = [(int(m.group(1)), p) for p in root.glob("step_*") if p.is_dir() and (m := _STEP.match(p.name))]
    return [p for _, p in sorted(found)]


def discard_partials(root) -> list[Path]:
    """Remove the .partial folders that killed saves left behind (rank 0, before a run saves again)."""
    gone = sorted(Path(root).glob(f"step_*{PARTIAL}"))
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def file_record(path: Path) -> dict:
    """What the manifest records of a file: its size and sha256."""
    return {"bytes": path.stat().st_size, "sha256": sha256_of(path)}


def manifest_for(partial: Path, step: int, world: int, shards: dict) -> dict:
    """The manifest of a folder whose ranks wrote `shards` ({name: file_record}); DCP's .metadata is added here."""
    files = {**shards, METADATA: file_record(partial / METADATA)}
    return {"format": FORMAT, "step": step, "world_size": world, "files": dict(sorted(files.items()))}


def verify(folder) -> dict:
    """The manifest of a committed checkpoint whose every file is the one its save wrote; else ShardedCheckpointError
    naming the file: not a folder, not committed (a killed save), no manifest, .metadata missing or from another save,
    a shard missing, truncated, grown or changed."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ShardedCheckpointError(f"sharded checkpoint {folder} not found (it should be a folder step_SSSSSSSS).")
    manifest_path = folder / MANIFEST
    if folder.name.endswith(PARTIAL) or not manifest_path.is_file():
        why = "its save did not finish (killed?)" if folder.name.endswith(PARTIAL) else "it was never committed"
        raise ShardedCheckpointError(
            f"{manifest_path} is missing: {folder} is not a complete sharded checkpoint ({why}; a folder written by "
            "dcp.save directly has no manifest either). Resume from an earlier step_SSSSSSSS folder."
        )
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
        assert manifest["format"] == FORMAT and isinstance(files, dict) and METADATA in files
    except Exception:  # noqa: BLE001  (cut short, edited, another program's file)
        raise ShardedCheckpointError(f"{manifest_path} is unreadable or not a DistriNews manifest.") from None
    for name, want in files.items():
        path = folder / name
        if not path.is_file():
            what = "DCP's metadata" if name == METADATA else "a shard"
            raise ShardedCheckpointError(
                f"{path} is missing ({what}, {want['bytes']:,} bytes at the save): the checkpoint cannot be loaded "
                "whole. Restore the file, or resume from an earlier step_SSSSSSSS folder."
            )
        size = path.stat().st_size
        if size != want["bytes"]:
            how = "truncated" if size < want["bytes"] else "longer than it was written"
            raise ShardedCheckpointError(
                f"{path} is {how}: {size:,} bytes, the save wrote {want['bytes']:,}. Restore it, or resume from an "
                "earlier step_SSSSSSSS folder."
            )
        if sha256_of(path) != want["sha256"]:
            whose = (
                "it comes from another save or another run (copied in?), so its byte ranges would point into the "
                "wrong shards"
                if name == METADATA
                else "it changed after the save (copied from another save or run, or corrupted)"
            )
            raise ShardedCheckpointError(f"{path} does not match {manifest_path}: {whose}. Restore the file.")
    extra = sorted(p.name for p in folder.glob("*.distcp") if p.name not in files)
    if extra:
        raise ShardedCheckpointError(
            f"{folder / extra[0]} is not in {manifest_path}: a shard from another save was copied in. Remove it."
        )
    return manifest


def refusal(path: Path) -> str | None:
    """What the single-file reader says of a sharded checkpoint folder, or a run folder of them, handed over as a
    checkpoint file: how to convert it, and what is wrong with it when it cannot be. None for any other folder."""
    path = Path(path)
    if (path / METADATA).is_file() or (path / MANIFEST).is_file() or path.name.endswith(PARTIAL):
        folder, what = path, "a sharded checkpoint (torch Distributed Checkpoint: one shard per rank)"
    elif committed(path):
        folder = committed(path)[-1]
        what = f"a folder of sharded checkpoints (the newest is {folder.name})"
    else:
        return None
    try:
        verify(folder)
        damage = ""
    except ShardedCheckpointError as err:
        damage = f" It cannot be converted as it is: {err}"
    return (
        f"checkpoint {path} is {what}, and this reads one file. Convert it first: python -m "
        f"distrinews_lib.sharded_checkpoint convert {folder} {folder}.pt, then pass {folder}.pt.{damage}"
    )
