"""What the race measures of a run besides its time: the peak resident memory of a block of code (chapter 06's way)
and the optimizer's state; and the folder where a launch's memory runs, each a fresh process per rank, meet."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..proc_self import reset_peak, status_mb


def meeting_folder(prefix: str) -> Path:
    """A folder every rank of this launch names alike (torchrun's run id, the box's control folder, or the parent's
    pid), for the FileStores where the ranks' fresh children meet; made if missing."""
    run = os.environ.get("TORCHELASTIC_RUN_ID") or Path(os.environ.get("DISTRINEWS_LINK_CONTROL", "")).name
    folder = Path(tempfile.gettempdir()) / f"{prefix}_{run or os.getppid()}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def remove_meeting_folder(folder: Path) -> None:
    """Rank 0, once the runs are over: the FileStores, then the folder if nothing else is left in it."""
    for store in folder.glob("store_*"):
        store.unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError:
        pass  # rank 1's last file still there: the folder is left in the temporary folder, empty or nearly


class PeakMemory:
    """This process's peak resident memory during a block of code, above its resident memory just before (Linux:
    VmHWM, reset through /proc/self/clear_refs; None elsewhere). Chapter 06's way of measuring (memory_footprint.py):
    settle_allocator() first, so that freed tensors go back to Linux instead of staying in glibc's heap."""

    def __enter__(self):
        import gc

        gc.collect()
        self.peak_mb = None
        try:
            self.before = status_mb("VmRSS")
        except OSError:  # no /proc: not Linux
            self.before = None
        if not reset_peak():
            self.before = None
        return self

    def __exit__(self, *exc):
        if self.before is not None:
            self.peak_mb = status_mb("VmHWM") - self.before
        return False


def settle_allocator() -> None:
    """glibc: every allocation of 128 KiB or more gets pages of its own, returned to Linux when freed (by default the
    threshold rises after the first large free, and freed tensors then stay resident in the heap)."""
    try:
        import ctypes

        ctypes.CDLL(None).mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD (fixing it turns the dynamic threshold off)
    except (OSError, AttributeError):
        pass


def optimizer_state_bytes(optimizer) -> int:
    """Bytes of every tensor the optimizer keeps (AdamW: exp_avg and exp_avg_sq, and the step counters)."""
    import torch

    return sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))
