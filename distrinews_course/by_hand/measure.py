"""What the race measures of a run besides its time: the peak resident memory of a block of code (chapter 06's way)
and the optimizer's state."""

from __future__ import annotations

from ..proc_self import reset_peak, status_mb


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
