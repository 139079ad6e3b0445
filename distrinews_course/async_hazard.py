"""The hazard an asynchronous checkpoint must guard against: the training goes on while a background thread writes, so
the next optimizer step may change a tensor before the writer has read it. torch's async_save copies the state first
(staging) and writes the copy; a writer that skips the copy writes whatever the tensors hold when it gets to them, as
DCP's CPU path did by mistake in torch 2.5 (pytorch#144657, fixed by #145408).

    hazard = written_values(model, optimizer, batch, folder)   # one process: the unstaged and the staged path
    hazard.unstaged_wrote == "after the step", hazard.staged_wrote == "before the step"

To make the order certain, the disk is slow on purpose: `gated_writer` holds every write until the step is done.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.staging import AsyncStager


class NoCopyStager(AsyncStager):
    """A stager that stages nothing: the background writer gets the live tensors (the bug, on purpose)."""

    _synchronize_after_execute = False

    def stage(self, state_dict):
        return state_dict


def gated_writer(gate: threading.Event, timeout: float = 60):
    """make_writer(folder) for sharded_checkpoint.save or dcp.async_save: DCP's FileSystemWriter whose writes wait for
    `gate` (a disk that is slow until the caller says so). The wait is bounded: a test never hangs on it."""

    class Gated(FileSystemWriter):
        def write_data(self, plan, planner):
            if not gate.wait(timeout):
                raise TimeoutError(f"the gate of the slow writer stayed closed for {timeout:.0f} s")
            return super().write_data(plan, planner)

    return Gated


def save_then_step(state: dict, folder, step, *, staged: bool, group=None) -> None:
    """Start an async save of `state` on a slow disk, run `step()` (it changes the tensors in place), then let the
    disk write and wait for it. staged=True: the course's save (sharded_checkpoint.save: async_save with a copy);
    False: async_save with NoCopyStager."""
    import torch.distributed.checkpoint as dcp

    from distrinews_lib import sharded_checkpoint

    gate = threading.Event()
    writer = gated_writer(gate)
    with warnings.catch_warnings():  # one process without a process group: DCP says it saves "in a single process"
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        if staged:
            handle = sharded_checkpoint.save(state, folder, 1, group=group, async_=True, make_writer=writer)
            step()
            gate.set()
            handle.wait()
        else:
            future = dcp.async_save(
                state, storage_writer=writer(Path(folder)), process_group=group, async_stager=NoCopyStager()
            )
            step()
            gate.set()
            future.result()


@dataclass
class Hazard:
    """One weight's value before and after the step, and what each async path wrote of it."""

    name: str
    before: float
    after: float
    unstaged: float
    staged: float

    def which(self, value: float) -> str:
        return "before the step" if value == self.before else "after the step" if value == self.after else "neither"

    @property
    def unstaged_wrote(self) -> str:
        return self.which(self.unstaged)

    @property
    def staged_wrote(self) -> str:
        return self.which(self.staged)

    def table(self) -> str:
        rows = [
            ("before optimizer.step()", self.before),
            ("after optimizer.step()", self.after),
            ("written by async_save without staging", self.unstaged),
            ("written by async_save with staging", self.staged),
        ]
        return f"{self.name}:\n" + "\n".join(f"  {what:<40} {value:+.8f}" for what, value in rows)


def written_values(model, optimizer, batch: dict, folder) -> Hazard:
    """The demo in one process: a forward and backward, then each path saves the model while optimizer.step() runs
    before the write. Compares one weight's first element (the one with the largest update, so it moves visibly)."""
    from distrinews_lib import sharded_checkpoint

    folder = Path(folder)
    model(**batch).loss.backward()
    name, param = max(model.named_parameters(), key=lambda kv: float(kv[1].grad.abs().max()))
    flat = int(param.grad.abs().argmax())
    values = {"before": float(param.detach().flatten()[flat])}
    snapshot = {k: v.detach().clone() for k, v in model.state_dict().items()}
    opt_snapshot = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in optimizer.state_dict()["state"].items()}

    def step():
        optimizer.step()
        values.setdefault("after", float(param.detach().flatten()[flat]))

    def rewind():  # the same starting point for the second path: the weights and moments of before the step
        with torch.no_grad():
            model.load_state_dict(snapshot)
        if opt_snapshot:
            optimizer.load_state_dict({"state": opt_snapshot, "param_groups": optimizer.state_dict()["param_groups"]})
        else:
            optimizer.state.clear()

    save_then_step({"model": model.state_dict()}, folder / "unstaged", step, staged=False)
    rewind()
    save_then_step({"model": model.state_dict()}, folder / "staged", step, staged=True)
    unstaged = sharded_checkpoint.read_whole(folder / "unstaged", check=False)["model"][name]
    staged = sharded_checkpoint.read_whole(sharded_checkpoint.folder_for(folder / "staged", 1))["model"][name]
    return Hazard(
        name, values["before"], values["after"], float(unstaged.flatten()[flat]), float(staged.flatten()[flat])
    )
