"""Performance arithmetic for the benchmarks: FLOPs per token, MFU, device peaks, a step timer, provenance.

FLOPs per token (training: forward + backward)
------------------------------------------------
For a transformer encoder with N non-embedding parameters, L layers, hidden size d, and a sequence of
T tokens, one training step costs per token (the formula of Kaplan et al. 2020 / PaLM appendix B, as
nanoGPT's `estimate_mfu` uses it):

    flops_per_token = 6 * N  +  12 * L * d * T

* 6N: every weight does one multiply-add (2 FLOPs) per token in the forward pass, and the backward pass
  costs twice the forward (gradients w.r.t. activations and w.r.t. weights): 2N + 4N.
* 12·L·d·T: attention's two matmuls (Q·Kᵀ and softmax·V) are T·d multiply-adds each per token and layer,
  i.e. 4·d·T FLOPs forward, times 3 for forward + backward.
* N excludes the embedding tables (a lookup costs no matmul FLOPs). The classification head is counted
  as if it ran on every token although it runs on one token per text: an over-count of ~1% for
  DistilBERT-base (0.6M of 43M), stated rather than hidden.
* Only *model* FLOPs of real tokens count: padding is wasted work, so a run that pads more gets a lower
  MFU. For a batch, T is each text's own length: 12·L·d·Σᵢ Tᵢ² over the texts i.
* Elementwise work (LayerNorm, GELU, softmax, dropout, the optimizer) is not counted, as usual.

MFU = achieved model FLOP/s / the device's dense peak FLOP/s for the dtype the matmuls run in
(bf16/fp16 under AMP, fp32 or tf32 without). Peaks are NVIDIA datasheet dense (no 2:4 sparsity) figures.
CPUs have no entry: there the benchmarks report achieved TFLOP/s and no MFU.
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import statistics
import sys
import time
from dataclasses import asdict, dataclass

# --------------------------------------------------------------------------- device peaks

# Dense peak TFLOP/s per dtype, from NVIDIA's datasheets (sparsity figures halved away). Order matters:
# the first key whose every word occurs in torch.cuda.get_device_name() wins, so specific names go first.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989.0, "fp16": 989.0, "tf32": 494.5, "fp32": 66.9},
    "H100 PCIe": {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2},
    "H100 NVL": {"bf16": 835.0, "fp16": 835.0, "tf32": 417.5, "fp32": 60.0},
    "H100": {"bf16": 989.0, "fp16": 989.0, "tf32": 494.5, "fp32": 66.9},        # SXM5 / HBM3
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "L40S": {"bf16": 362.0, "fp16": 362.0, "tf32": 183.0, "fp32": 91.6},
    "L4": {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3},
    "A10": {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2},          # the A10, not AWS's A10G
    "T4": {"fp16": 65.0, "fp32": 8.1},                                         # Kaggle's GPU; no bf16
    "V100 PCIE": {"fp16": 112.0, "fp32": 14.0},
    "V100": {"fp16": 125.0, "fp32": 15.7},                                     # SXM2
    "P100": {"fp16": 18.7, "fp32": 9.3},                                       # PCIe, no tensor cores
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


def matmul_dtype(amp_mode: str, device_type: str) -> str:
    """The dtype the matmuls run in: the AMP dtype, else tf32 where torch allows it on CUDA, else fp32."""
    if amp_mode in ("bf16", "fp16"):
        return amp_mode
    if device_type == "cuda":
        import torch

        if torch.backends.cuda.matmul.allow_tf32:
            return "tf32"
    return "fp32"


# --------------------------------------------------------------------------- FLOPs

@dataclass
class ModelShape:
    n_params: int            # all parameters
    n_embedding: int         # embedding tables (lookups: no matmul FLOPs)
    n_layers: int
    dim: int

    @property
    def n_nonembedding(self) -> int:
        return self.n_params - self.n_embedding


def model_shape(model) -> ModelShape:
    """Parameter counts and (layers, hidden size) of a Hugging Face encoder (DistilBERT, BERT, MiniLM...)."""
    import torch

    bare = getattr(model, "module", model)
    bare = getattr(bare, "_orig_mod", bare)  # torch.compile wrapper
    n_params = sum(p.numel() for p in bare.parameters())
    n_emb = sum(m.weight.numel() for m in bare.modules() if isinstance(m, torch.nn.Embedding))
    cfg = bare.config
    layers = getattr(cfg, "n_layers", None) or getattr(cfg, "num_hidden_layers")
    dim = getattr(cfg, "dim", None) or getattr(cfg, "hidden_size")
    return ModelShape(n_params, n_emb, int(layers), int(dim))


def flops_per_token(shape: ModelShape, seq_len: float) -> float:
    """Training FLOPs per token for a sequence of `seq_len` tokens: 6·N + 12·L·d·T (see the module doc)."""
    return 6.0 * shape.n_nonembedding + 12.0 * shape.n_layers * shape.dim * seq_len


def training_flops(shape: ModelShape, lengths) -> float:
    """Model FLOPs of one training pass over texts of these real lengths: Σᵢ Tᵢ·(6N + 12·L·d·Tᵢ)."""
    lengths = [int(x) for x in lengths]
    tokens = sum(lengths)
    return 6.0 * shape.n_nonembedding * tokens + 12.0 * shape.n_layers * shape.dim * sum(t * t for t in lengths)


def mfu(flops_per_s: float, peak_tflops_value: float | None, n_devices: int = 1) -> float | None:
    """Model FLOPs utilisation in [0, 1], or None when the peak is unknown (e.g. a CPU)."""
    if not peak_tflops_value or flops_per_s <= 0:
        return None
    return flops_per_s / (peak_tflops_value * 1e12 * n_devices)


def format_rate(samples_per_s: float, tokens_per_s: float, tflops: float | None = None, mfu_value: float | None = None) -> str:
    """'1234 samples/s | 56789 tokens/s | 0.12 TFLOP/s | MFU 34.5%' (MFU only where the peak is known)."""
    out = f"{samples_per_s:8.1f} samples/s | {tokens_per_s:9.0f} tokens/s"
    if tflops is not None:
        out += f" | {tflops:.3f} TFLOP/s"
    if mfu_value is not None:
        out += f" | MFU {100 * mfu_value:.1f}%"
    return out


# --------------------------------------------------------------------------- timing

def sync(device) -> None:
    """Wait for queued GPU work so a wall-clock reading means what it says (no-op on CPU)."""
    if device is not None and getattr(device, "type", str(device)).startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


@dataclass
class StepTimer:
    """Times a window of steps after a warm-up: call `step()` after every step with what it processed.

    The clock starts at the end of warm-up step `warmup` (first kernels, allocator, lazy init excluded)
    and counts the next steps. CPU time of this process is recorded too: cpu_s / wall_s well below the
    number of threads means the cores were shared with someone else during the window.
    """

    warmup: int
    device: object = None
    steps: int = 0
    samples: int = 0
    tokens: int = 0
    padded_tokens: int = 0
    flops: float = 0.0
    _t0: float | None = None
    _c0: float | None = None
    _t1: float | None = None
    _c1: float | None = None
    _seen: int = 0

    def step(self, samples: int = 0, tokens: int = 0, padded_tokens: int = 0, flops: float = 0.0) -> None:
        """Call after each step. Steps 1..warmup are not counted; the clock starts when step `warmup` ends.
        With warmup=0, call start_now() before the first step."""
        sync(self.device)
        self._seen += 1
        if self._seen <= self.warmup:
            if self._seen == self.warmup:
                self._t0, self._c0 = time.perf_counter(), time.process_time()
            return
        if self._t0 is None:
            raise RuntimeError("StepTimer(warmup=0): call start_now() before the first step")
        self.steps += 1
        self.samples += samples
        self.tokens += tokens
        self.padded_tokens += padded_tokens
        self.flops += flops
        self._t1, self._c1 = time.perf_counter(), time.process_time()

    def start_now(self) -> None:
        """Start the clock explicitly (for warmup=0 timing of a block run by someone else)."""
        sync(self.device)
        self._t0, self._c0 = time.perf_counter(), time.process_time()

    def stop_now(self) -> None:
        sync(self.device)
        self._t1, self._c1 = time.perf_counter(), time.process_time()

    @property
    def seconds(self) -> float:
        return (self._t1 - self._t0) if self._t0 is not None and self._t1 is not None else 0.0

    def result(self) -> dict:
        s = self.seconds
        return {
            "steps": self.steps, "samples": self.samples, "tokens": self.tokens, "padded_tokens": self.padded_tokens,
            "seconds": round(s, 6),
            "samples_per_s": self.samples / s if s > 0 else 0.0,
            "tokens_per_s": self.tokens / s if s > 0 else 0.0,
            "padding_fraction": 1 - self.tokens / self.padded_tokens if self.padded_tokens else None,
            "model_tflops": self.flops / s / 1e12 if s > 0 and self.flops else None,
            "cpu_s": round(self._c1 - self._c0, 6) if self._c0 is not None and self._c1 is not None else None,
        }


# --------------------------------------------------------------------------- a shared CPU: who else is using it

def cpu_busy_seconds() -> float | None:
    """CPU-seconds the whole machine has been busy since boot (all cores; Linux /proc/stat), or None.

    Busy = user + nice + system + irq + softirq + steal (steal: a hypervisor gave our vCPU to someone else)."""
    try:
        fields = open("/proc/stat").readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def foreign_cores(busy_before: float | None, busy_after: float | None, own_cpu_s: float, seconds: float) -> float | None:
    """Average number of cores that *other* processes kept busy during a window of `seconds`."""
    if busy_before is None or busy_after is None or seconds <= 0:
        return None
    return max(0.0, (busy_after - busy_before - own_cpu_s) / seconds)


def wait_for_quiet(max_foreign_cores: float = 0.3, sample_s: float = 0.5, timeout_s: float = 15.0) -> dict:
    """Wait (up to timeout_s) until the other processes on this machine use at most `max_foreign_cores`.

    Call it while this process is idle: everything /proc/stat counts as busy then is someone else's.
    Returns {'waited_s', 'foreign_cores'} (the last sample)."""
    start = time.perf_counter()
    load = None
    while True:
        b0 = cpu_busy_seconds()
        if b0 is None:
            return {"waited_s": 0.0, "foreign_cores": None}
        c0 = time.process_time()
        time.sleep(sample_s)
        load = foreign_cores(b0, cpu_busy_seconds(), time.process_time() - c0, sample_s)
        waited = time.perf_counter() - start
        if load <= max_foreign_cores or waited >= timeout_s:
            return {"waited_s": round(waited, 2), "foreign_cores": round(load, 3)}


class QuietGate:
    """wait_for_quiet with a total budget, so waiting for a shared CPU can never make a run much longer."""

    def __init__(self, max_foreign_cores: float = 0.3, timeout_each_s: float = 4.0, budget_s: float = 60.0):
        self.max_foreign_cores, self.timeout_each_s, self.budget_s = max_foreign_cores, timeout_each_s, budget_s
        self.spent_s = 0.0

    def wait(self) -> dict | None:
        left = min(self.timeout_each_s, self.budget_s - self.spent_s)
        if left <= 0:
            return None
        out = wait_for_quiet(self.max_foreign_cores, timeout_s=left)
        self.spent_s += out["waited_s"]
        return out


# --------------------------------------------------------------------------- statistics

def summary(values) -> dict:
    """median / min / max / n of a list of numbers (the median is what the benchmarks quote)."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


