"""A checkpoint made ready to serve, in two steps: loaded (inference.load_for_serving) in the precision asked for
(fp32, or int8 by quantize.quantize_int8 with its refusals that need no text: load_in_precision); then its answers
checked (ready_to_serve: inference.check_predictions, finite probabilities; with int8, quantize.check_drift against
the fp32 answers taken before quantizing in place). check_for_serving does both. Every failure is one CheckpointError
that names the file. The command line, the server's lifespan and the benchmarks serve what check_for_serving or
ready_to_serve return.

This module sits above inference.py and quantize.py (quantize builds on inference), so neither imports the other back.
"""

from __future__ import annotations

from .inference import CheckpointError, LoadedCheckpoint, check_predictions, load_for_serving
from .quantize import check_drift, int8_failed, probe_answers, quantize_int8
from .settings import QUANTIZE_CHOICES


def _known(quantize: str) -> None:
    if quantize not in QUANTIZE_CHOICES:
        raise CheckpointError(f"--quantize {quantize!r}: choose one of {', '.join(QUANTIZE_CHOICES)}.")


def load_in_precision(path, device: str, quantize: str = "none") -> LoadedCheckpoint:
    """The checkpoint loaded on `device`, then in int8 with quantize="int8" (quantize.py says when it is refused);
    its answers are ready_to_serve's to check."""
    _known(quantize)
    loaded = load_for_serving(path, device)
    if quantize == "none":
        return loaded
    try:
        return quantize_int8(loaded)
    except CheckpointError:
        raise
    except Exception as err:  # torch's own error from quantize_dynamic
        raise int8_failed(path, err) from None


def ready_to_serve(loaded: LoadedCheckpoint, quantize: str = "none") -> LoadedCheckpoint:
    """A loaded checkpoint in the precision asked for, its answers checked: finite probabilities over its labels
    and, when this quantizes an fp32 one to int8, within quantize.MAX_DRIFT of the fp32 answers (taken first: the
    int8 weights replace them in place). CheckpointError otherwise."""
    _known(quantize)
    if loaded.precision == QUANTIZE_CHOICES[quantize]:
        check_predictions(loaded)
        return loaded
    if loaded.precision != "fp32":  # int8 replaced the fp32 weights in place: there is nothing to go back to
        raise CheckpointError(
            f"checkpoint {loaded.path} is loaded in {loaded.precision} already; load it again to serve it in "
            f"{QUANTIZE_CHOICES[quantize]}."
        )
    try:
        reference = probe_answers(loaded)
        int8 = quantize_int8(loaded)
        check_drift(int8, reference)
    except CheckpointError:
        raise
    except Exception as err:  # torch's own error from quantize_dynamic or the probe texts
        raise int8_failed(loaded.path, err) from None
    check_predictions(int8)
    return int8


def check_for_serving(path, device: str, quantize: str = "none") -> LoadedCheckpoint:
    """Load the checkpoint (int8 with quantize="int8") and make sure it answers as it should (ready_to_serve);
    CheckpointError otherwise."""
    _known(quantize)
    return ready_to_serve(load_for_serving(path, device), quantize)
