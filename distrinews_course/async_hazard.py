"""The hazard an asynchronous checkpoint must guard against: the training goes on while a background thread writes, so
the next optimizer step may change a tensor before the writer has read it. torch's async_save copies the state first
(staging) and writes the copy; a writer that skips the copy writes whatever the tensors hold when it gets to them, as
DCP's CPU path did by mistake in torch 2.5 (pytorch#144657, fixed by #145408).

    hazard = written_values(model, optimizer, batch, folder)   # one process: the unstaged and the staged path
    hazard.unstaged_wrote == "after the step", hazard.staged_wrote == "before the step"   # over every changed tensor

To make the order certain, the disk is slow on purpose: `gated_writer` holds every write until the step is done.
"""

from __future__ import annotations

import threading
import warnings
from contextlib import contextmanager
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


def save_then_step(state: dict, folder, step, *, staged: bool, group=None, stager=None) -> None:
    """Start an async save of `state` on a slow disk, run `step()` (it changes the tensors in place), then let the
    disk write and wait for it. staged=True: the course's save (sharded_checkpoint.save: async_save with a copy);
    False: async_save with `stager` (default NoCopyStager, the bug)."""
    import torch.distributed.checkpoint as dcp

    from distrinews_lib import sharded_checkpoint

    gate = threading.Event()
    writer = gated_writer(gate)
    with _one_process():
        if staged:
            handle = sharded_checkpoint.save(state, folder, 1, group=group, async_=True, make_writer=writer)
            step()
            gate.set()
            handle.wait()
        else:
            future = dcp.async_save(
                state, storage_writer=writer(Path(folder)), process_group=group, async_stager=stager or NoCopyStager()
            )
            step()
            gate.set()
            future.result()


@contextmanager
def _one_process():
    """One process without a process group: DCP warns that it saves "in a single process"; quiet that."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def save_now(state: dict, folder) -> None:
    """A plain synchronous dcp.save: the reference copy of the tensors as they are now."""
    import torch.distributed.checkpoint as dcp

    with _one_process():
        dcp.save(state, storage_writer=FileSystemWriter(Path(folder)))


@dataclass
class Hazard:
    """One weight's value before and after the step, and what each async path wrote of it; and, over every tensor the
    step changed, how many each path wrote equal to the synchronous copy saved before the step, and after it (all four
    read back from disk)."""

    name: str
    before: float
    after: float
    unstaged: float
    staged: float
    changed: int = 0
    unstaged_as: dict | None = None  # {"before": n, "after": n} tensors equal to each reference
    staged_as: dict | None = None

    @staticmethod
    def verdict(counts: dict, changed: int) -> str:
        if changed and counts["before"] == changed:
            return "before the step"
        if changed and counts["after"] == changed:
            return "after the step"
        return "neither"

    @property
    def unstaged_wrote(self) -> str:
        return self.verdict(self.unstaged_as, self.changed)

    @property
    def staged_wrote(self) -> str:
        return self.verdict(self.staged_as, self.changed)

    def table(self) -> str:
        rows = [
            ("before optimizer.step()", self.before),
            ("after optimizer.step()", self.after),
            ("written by async_save without staging", self.unstaged),
            ("written by async_save with staging", self.staged),
        ]
        lines = [f"{self.name}:"] + [f"  {what:<40} {value:+.8f}" for what, value in rows]
        lines.append(
            f"the {self.changed} tensors the step changed, read back, equal to the copy saved before / after it:"
        )
        for what, c in (("without staging", self.unstaged_as), ("with staging", self.staged_as)):
            lines.append(f"  {what:<16} {c['before']:>3} before, {c['after']:>3} after")
        return "\n".join(lines)


def _as(written: dict, pre: dict, post: dict, changed: list) -> dict:
    return {
        "before": sum(torch.equal(written[k], pre[k]) for k in changed),
        "after": sum(torch.equal(written[k], post[k]) for k in changed),
    }


def written_values(model, optimizer, batch: dict, folder, stager=None) -> Hazard:
    """The demo in one process: a forward and backward, then each path saves the model while optimizer.step() runs
    before the write. A synchronous save before the step and one after it are the references: every tensor each path
    wrote is read back and compared with both. The table also shows one weight's first element (the one with the
    largest update, so it moves visibly). stager: the unstaged path's (default NoCopyStager; a test passes one that
    copies, and the hazard must vanish)."""
    from distrinews_lib import sharded_checkpoint

    folder = Path(folder)
    model(**batch).loss.backward()
    name, param = max(model.named_parameters(), key=lambda kv: float(kv[1].grad.abs().max()))
    flat = int(param.grad.abs().argmax())
    values = {"before": float(param.detach().flatten()[flat])}
    snapshot = {k: v.detach().clone() for k, v in model.state_dict().items()}
    opt_snapshot = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in optimizer.state_dict()["state"].items()}
    save_now({"model": model.state_dict()}, folder / "before_step")

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

    save_then_step({"model": model.state_dict()}, folder / "unstaged", step, staged=False, stager=stager)
    save_now({"model": model.state_dict()}, folder / "after_step")
    rewind()
    save_then_step({"model": model.state_dict()}, folder / "staged", step, staged=True)
    read = lambda f, check=False: sharded_checkpoint.read_whole(f, check=check)["model"]  # noqa: E731
    pre, post = read(folder / "before_step"), read(folder / "after_step")
    unstaged, staged = read(folder / "unstaged"), read(sharded_checkpoint.folder_for(folder / "staged", 1), True)
    changed = [k for k in pre if not torch.equal(pre[k], post[k])]
    return Hazard(
        name,
        values["before"],
        values["after"],
        float(unstaged[name].flatten()[flat]),
        float(staged[name].flatten()[flat]),
        len(changed),
        _as(unstaged, pre, post, changed),
        _as(staged, pre, post, changed),
    )