# --------------------------------------------------------------------------- provenance

def machine_slug() -> str:
    """A short file-name-safe name for this machine: 'cpu2-amd-epyc', '2x-tesla-t4', '1x-nvidia-h100-80gb-hbm3'."""
    import torch

    from .tracking import _cpu_name

    if torch.cuda.is_available():
        name, n = torch.cuda.get_device_name(0), torch.cuda.device_count()
        base = f"{n}x-{name}"
    else:
        base = f"cpu{os.cpu_count()}-{_cpu_name()}"
    slug = re.sub(r"[^a-z0-9]+", "-", base.lower()).strip("-")
    return re.sub(r"-(processor|cpu|\d+-core)$", "", slug)[:60]


def load_average() -> list | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def provenance(argv=None) -> dict:
    """Who/what/where produced a benchmark file: machine, devices, versions, git commit, exact command."""
    import torch

    from .tracking import git_commit, machine_info, versions

    argv = sys.argv if argv is None else argv
    info = {
        "machine": machine_slug(),
        "machine_info": machine_info(),
        "cpu": machine_info()["processor"],
        "gpu": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else None,
        "versions": versions(),
        "git_commit": git_commit(),
        "git_dirty": _git_dirty(),
        "command": " ".join(shlex.quote(a) for a in ["python", *argv]),
        "cwd": os.getcwd(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "load_average_at_start": load_average(),
        "python": platform.python_version(),
    }
    for pkg in ("accelerate",):
        try:
            info["versions"][pkg] = __import__(pkg).__version__
        except ImportError:
            info["versions"][pkg] = None
    return info


def _git_dirty() -> bool | None:
    import subprocess
    from pathlib import Path

    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                             timeout=5, cwd=Path(__file__).resolve().parent).stdout
        return bool(out.strip())
    except (OSError, subprocess.SubprocessError):
        return None


def as_jsonable(obj):
    """Dataclasses, tuples and torch dtypes into plain JSON types."""
    if hasattr(obj, "__dataclass_fields__"):
        return as_jsonable(asdict(obj))
    if isinstance(obj, dict):
        return {str(k): as_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [as_jsonable(v) for v in obj]
    if isinstance(obj, float):
        return None if obj != obj else obj  # NaN is not JSON
    if obj is None or isinstance(obj, (int, str, bool)):
        return obj
    return str(obj)
