"""A checkpoint made ready to serve: loaded (inference.load_for_serving), in the precision asked for (fp32, or int8 by
quantize.quantize_int8), and checked to answer finite probabilities (inference.check_predictions); every failure is
one CheckpointError that names the file. The command line, the server's lifespan and the benchmarks load through
here.

This module sits above inference.py and quantize.py (quantize builds on inference), so neither imports the other back.
"""

from __future__ import annotations

from .inference import CheckpointError, LoadedCheckpoint, check_predictions, load_for_serving
from .quantize import quantize_int8
from .settings import QUANTIZE_CHOICES


def load_in_precision(path, device: str, quantize: str = "none") -> LoadedCheckpoint:
    """The checkpoint loaded on `device`, then in int8 with quantize="int8" (quantize.py says when it is refused)."""
    if quantize not in QUANTIZE_CHOICES:
        raise CheckpointError(f"--quantize {quantize!r}: choose one of {', '.join(QUANTIZE_CHOICES)}.")
    loaded = load_for_serving(path, device)
    if quantize == "none":
        return loaded
    try:
        return quantize_int8(loaded)
    except CheckpointError:
        raise
    except Exception as err:  # torch's own error from quantize_dynamic or the probe texts
        first = (str(err).splitlines() or [""])[0][:200]
        raise CheckpointError(
            f"--quantize int8 failed on checkpoint {path} ({type(err).__name__}: {first}). Serve it without --quantize."
        ) from None


def check_for_serving(path, device: str, quantize: str = "none") -> LoadedCheckpoint:
    """Load the checkpoint (int8 with quantize="int8") and make sure it answers finite probabilities;
    CheckpointError otherwise."""
    loaded = load_in_precision(path, device, quantize)
    check_predictions(loaded)
    return loaded
