"""What a process reads of itself: its resident memory and peak (VmHWM, which /proc/self/clear_refs restarts), the
bytes it has written (files and sockets: gloo's traffic), its other threads' CPU time, the bytes autograd saves for
backward, and the bytes a
(possibly sharded) tensor holds on this rank. memory_footprint.py and chapter 06 measure memory with it; chapters 03
and 05 count the bytes a collective sends."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import torch
import torch.nn.functional as F


def bytes_written() -> int | None:
    """Bytes this process has written so far (files and sockets), or None where /proc/self/io is missing. Per process,
    so other programs' traffic cannot leak into the count (/proc/net/dev's loopback counter would)."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def other_threads_cpu_s() -> float | None:
    """CPU-seconds used so far by this process's threads other than the calling one (gloo's, torch's), from
    /proc/self/task/*/schedstat (nanoseconds: /proc's clock ticks are too coarse for one step), or None without it.
    Chapter 05 reads it around forward and backward: what gloo's threads took of the cores while the model computed."""
    me = threading.get_native_id()
    total = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tasks:
        if tid == str(me):
            continue
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile
            continue
    return total / 1e9


def status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak() -> bool:
    """Restart this process's peak (VmHWM) from now; False where Linux's /proc/self/clear_refs is not there."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def nbytes(t) -> int:
    if t is None:
        return 0
    if hasattr(t, "to_local"):  # a DTensor: only the local shard lives here
        t = t.to_local()
    return t.numel() * t.element_size()


def loss_of(model, batch):
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return F.cross_entropy(logits.float(), batch["labels"])


class SavedActivations:
    """Counts the bytes autograd saves for backward (each storage once, parameters excluded)."""

    def __init__(self, params):
        self.skip = {p.untyped_storage().data_ptr() for p in params if not hasattr(p, "to_local")}
        self.seen: dict[int, int] = {}

    def pack(self, t):
        st = t.untyped_storage()
        if st.data_ptr() not in self.skip:
            self.seen[st.data_ptr()] = st.nbytes()
        return t

    @property
    def bytes(self) -> int:
        return sum(self.seen.values())


def counted_loss(model, batch, params, count: bool):
    """The loss of one forward, and the bytes autograd saved for its backward (0 unless `count`: the first step's)."""
    counter = SavedActivations(params)
    with torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda t: t) if count else contextlib.nullcontext():
        loss = loss_of(model, batch)
    return loss, counter.bytes
