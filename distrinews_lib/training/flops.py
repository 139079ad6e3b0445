"""FLOPs and MFU. Per token of a training step (forward + backward), for N non-embedding parameters, L layers,
hidden size d and a text of T tokens (Kaplan et al. 2020 / PaLM appendix B, as nanoGPT's estimate_mfu):

    flops_per_token = 6 * N  +  12 * L * d * T
    (6N: 2 FLOPs per weight forward, twice that backward; 12LdT: Q·Kᵀ and softmax·V, both passes)

Only real tokens count (padding is wasted work); the head is counted on every token (~1% over for DistilBERT);
elementwise work is not counted. MFU divides by the device's dense datasheet peak for the matmuls' dtype; CPUs
have no entry (no MFU there).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from ..checkpoint import unwrap

# Dense peak TFLOP/s per dtype, from NVIDIA's datasheets (sparsity figures halved away). Order matters:
# the first key whose every word occurs in torch.cuda.get_device_name() wins, so specific names go first.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989.0, "fp16": 989.0, "tf32": 494.5, "fp32": 66.9},
    "H100 PCIe": {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2},
    "H100 NVL": {"bf16": 835.0, "fp16": 835.0, "tf32": 417.5, "fp32": 60.0},
    "H100": {"bf16": 989.0, "fp16": 989.0, "tf32": 494.5, "fp32": 66.9},  # SXM5 / HBM3
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "L40S": {"bf16": 362.0, "fp16": 362.0, "tf32": 183.0, "fp32": 91.6},
    "L4": {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3},
    "A10": {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2},  # the A10, not AWS's A10G
    "T4": {"fp16": 65.0, "fp32": 8.1},  # Kaggle's GPU; no bf16
    "V100 PCIE": {"fp16": 112.0, "fp32": 14.0},
    "V100": {"fp16": 125.0, "fp32": 15.7},  # SXM2
    "P100": {"fp16": 18.7, "fp32": 9.3},  # PCIe, no tensor cores
}
NOT_IN_TABLE = ("A10G",)  # names that would match an entry above but are different chips


def peak_tflops(device_name: str, dtype: str) -> float | None:
    """Dense peak TFLOP/s of `device_name` for `dtype` ('bf16', 'fp16', 'tf32', 'fp32'), or None if unknown."""
    name = device_name.upper()
    if any(x.upper() in name for x in NOT_IN_TABLE):
        return None
    for key, peaks in PEAK_TFLOPS.items():
        if all(re.search(rf"(?<![A-Z0-9]){re.escape(w.upper())}(?![0-9])", name) for w in key.split()):
            return peaks.get(dtype)
    return None


def cuda_matmul_tf32() -> bool:
    """Whether cuBLAS runs fp32 matmuls in TF32, whichever API turned it on or off. torch >= 2.9 has two: the legacy
    `allow_tf32` flag and `fp32_precision` ("tf32", "ieee", or "none": inherit from `torch.backends.fp32_precision`).
    Once the new one has been set (Trainer does), reading the legacy flag raises "mix of the legacy and new APIs";
    the new one reads either way, so it is read first."""
    matmul = torch.backends.cuda.matmul
    precision = getattr(matmul, "fp32_precision", None)
    if precision is None:  # torch < 2.9: the legacy flag is the only one
        return bool(matmul.allow_tf32)
    if precision == "none":
        precision = getattr(torch.backends, "fp32_precision", "none")
    return precision == "tf32"


def matmul_dtype(amp_mode: str, device_type: str) -> str:
    """The dtype the matmuls run in: the AMP dtype, else tf32 where torch allows it on CUDA, else fp32."""
    if amp_mode in ("bf16", "fp16"):
        return amp_mode
    if device_type == "cuda" and cuda_matmul_tf32():
        return "tf32"
    return "fp32"


@dataclass
class ModelShape:
    n_params: int  # all parameters
    n_embedding: int  # embedding tables (lookups: no matmul FLOPs)
    n_layers: int
    dim: int

    @property
    def n_nonembedding(self) -> int:
        return self.n_params - self.n_embedding


def model_shape(model) -> ModelShape:
    """Parameter counts and (layers, hidden size) of a Hugging Face encoder (DistilBERT, BERT, MiniLM...)."""
    bare = unwrap(model)
    n_params = sum(p.numel() for p in bare.parameters())
    n_emb = sum(m.weight.numel() for m in bare.modules() if isinstance(m, torch.nn.Embedding))
    cfg = bare.config
    layers = getattr(cfg, "n_layers", None) or getattr(cfg, "num_hidden_layers")
    dim = getattr(cfg, "dim", None) or getattr(cfg, "hidden_size")
    return ModelShape(n_params, n_emb, int(layers), int(dim))


def training_flops_from_sums(shape: ModelShape, tokens: int, sum_sq_len: int) -> float:
    """Model FLOPs of one training pass over texts with Σ Tᵢ = tokens and Σ Tᵢ² = sum_sq_len (THE formula)."""
    return 6.0 * shape.n_nonembedding * tokens + 12.0 * shape.n_layers * shape.dim * sum_sq_len


def mfu(flops_per_s: float, peak_tflops_value: float | None, n_devices: int = 1) -> float | None:
    if not peak_tflops_value or flops_per_s <= 0:
        return None
    return flops_per_s / (peak_tflops_value * 1e12 * n_devices)


def device_peak(device, amp_mode: str) -> float | None:
    """The device's dense peak TFLOP/s for the dtype its matmuls run in; None on a CPU or an unknown GPU."""
    if device.type != "cuda":
        return None
    return peak_tflops(torch.cuda.get_device_name(device), matmul_dtype(amp_mode, device.type))


def epoch_mfu(stats, shape: ModelShape, peak: float | None, n_devices: int = 1) -> float | None:
    if not peak or not stats.seconds:
        return None
    return mfu(training_flops_from_sums(shape, stats.tokens, stats.sum_sq_len) / stats.seconds, peak, n_devices)


def model_mfu(stats, model, amp, n_devices: int = 1) -> float | None:
    """An epoch's MFU for `model` (bare, DDP- or compile-wrapped; amp: precision.AmpSettings): model FLOPs per second
    over the peak of the device its weights are on. None on a CPU or an unknown GPU. Counting the parameters takes
    well under a millisecond."""
    device = next(unwrap(model).parameters()).device
    return epoch_mfu(stats, model_shape(model), device_peak(device, amp.mode), n_devices)


def mfu_percent(mfu: float) -> str:
    """'34.5%', or four decimals below 1% (a tiny model on an H200 runs at 0.003%, which one decimal shows as 0.0)."""
    return f"{100 * mfu:.{1 if mfu >= 0.01 else 4}f}%"
