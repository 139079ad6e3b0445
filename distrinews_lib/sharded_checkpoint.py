"""Sharded checkpoints with torch's Distributed Checkpoint (DCP): every rank writes its own shard of the model and the
optimizer, `.metadata` says which bytes of which file hold which slice of which tensor, and a load on ANY number of
ranks reads only the byte ranges of its new shards.

A checkpoint is a folder ROOT/step_SSSSSSSS/, committed only when whole: DCP writes into step_SSSSSSSS.partial/,
then every rank hashes the files it wrote, rank 0 records each file's size and sha256 in manifest.json and renames
the folder (hashing reads each rank's file once more: about a second per GB on one core, part of the save's cost).
A save killed midway leaves a .partial folder that nothing loads, and the previous checkpoint as it was.
A load checks the folder against its manifest first (a missing or truncated shard, a .metadata from another save:
an error that names the file, never a partial load).

    state = {"model": msd, "optim": osd, "train": json.dumps(position), "model_info": describe_model(...)}
    handle = save(state, ROOT, step, group=ckpt_group, async_=True)  # returns once staged; commits in the background
    folder = newest(ROOT)                        # the newest committed checkpoint that verifies (None: start fresh)
    train = load(folder, model, optimizer)       # verify, then get_state_dict -> dcp.load -> set_state_dict
    to_single_file(folder, "model.pt")           # the one-file checkpoint that serving and chapter 07 read

    python -m distrinews_lib.sharded_checkpoint verify ROOT/step_00000024
    python -m distrinews_lib.sharded_checkpoint convert ROOT/step_00000024 checkpoints/model.pt

Why async_save gets a group of its own (`group=`): its upload thread runs DCP's collectives (gathering the plans,
then the write results) while the training thread runs its own on the default group. Ranks pair collectives on one
group by the order they are issued, and two threads issue them in different orders on different ranks; a second
group is a second, independent sequence. (With NCCL training, async_save also insists on a CPU group: gloo.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist

from .checkpoint import payload_for, write_payload
from .errors import main_guard
from .files import atomic_write_json
from .shard_integrity import (  # noqa: F401  (re-exported: one import for the scripts)
    MANIFEST,
    METADATA,
    PARTIAL,
    ShardedCheckpointError,
    committed,
    discard_partials,
    file_record,
    folder_for,
    manifest_for,
    verify,
)


def describe_model(model, tokenizer, label_names, max_length: int, metadata: dict | None = None) -> str:
    """Everything but the weights that the one-file checkpoint needs (config, labels, tokenizer), as one JSON string:
    every rank holds the same string, and DCP's planner writes such a replicated item once, not once per rank."""
    bare = payload_for(model, tokenizer, label_names, metadata, max_length, with_state=False)
    return json.dumps(bare)


# --- saving -------------------------------------------------------------------------------------------------------


@dataclass
class SaveHandle:
    """One save: when it started, when the caller got control back, and when the checkpoint was committed."""

    folder: Path
    step: int
    mode: str  # "sync" or "async"
    started: float  # time.time() on this rank
    returned: float = 0.0  # the training loop was blocked from `started` to here
    committed_at: float | None = None  # set by the background thread for an async save
    error: BaseException | None = None
    _thread: threading.Thread | None = field(default=None, repr=False)

    @property
    def blocked_s(self) -> float:
        return self.returned - self.started

    def times(self) -> dict:
        return {
            "step": self.step,
            "mode": self.mode,
            "started": self.started,
            "returned": self.returned,
            "committed": self.committed_at,
        }

    def done(self) -> bool:
        return self._thread is None or not self._thread.is_alive()

    def wait(self) -> SaveHandle:
        """Block until the checkpoint is committed; re-raise what went wrong in the background."""
        if self._thread is not None:
            self._thread.join()
        if self.error is not None:
            raise self.error
        return self


def _rank(group) -> int:
    return dist.get_rank(group) if dist.is_initialized() else 0


def _barrier(group) -> None:
    if dist.is_initialized():
        dist.barrier(group=group)


def save(
    state: dict, root, step: int, *, group=None, async_: bool = False, keep: int = 2, make_writer=None
) -> SaveHandle:
    """Save `state` (every rank its own shards) as ROOT/step_SSSSSSSS, committed when whole. Collective on `group`.

    async_=False: returns once committed. async_=True: dcp.async_save first copies this rank's shards in memory
    (staging: the next optimizer step changes the tensors, the copy keeps the values of now), returns, and a
    background thread writes and commits; `group` must then be one that only checkpoints use (see the module's
    docstring). Keeps the newest `keep` committed checkpoints. make_writer(folder): the storage writer (default DCP's
    FileSystemWriter: one file per rank, fsynced)."""
    import torch.distributed.checkpoint as dcp  # deferred: only a run that saves shards needs it
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    final = folder_for(root, step)
    partial = final.with_name(final.name + PARTIAL)
    handle = SaveHandle(final, step, "async" if async_ else "sync", time.time())
    if _rank(group) == 0:
        shutil.rmtree(partial, ignore_errors=True)  # a killed earlier attempt at this very step
        partial.mkdir(parents=True)
    _barrier(group)
    writer = (make_writer or dcp.FileSystemWriter)(partial)
    if not async_:
        dcp.save(state, storage_writer=writer, process_group=group)
        _commit(partial, final, step, group, keep)
        handle.returned = handle.committed_at = time.time()
        return handle
    # A plain copy into fresh CPU memory, in this thread (no pinned or shared memory: this runs on CPUs too)
    stager = DefaultStager(StagingOptions(False, False, False, False))
    upload = dcp.async_save(state, storage_writer=writer, process_group=group, async_stager=stager)

    def finish():
        try:
            upload.result()
            _commit(partial, final, step, group, keep)
            handle.committed_at = time.time()
        except BaseException as err:  # noqa: BLE001  (re-raised by wait(), in the training thread)
            handle.error = err
        finally:
            stager.close()

    handle._thread = threading.Thread(target=finish, name=f"commit step {step}", daemon=True)
    handle._thread.start()
    handle.returned = time.time()
    return handle


