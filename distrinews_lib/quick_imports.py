"""Modules load with Python's cyclic garbage collector paused, then frozen out of its way (gc.freeze): its full passes
over torch and transformers' 350,000 objects cost a rank about a quarter of its import time, and every collection after
that walks them all again. Frozen with them, never freed: what a load leaves unreachable (torch and DistilBERT: 7 MiB).
Where it is installed and what it saves: the README, "Where the suite's time goes"."""

import contextlib
import gc

FREEZE_AFTER = 10_000  # new objects that make a freeze pay (torch leaves ~170,000); fewer are left to the young passes


@contextlib.contextmanager
def paused():
    """The block runs with the collector off (if it already is, it is left alone); if the block left FREEZE_AFTER new
    objects or more, every object is frozen after it. Also a decorator."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if gc.get_count()[0] >= FREEZE_AFTER:  # allocations minus frees since the last young collection
            gc.freeze()
        gc.enable()


def install() -> bool:
    """Every module this process loads from now on loads inside paused(): each passes through importlib's
    _find_and_load, which this wraps. Idempotent; False (and nothing changed) where there is none to wrap."""
    import importlib._bootstrap as bootstrap

    original = getattr(bootstrap, "_find_and_load", None)
    if original is None or getattr(original, "distrinews_paused", False):
        return original is not None

    def _find_and_load(name, import_):
        with paused():
            return original(name, import_)

    _find_and_load.distrinews_paused = True
    bootstrap._find_and_load = _find_and_load
    return True
