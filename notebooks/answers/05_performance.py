"""Chapter 05's reference answers (read only by its solution cells: course.notebook.answer)."""


def allreduce_ms(nbytes, n, alpha_ms, gb_per_s):
    """A ring all-reduce: alpha once, then 2(n-1)/n of the message over each rank's link."""
    return alpha_ms + 2 * (n - 1) / n * nbytes / (gb_per_s * 1e9) * 1000


MY_GUESS_FREE_COMM = 1.9  # free communication: the pair's step plus bookkeeping remain; not quite 2x