def _commit(partial: Path, final: Path, step: int, group, keep: int) -> None:
    """Every rank hashes the files it wrote (DCP names them __RANK_N.distcp); rank 0 writes the manifest and renames
    the folder. Collective on `group`: no rank goes on before the checkpoint is committed."""
    rank = _rank(group)
    mine = {p.name: file_record(p) for p in partial.glob(f"__{rank}_*")}
    world = dist.get_world_size(group) if dist.is_initialized() else 1
    every = [None] * world
    if dist.is_initialized():
        dist.all_gather_object(every, mine, group=group)
    else:
        every = [mine]
    if rank == 0:
        shards = {name: info for part in every for name, info in part.items()}
        atomic_write_json(partial / MANIFEST, manifest_for(partial, step, world, shards))
        if final.exists():  # a damaged checkpoint of this step, skipped by the resume: replaced
            shutil.rmtree(final)
        os.replace(partial, final)  # the commit: one rename
        _fsync_dir(final.parent)
        for old in committed(final.parent)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    _barrier(group)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# --- choosing -----------------------------------------------------------------------------------------------------


def _agree_on_check(fn, group=None):
    """fn() on rank 0 (reading every file once, not once per rank); every rank gets its result or raises its error."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return fn()
    box = [None]
    if _rank(group) == 0:
        try:
            box[0] = ("ok", fn())
        except ShardedCheckpointError as err:
            box[0] = ("error", str(err))
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    kind, value = box[0]
    if kind == "error":
        raise ShardedCheckpointError(value)
    return value


def newest(root, log=print, group=None) -> Path | None:
    """The newest committed checkpoint under `root` that verifies; a damaged newer one is skipped with a warning.
    None when there is none (the run starts from the beginning). Collective when a process group exists."""

    def pick():
        for folder in reversed(committed(root)):
            try:
                verify(folder)
            except ShardedCheckpointError as err:
                log(f"warning: {err} Falling back to the checkpoint before it.")
                continue
            return str(folder)
        return None

    found = _agree_on_check(pick, group)
    return Path(found) if found else None


# --- loading ------------------------------------------------------------------------------------------------------


def load(folder, model, optimizer, group=None) -> dict:
    """Load a checkpoint saved on any number of ranks into this run's (sharded) model and optimizer: verify it, then
    ask for this world's shards (get_state_dict), let every rank read the byte ranges that hold them (dcp.load), and
    put them in place (set_state_dict). Returns the training state saved with it ("train"). Collective."""
    from torch.distributed.checkpoint import load as dcp_load
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    _agree_on_check(lambda: verify(folder), group)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "train": ""}
    dcp_load(state, checkpoint_id=folder)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return json.loads(state["train"])


def read_whole(folder, keys=None, check: bool = True) -> dict:
    """The checkpoint's full, unsharded state in THIS process (no process group used): every tensor whole, nested as
    it was saved. For converting and for checking a load; as much memory as the whole state. (The public dcp.load
    fills only the keys a state dict already has; torch's own dcp_to_torch_save reads this way.)"""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    if check:
        verify(folder)
    state: dict = {}
    reader, planner = FileSystemReader(folder), _EmptyStateDictLoadPlanner(keys=keys)
    _load_state_dict(state, storage_reader=reader, planner=planner, no_dist=True)
    return state


def to_single_file(folder, out) -> Path:
    """Convert a sharded checkpoint into the one-file checkpoint that serving and chapter 07 read (the model only: no
    optimizer, no training state). Refuses a damaged folder with verify's message."""
    folder = Path(folder)
    state = read_whole(folder, keys={"model", "model_info"})
    if "model_info" not in state:
        raise ShardedCheckpointError(
            f"{folder / METADATA} describes no model_info: this checkpoint was not saved by a DistriNews script, so "
            "the model's config, labels and tokenizer are unknown."
        )
    info = json.loads(state["model_info"])
    info["state_dict"] = {k: v.detach().cpu().contiguous() for k, v in state["model"].items()}
    info.setdefault("metadata", {})["converted_from"] = str(folder)
    return write_payload(info, out)


# --- command line -------------------------------------------------------------------------------------------------


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m distrinews_lib.sharded_checkpoint",
        description="Check a sharded (DCP) checkpoint folder, or convert it into the one-file checkpoint that "
        "serving reads.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    v = sub.add_parser("verify", help="check every file of a step_SSSSSSSS folder against its manifest")
    v.add_argument("folder")
    c = sub.add_parser("convert", help="write the model of a step_SSSSSSSS folder as one .pt checkpoint")
    c.add_argument("folder")
    c.add_argument("out")
    args = p.parse_args(argv)

    @main_guard
    def run():
        if args.command == "verify":
            manifest = verify(args.folder)
            print(
                f"{args.folder}: complete, step {manifest['step']}, saved by {manifest['world_size']} rank(s), "
                f"{len(manifest['files'])} files"
            )
        else:
            out = to_single_file(args.folder, args.out)
            print(f"wrote {out} (serve it: python -m distrinews_lib.serving --checkpoint {out})")

    run()


if __name__ == "__main__":
    sys.exit(main())
