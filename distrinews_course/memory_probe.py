"""How memory_footprint.py measures one training step's memory on a CPU: the process's resident peak (VmHWM, which
/proc/self/clear_refs restarts), the bytes autograd saves for backward, and the bytes a (possibly sharded) tensor
holds on this rank. Chapter 06 compares these with distrinews_course.memory's model of the same step."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
import torch.nn.functional as F


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
