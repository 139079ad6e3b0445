"""Chapter 05's reference answers (read only by its solution cells: course.notebook.answer)."""


def allreduce_ms(nbytes, n, alpha_ms, gb_per_s):
    """A ring all-reduce: alpha once, then 2(n-1)/n of the message over each rank's link."""
    return alpha_ms + 2 * (n - 1) / n * nbytes / (gb_per_s * 1e9) * 1000


# Exercise 2: the last rank's sleep delays it once per step, and the fast rank meets it at the first collective of the
# next step: DDP's forward broadcasts the buffers (broadcast_buffers=True), so the wait shows in 'forward'.
MY_STRAGGLER = {"added_ms": 100, "part": "forward"}


def speedup_vs_all_cores(speedup_vs_one_core):
    """Exercise 3: the single process with a second thread on this 2-core machine runs its matrix products on both
    cores, about 1.5x faster (Python, dispatch and the optimizer's loop stay on one); DDP's speedup shrinks by that."""
    return speedup_vs_one_core / 1.5
