"""--quantize int8: dynamic int8 for the Linear layers of a loaded checkpoint, on the CPU; refused where it does not
apply.

Dynamic quantization (torch.ao.quantization.quantize_dynamic, torch's CPU int8 path) stores the weights of every
torch.nn.Linear as int8 once, one scale per output row (so one large weight does not flatten a whole layer), and
quantizes each batch's activations on the fly; those matrix products run in int8 (the x86/fbgemm kernels, with VNNI
where the CPU has it). Everything else stays fp32: the embeddings, LayerNorm, softmax, attention's own products of
activations, the tokenizer, HTTP. So int8 pays where Linear layers do most of the work (MiniLM, DistilBERT) and
little where they do not (the course's tiny model, whose time goes to the rest).

Refused at start-up with one paragraph (a CheckpointError), never served slowly or wrongly. int8_applies refuses
what shows before any text is classified:
* a device other than the CPU (settings.py refuses that before anything is loaded);
* a torch without the CPU int8 path (no quantize_dynamic, no quantized engine);
* a model whose torch.nn.Linear layers hold less than MIN_LINEAR_SHARE of its weights outside the embeddings (GPT-2's
  layers are transformers' Conv1D, which dynamic quantization leaves alone: int8 would change almost nothing).
and quantize_int8, given PROBE_TEXTS (the server's check before it starts, loading.ready_to_serve), what the answers
show: a model whose int8 answers move any class probability by more than MAX_DRIFT on them against the fp32 answers it
took first, in the same pass (a layer with a few huge weights leaves the others with no int8 resolution).
"""

from __future__ import annotations

import dataclasses
import warnings

import torch

from ..checkpoint import CheckpointError
from .inference import predict_proba
from .rebuild import LoadedCheckpoint

with warnings.catch_warnings():  # torch.ao.quantization announces its move to torchao
    warnings.simplefilter("ignore", DeprecationWarning)
    try:
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
    except ImportError:  # a torch without it: int8_applies refuses --quantize int8
        per_channel_dynamic_qconfig = quantize_dynamic = None

MIN_LINEAR_SHARE = 0.5  # of the weights outside the embeddings
MAX_DRIFT = 0.1  # largest change of a class probability, int8 vs fp32, on PROBE_TEXTS
METHOD = "dynamic int8 (torch.ao.quantization.quantize_dynamic, per-channel weights) for torch.nn.Linear layers"
# Varied news texts: int8 must answer them (nearly) as fp32 does before the server starts.
PROBE_TEXTS = (
    "Stocks rally as tech shares surge after strong quarterly earnings from chip makers.",
    "Federer beats Nadal in a five-set Wimbledon final that lasted almost five hours.",
    "Oil prices climb as OPEC agrees to cut production for the rest of the year.",
    "NASA's new telescope sends back its first images of distant galaxies.",
    "UN Security Council meets on the crisis in the region as talks stall.",
    "Microsoft releases a security update for Windows after a worm spreads across the internet.",
    "Central bank raises interest rates by a quarter point, citing inflation.",
    "Election results delayed as officials recount ballots in three provinces.",
)


def linear_weights(model: torch.nn.Module) -> tuple[int, float]:
    """(number of torch.nn.Linear layers, their share of the parameters outside the embeddings): what dynamic int8
    would quantize. Subclasses such as MultiheadAttention's out_proj are not quantized, so only nn.Linear counts."""
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    in_linear = sum(p.numel() for m in linears for p in m.parameters(recurse=False))
    embeddings = sum(
        p.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters(recurse=False)
    )
    rest = sum(p.numel() for p in model.parameters()) - embeddings
    return len(linears), (in_linear / rest if rest else 0.0)


def int8_engine() -> str | None:
    """The quantized engine torch will use on this CPU, or None when it has none."""
    engines = [e for e in ("x86", "fbgemm", "onednn", "qnnpack") if e in torch.backends.quantized.supported_engines]
    if not engines:
        return None
    if torch.backends.quantized.engine not in engines:
        torch.backends.quantized.engine = engines[0]
    return torch.backends.quantized.engine


def int8_applies(loaded: LoadedCheckpoint) -> dict:
    """How int8 would quantize this checkpoint (method, engine, Linear layers and their share), or a CheckpointError
    saying why it does not apply: the refusals that need no text."""
    path, model = loaded.path, loaded.model
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise CheckpointError(
            f"--quantize int8 runs on the CPU only, but checkpoint {path} is loaded on {device}. "
            "Serve it with --device cpu, or leave out --quantize on a GPU."
        )
    engine = int8_engine()
    if quantize_dynamic is None or engine is None:
        raise CheckpointError(
            f"--quantize int8: this torch ({torch.__version__}) has no CPU int8 path "
            f"({'no quantized engine' if quantize_dynamic else 'torch.ao.quantization.quantize_dynamic is gone'}). "
            "Serve without --quantize, or install a torch that has it (torchao is its successor)."
        )
    layers, share = linear_weights(model)
    if share < MIN_LINEAR_SHARE:
        raise CheckpointError(
            f"--quantize int8 does not apply to checkpoint {path}: its torch.nn.Linear layers ({layers}) hold "
            f"{100 * share:.1f}% of its weights outside the embeddings, and dynamic int8 quantizes only those "
            f"(a {type(model).__name__}'s other layers, such as transformers' Conv1D, stay fp32), so it would serve "
            "about as slowly as fp32. Serve it without --quantize."
        )
    return {"method": METHOD, "engine": engine, "linear_layers": layers, "linear_share": round(share, 4)}


def quantize_int8(loaded: LoadedCheckpoint, drift_texts: tuple = ()) -> LoadedCheckpoint:
    """The checkpoint with its Linear layers in dynamic int8 (in place: the fp32 weights are not kept), or a
    CheckpointError saying why not (int8_applies). With drift_texts (the server's PROBE_TEXTS), in one pass: the fp32
    answers on them first, then int8, then int8's answers held against them (MAX_DRIFT; recorded as probe_drift)."""
    quantization = int8_applies(loaded)
    try:
        fp32_answers = predict_proba(loaded, list(drift_texts)) if drift_texts else None  # before int8 replaces them
        with warnings.catch_warnings():  # torch.ao.quantization announces its move to torchao on every call
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", UserWarning)
            qmodel = quantize_dynamic(
                loaded.model, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True
            )
        int8 = dataclasses.replace(loaded, model=qmodel, precision="int8", quantization=quantization)
        int8_answers = predict_proba(int8, list(drift_texts)) if drift_texts else None
    except Exception as err:  # torch's own error from quantize_dynamic or the probe texts, as one paragraph
        first = (str(err).splitlines() or [""])[0][:200]
        raise CheckpointError(
            f"--quantize int8 failed on checkpoint {loaded.path} ({type(err).__name__}: {first}). Serve it without "
            "--quantize."
        ) from None
    if int8_answers is not None:
        finite = bool(torch.isfinite(int8_answers).all())
        drift = float((int8_answers - fp32_answers).abs().max()) if finite else float("inf")
        if not drift <= MAX_DRIFT:
            raise CheckpointError(
                f"--quantize int8 would change checkpoint {loaded.path}'s answers too much: a class probability moved "
                f"by {drift:.2f} (more than {MAX_DRIFT}) on {len(drift_texts)} test texts, int8 against fp32. Some of "
                "its layers have weights int8 cannot represent finely enough (a few very large ones). Serve it "
                "without --quantize."
            )
        int8.quantization = {**quantization, "probe_drift": round(drift, 5)}
    return int8
