"""A checkpoint made ready to serve, in one pass: loaded in fp32 (inference.load_for_serving), its answers checked
(inference.check_predictions: finite probabilities over its labels), then, when int8 is asked for, quantized with its
answers held against fp32's (quantize.quantize_int8 with PROBE_TEXTS). Every failure is one CheckpointError that names
the file. The command line, the server's lifespan and the benchmarks serve what ready_to_serve or check_for_serving
return; load_in_precision is int8 without the answer checks (to measure what int8 changes).
"""

from __future__ import annotations

from ..checkpoint import CheckpointError
from .inference import check_predictions
from .quantize import PROBE_TEXTS, quantize_int8
from .rebuild import LoadedCheckpoint, load_for_serving
from .settings import QUANTIZE_CHOICES


def _known(quantize: str) -> None:
    if quantize not in QUANTIZE_CHOICES:
        raise CheckpointError(f"--quantize {quantize!r}: choose one of {', '.join(QUANTIZE_CHOICES)}.")


def load_in_precision(path, device: str, quantize: str = "none") -> LoadedCheckpoint:
    """The checkpoint loaded on `device`, then in int8 with quantize="int8" (quantize.py says when it is refused);
    its answers are ready_to_serve's to check."""
    _known(quantize)
    loaded = load_for_serving(path, device)
    return quantize_int8(loaded) if quantize == "int8" else loaded


def ready_to_serve(loaded: LoadedCheckpoint, quantize: str = "none") -> LoadedCheckpoint:
    """A loaded checkpoint in the precision asked for, its answers checked: finite probabilities over its labels and,
    when this quantizes an fp32 one to int8, int8's within quantize.MAX_DRIFT of fp32's (taken first: the int8 weights
    replace them in place). CheckpointError otherwise."""
    _known(quantize)
    wanted = QUANTIZE_CHOICES[quantize]
    if loaded.precision not in (wanted, "fp32"):  # int8 replaced the fp32 weights in place: nothing to go back to
        raise CheckpointError(
            f"checkpoint {loaded.path} is loaded in {loaded.precision} already; load it again to serve it in {wanted}."
        )
    check_predictions(loaded)  # in its own precision: finite probabilities over its labels
    if loaded.precision != wanted:  # fp32 -> int8, whose answers must stay close to those of the fp32 just checked
        loaded = quantize_int8(loaded, drift_texts=PROBE_TEXTS)
    return loaded


def check_for_serving(path, device: str, quantize: str = "none") -> LoadedCheckpoint:
    """Load the checkpoint (int8 with quantize="int8") and make sure it answers as it should (ready_to_serve);
    CheckpointError otherwise."""
    _known(quantize)
    return ready_to_serve(load_for_serving(path, device), quantize)
