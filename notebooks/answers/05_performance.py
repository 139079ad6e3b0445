"""Chapter 05's reference answers (read only by its solution cells: course.notebook.answer)."""


def allreduce_ms(nbytes, n, alpha_ms, gb_per_s):
    """A ring all-reduce: alpha once, then 2(n-1)/n of the message over each rank's link."""
    return alpha_ms + 2 * (n - 1) / n * nbytes / (gb_per_s * 1e9) * 1000


def break_even_mbit(single_ms, pair_ms, own_ms, grad_bytes, n, alpha_ms):
    """The link below which n processes lose to 1: where the all-reduce takes all the time DDP saves."""
    budget_ms = single_ms - pair_ms - own_ms - alpha_ms  # what the all-reduce may take before n lose to 1
    if budget_ms <= 0:
        return None  # they lose even on a link that costs nothing
    sent = 2 * (n - 1) / n * grad_bytes  # the ring: what each rank puts on its link, per step
    payload_bits_per_s = 8 * sent / (budget_ms / 1000)
    return payload_bits_per_s / (1448 / 1514) / 1e6  # TCP: 1448 bytes of payload in every 1514 on the wire


# Exercise 2: the last rank's sleep delays it once per step, and the fast rank meets it at the first collective of the
# next step: DDP's forward broadcasts the buffers (broadcast_buffers=True), so the wait shows in 'forward'.
MY_STRAGGLER = {"added_ms": 100, "part": "forward"}


def speedup_vs_all_cores(speedup_vs_one_core):
    """Exercise 3: the single process with a second thread on this 2-core machine runs its matrix products on both
    cores, about 1.5x faster (Python, dispatch and the optimizer's loop stay on one); DDP's speedup shrinks by that."""
    return speedup_vs_one_core / 1.5
