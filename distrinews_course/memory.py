"""Chapter 06's memory calculator: what one rank holds at its peak to train a DistilBERT-shaped classifier.

    from distrinews_course.memory import SHAPES, estimate, calculator
    e = estimate("distilbert-base", batch=8, seq=64, world=2, stage=0)   # plain DDP
    e.peak_mb, e.parts_mb                                                  # the peak and what it is made of, MiB
    calculator(overhead_mb=30.0)   # a fixed table; in Jupyter with ipywidgets, sliders too

Sizes are bytes, or MiB (2^20 bytes) where a name ends in _mb (the names predate the unit's spelling).

Inputs: the model's shape, the batch per rank, the sequence length, the precision, the ZeRO stage (0 = plain DDP,
1 = optimizer state sharded, 2 = + gradients, 3 = + parameters; how torch and DeepSpeed implement each differs, see
`impl`), the world size, activation recomputation and AdamW's implementation. The model of a step (fp32 AdamW, eager
PyTorch; scripts/memory_footprint.py measures the same steps on a CPU):

    peak = weights + optimizer state + DDP's buckets + max(activations, gradients + AdamW's temporaries) + runtime
           (+ one gathered unit under ZeRO-2/3, FSDP: see `estimate`)

- forward ends with every activation saved for backward alive and no gradient yet (zero_grad(set_to_none=True));
  backward frees activations as it creates gradients; the optimizer step needs all gradients and AdamW's
  temporaries, which depend on its implementation (`adamw`; torch picks it when foreach and fused are left None):
  "for-loop", torch's default for CPU tensors, updates tensor by tensor with two temporaries the size of that
  tensor (sqrt(v) and its quotient), so the largest tensor decides them; "foreach", torch's default on CUDA,
  computes torch._foreach_sqrt(exp_avg_sqs) for the whole parameter list at once: one fp32 temporary per
  parameter, all alive together (4 bytes x every parameter this rank updates); "fused" (fused=True) makes none;
- DDP keeps a flat copy of every gradient in its buckets for the all-reduce (unless gradient_as_bucket_view=True,
  which makes the gradients views of the buckets) on more than one rank;
- activations: DistilBERT's layer saves 16 tensors of batch x seq x hidden numbers (the layer's input is the
  previous layer's output): q, k, v, the attention's output and its reshaped copy, the residual sum, the layer
  norm's output, 4 for the FFN's hidden layer before GELU and 4 after it, the second residual sum; the embeddings
  save 2 more. PyTorch's fused attention (SDPA) saves no batch x heads x seq^2 scores (the plain "eager" attention
  would), but with padding each layer keeps the batch x seq x seq mask. Recomputation keeps only each layer's
  input and recomputes one layer at a time in backward;
- runtime: what the process holds that is no tensor of the step (the model's Python objects, library workspaces,
  the process group); measured once per machine at a tiny batch, not derived.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field

MiB = 2**20
MIXED_FSDP = "mixed (fp16 compute, fp32 master and gradients)"  # FSDP2's MixedPrecisionPolicy split (PRECISIONS)
MB = MiB  # the old name, kept for callers: it always meant 2^20 bytes
ADAMW = ("for-loop", "foreach", "fused")  # AdamW's implementations (torch's defaults: for-loop on CPU, foreach on CUDA)


@dataclass(frozen=True)
class Shape:
    """A DistilBERT-shaped sequence classifier."""

    hidden: int
    layers: int
    heads: int
    ffn: int
    vocab: int = 30522
    positions: int = 512
    labels: int = 4

    def tensors(self) -> list[int]:
        """The number of elements of every parameter tensor, as the model builds them."""
        h, f = self.hidden, self.ffn
        out = [self.vocab * h, self.positions * h, h, h]  # word and position embeddings, LayerNorm
        for _ in range(self.layers):
            out += [h * h, h] * 4 + [h, h] + [f * h, f, h * f, h] + [h, h]
        return out + [h * h, h, self.labels * h, self.labels]

    @property
    def n_params(self) -> int:
        return sum(self.tensors())


SHAPES = {
    "tiny": Shape(hidden=64, layers=2, heads=2, ffn=256),  # the course's default model
    "distilbert-base": Shape(hidden=768, layers=6, heads=12, ffn=3072),  # 66M parameters
}

# bytes per parameter: weight held for compute, gradient, optimizer state (incl. any fp32 master), activations
PRECISIONS = {
    "fp32": dict(weight=4, grad=4, optimizer=8, act=4),
    # the ZeRO paper's mixed precision: fp16 weights and gradients, fp32 master weight and two moments
    "mixed (fp16 + fp32 master)": dict(weight=2, grad=2, optimizer=12, act=2),
    # FSDP2's MixedPrecisionPolicy(param_dtype=float16 or bfloat16, reduce_dtype=float32), as ZeRO-3 by hand's
    # param_dtype (chapter 03 measures it at stage 3): the fp32 master IS the weight a rank keeps, the gradients land
    # on it in fp32; only what a block computes with is 2 bytes: its gathered weights, their gradients, the
    # activations (`compute`: the bytes of that copy)
    MIXED_FSDP: dict(weight=4, grad=4, optimizer=8, act=2, compute=2),
}


def zero1_split(sizes: list[int], world: int) -> list[int]:
    """torch's ZeroRedundancyOptimizer: whole tensors, largest first, each to the rank holding the least so far."""
    ranks = [0] * world
    for n in sorted(sizes, reverse=True):
        ranks[ranks.index(min(ranks))] += n
    return ranks


def activation_bytes(
    shape: Shape, batch: int, seq: int, act_bytes: int = 4, recompute: bool = False, padded: bool = True
) -> int:
    """Bytes autograd saves in one forward for backward (the live activations at the start of backward); with
    recomputation, the layers' inputs plus one layer recomputed in backward. `padded`: the batch has padding, so
    each layer's attention also keeps a batch x seq x seq mask (fp32)."""
    tokens = batch * seq
    per_layer = (
        16 * tokens * shape.hidden * act_bytes
        + tokens * (16 + 4 * shape.heads)  # + LayerNorm stats, LSE
        + (4 * batch * seq * seq if padded else 0)
    )
    edges = 2 * tokens * shape.hidden * act_bytes + 28 * tokens  # the embeddings; ids, mask and position ids
    if recompute:
        return shape.layers * tokens * shape.hidden * act_bytes + edges + per_layer
    return shape.layers * per_layer + edges


@dataclass
class Estimate:
    parts: dict = field(default_factory=dict)  # bytes
    peak: int = 0

    @property
    def parts_mb(self) -> dict:
        return {k: v / MiB for k, v in self.parts.items()}

    @property
    def peak_mb(self) -> float:
        return self.peak / MiB


def estimate(
    model="tiny",
    batch: int = 8,
    seq: int = 64,
    precision: str = "fp32",
    stage: int = 0,
    world: int = 1,
    recompute: bool = False,
    bucket_view: bool = False,
    impl: str = "torch",
    overhead_mb: float = 0.0,
    rank: str = "fullest",
    adamw: str = "for-loop",
) -> Estimate:
    """One rank's peak memory for a training step, and its parts (bytes). overhead_mb: the runtime, in MiB.

    stage 0: plain DDP; 1: ZeRO-1 (impl "torch": ZeroRedundancyOptimizer, whole tensors per rank; "even": an even
    split); 2 and 3: FSDP2 with reshard_after_forward off / on (impl "torch"), or an even split of gradients
    (and parameters) (impl "even"). rank "fullest" is the rank with the most optimizer state under ZeRO-1.
    adamw: "for-loop" (torch's default on a CPU), "foreach" (its default on CUDA) or "fused" (see the module's doc)."""
    shape = SHAPES[model] if isinstance(model, str) else model
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: one of {', '.join(PRECISIONS)}")
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage {stage!r}: 0 (plain DDP), 1, 2 or 3")
    if adamw not in ADAMW:
        raise ValueError(
            f"adamw {adamw!r}: one of {', '.join(ADAMW)} (torch's default: for-loop on a CPU, foreach on CUDA)"
        )
    b = PRECISIONS[precision]
    sizes = shape.tensors()
    P, N = sum(sizes), max(1, int(world))
    biggest = max(sizes)
    # the fraction of the optimizer state (and, from stage 2 / 3, of gradients / weights) this rank holds
    if stage >= 1 and N > 1:
        split = zero1_split(sizes, N) if (stage == 1 and impl == "torch") else [P / N] * N
        opt_share = (max(split) if rank == "fullest" else min(split)) / P
    else:
        opt_share = 1.0
    grad_share = 1 / N if stage >= 2 else 1.0
    weight_share = (
        1 / N if stage >= 2 and impl == "torch" or stage == 3 else 1.0
    )  # FSDP2 shards weights in both settings
    parts = {
        "weights": b["weight"] * P * weight_share,
        "optimizer state": b["optimizer"] * P * opt_share,
        "gradients": b["grad"] * P * grad_share,
        # DDP (plain and under torch's ZeRO-1) all-reduces flat bucket copies of the gradients
        "DDP buckets": b["grad"] * P if (N > 1 and stage <= 1 and not bucket_view) else 0,
        # fp32 temporaries (the moments are fp32 in both precisions):
        # two of the largest tensor, one of every tensor, none
        "AdamW temporaries": {
            "for-loop": 2 * 4 * biggest * (grad_share if stage >= 2 else 1.0),
            "foreach": 4 * P * opt_share,
            "fused": 0,
        }[adamw],
        "activations": activation_bytes(shape, batch, seq, b["act"], recompute),
    }
    # what forward and backward compute with, where it is not the weight kept (MIXED_FSDP): the weights' cast
    compute = b.get("compute", b["weight"])
    if stage >= 2 and N > 1:
        # FSDP2 gathers a whole unit's weights to compute with it, and makes its whole gradient (both in the compute
        # dtype) and its flat copy for the reduce-scatter (in the gradients' dtype); the root unit (the embeddings and
        # the head) is the largest
        unit = shape.tensors()[:4] + shape.tensors()[-4:]
        parts["gathered unit"] = (2 * compute + b["grad"]) * sum(unit) * (1 - 1 / N)
        if impl == "torch":
            # FSDP2 all-gathers a unit into one flat buffer, then copies each parameter out into storage of its own:
            # for that moment the unit is whole twice (ZeRO-3 by hand gathers straight into the parameters' storage)
            parts["gathered unit"] += compute * sum(unit)
    else:
        # unsharded, a low-precision compute copy of every weight lives through forward and backward (not measured)
        parts["gathered unit"] = compute * P if compute != b["weight"] else 0
    parts["runtime"] = overhead_mb * MiB
    held = (
        parts["weights"] + parts["optimizer state"] + parts["DDP buckets"] + parts["runtime"] + parts["gathered unit"]
    )
    peak = held + max(parts["activations"], parts["gradients"] + parts["AdamW temporaries"])
    return Estimate({k: int(v) for k, v in parts.items()}, int(peak))


def rel_error(predicted: float, measured: float) -> float:
    return abs(predicted - measured) / measured


# ----------------------------------------------------------------------------------------------------------------
# The calculator: sliders where there is a front end to move them, a fixed table everywhere else.

GRID = [  # (model, batch, seq, stage, world, recompute) rows of the fixed table
    ("tiny", 8, 64, 0, 2, False),
    ("tiny", 32, 128, 0, 2, False),
    ("tiny", 32, 128, 0, 2, True),
    ("distilbert-base", 8, 64, 0, 1, False),
    ("distilbert-base", 8, 64, 0, 2, False),
    ("distilbert-base", 32, 512, 0, 2, False),
    ("distilbert-base", 32, 512, 0, 2, True),
    ("distilbert-base", 32, 512, 1, 8, True),
    ("distilbert-base", 32, 512, 3, 8, True),
]


def interactive() -> bool:
    """True in a Jupyter front end with ipywidgets installed; False under papermill, nbval or plain Python."""
    try:
        import ipywidgets  # noqa: F401
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):
        return False
    # a kernel a Jupyter server (or VS Code, Colab) started carries one of these; papermill's and nbval's do not
    # (both get JPY_PARENT_PID from jupyter_client, so that one says nothing)
    return any(k in os.environ for k in ("JPY_SESSION_NAME", "VSCODE_PID", "COLAB_RELEASE_TAG"))


def table(rows=GRID, precision: str = "fp32", overhead_mb: float = 0.0) -> str:
    """The calculator's rows, each with every part its peak adds: peak = weights + optim + buckets + gather +
    runtime (overhead_mb, one figure for every row) + max(activ, grads + temps)."""
    head = (
        f"{'model':<16} {'batch':>5} {'seq':>4} {'ZeRO':>4} {'world':>5} {'recomp':>6} | {'weights':>7} {'grads':>6} "
        f"{'optim':>6} {'buckets':>7} {'temps':>6} {'gather':>6} {'activ':>6} {'peak MiB':>8}"
    )
    lines = [head, "-" * len(head)]
    for model, batch, seq, stage, world, rec in rows:
        e = estimate(model, batch, seq, precision, stage, world, rec, overhead_mb=overhead_mb)
        p = e.parts_mb
        lines.append(
            f"{model:<16} {batch:>5} {seq:>4} {stage:>4} {world:>5} {('yes' if rec else 'no'):>6} | "
            f"{p['weights']:>7.0f} {p['gradients']:>6.0f} {p['optimizer state']:>6.0f} {p['DDP buckets']:>7.0f} "
            f"{p['AdamW temporaries']:>6.0f} {p['gathered unit']:>6.0f} {p['activations']:>6.0f} {e.peak_mb:>8.0f}"
        )
    return "\n".join(lines)


def calculator(overhead_mb: float = 0.0):
    """The fixed table, printed everywhere; in a Jupyter front end with ipywidgets, sliders below it too.
    Returns the table's text."""
    text = table(overhead_mb=overhead_mb)
    print(f"{precision_note(overhead_mb)}\n{text}")
    if not interactive():
        return text
    import ipywidgets as W
    from IPython.display import display

    def show(model, batch, seq, precision, stage, world, recompute, adamw):
        e = estimate(model, batch, seq, precision, stage, world, recompute, overhead_mb=overhead_mb, adamw=adamw)
        for k, v in e.parts_mb.items():
            print(f"{k:<18} {v:9.1f} MiB")
        print(f"{'peak':<18} {e.peak_mb:9.1f} MiB per rank")

    display(
        W.interactive(
            show,
            model=list(SHAPES),
            batch=W.IntSlider(8, 1, 256),
            seq=W.IntSlider(64, 8, 512, 8),
            precision=list(PRECISIONS),
            stage=W.IntSlider(0, 0, 3),
            world=W.IntSlider(2, 1, 64),
            recompute=False,
            adamw=list(ADAMW),
        )
    )
    return text


def precision_note(overhead_mb: float = 0.0) -> str:
    return (
        "fp32 AdamW (torch's CPU default, tensor by tensor); MiB per rank (the fullest rank)\n"
        f"peak = weights + optim + buckets + gather (one gathered unit, ZeRO-2/3) + runtime ({overhead_mb:.1f} MiB) + "
        "max(activ, grads + temps)"
    )


def judge_peak_prediction(
    yours_mb,
    model="tiny",
    batch: int = 8,
    seq: int = 64,
    recompute: bool = False,
    world: int = 1,
    overhead_mb: float = 0.0,
    tolerance: float = 0.10,
) -> tuple[bool, str]:
    """A learner's prediction of one rank's peak (MiB, plain DDP, fp32, CPU AdamW) against the calculator: right
    within `tolerance`, or which part of the step their number left out or counted wrong."""
    if not isinstance(yours_mb, (int, float)) or isinstance(yours_mb, bool) or yours_mb <= 0:
        return False, f"write a positive number of MiB, not {yours_mb!r}"
    e = estimate(model, batch, seq, world=world, recompute=recompute, overhead_mb=overhead_mb)
    p = e.parts
    if rel_error(yours_mb * MiB, e.peak) <= tolerance:
        sets = (
            "activations"
            if p["activations"] > p["gradients"] + p["AdamW temporaries"]
            else "gradients plus AdamW's temporaries"
        )
        return True, f"right: the {sets} set the peak at this setting"
    held = e.peak - max(p["activations"], p["gradients"] + p["AdamW temporaries"])
    mistakes = [  # (the peak a learner gets with one slip, what the slip is)
        (e.peak - p["runtime"], f"you left out the runtime ({p['runtime'] / MiB:.1f} MiB, measured in section 2)"),
        (
            held + p["gradients"] + p["AdamW temporaries"],
            f"you let the gradients and AdamW's temporaries set the peak; here the activations "
            f"({p['activations'] / MiB:.1f} MiB) outgrow them",
        ),
        (
            held + p["activations"],
            f"you let the activations set the peak; here the gradients plus AdamW's temporaries "
            f"({(p['gradients'] + p['AdamW temporaries']) / MiB:.1f} MiB) outgrow them",
        ),
        (
            e.peak - p["weights"] - p["optimizer state"],
            "you left out what is held all the time: the weights and AdamW's two moments",
        ),
    ]
    if recompute:
        full = estimate(model, batch, seq, world=world, recompute=False, overhead_mb=overhead_mb)
        mistakes.append(
            (
                full.peak,
                "you counted every layer's activations; recomputation keeps only each layer's "
                "input, plus one layer's activations recomputed in backward",
            )
        )
    slip = min(mistakes, key=lambda m: abs(m[0] - yours_mb * MiB))
    if rel_error(yours_mb * MiB, slip[0]) <= tolerance / 2:
        return False, f"not yet: {slip[1]}"
    off = yours_mb - e.peak_mb
    return False, (
        f"not yet: {abs(off):.0f} MiB {'above' if off > 0 else 'below'} the calculator; add up weights, "
        "optimizer state, runtime, and the larger of the activations and gradients + AdamW's temporaries"
    )


def _adamw_step_peaks(model: str, repeats: int = 3) -> dict:
    """Run in a fresh process (see measure_adamw_temporaries): for each AdamW implementation, the peak resident
    memory of one step above the memory just before it, the weights, gradients and moments of `model`'s shape
    already allocated (the first step allocates the moments; the second is measured); `repeats` times each, in turn,
    so that the spread of one measurement shows beside it."""
    import ctypes
    import gc
    from pathlib import Path

    import torch

    def status(field):
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field))
        return int(line.split()[1]) * 1024

    # Every block of 4 KiB or more gets pages of its own (M_MMAP_THRESHOLD) and the heap never shrinks
    # (M_TRIM_THRESHOLD): a small tensor's temporary can then neither reuse freed heap nor hide behind a trim, and the
    # peak counts it
    libc = ctypes.CDLL(None)
    libc.mallopt(-3, 4096)
    libc.mallopt(-1, 1 << 30)
    torch.set_num_threads(1)
    sizes = SHAPES[model].tensors()
    out = {impl: [] for impl in ADAMW}
    for _, impl in itertools.product(range(repeats), ADAMW):
        params = [torch.nn.Parameter(torch.full((n,), 0.5)) for n in sizes]
        for p in params:
            p.grad = torch.full_like(p, 0.01)
        kind = {"for-loop": dict(foreach=False), "foreach": dict(foreach=True), "fused": dict(fused=True)}[impl]
        opt = torch.optim.AdamW(params, lr=1e-3, **kind)
        opt.step()
        gc.collect()
        before = status("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from here
        opt.step()
        out[impl].append(status("VmHWM") - before)
        del opt, params
        gc.collect()
    return out


def measure_adamw_temporaries(model: str = "distilbert-base", timeout: float = 300) -> dict:
    """Bytes one AdamW step allocates above the weights, gradients and moments, per implementation, measured 3 times
    each in a fresh process on this CPU ("foreach" forced on: the code path torch takes by default on CUDA):
    {implementation: [bytes, bytes, bytes]}. Linux only (it reads /proc/self/status); DistilBERT-base's shape needs
    about 1.5 GiB for a few seconds."""
    import json
    import sys

    if not os.path.exists("/proc/self/clear_refs"):
        raise RuntimeError("measure_adamw_temporaries reads the peak from Linux's /proc/self; this is not Linux")
    from .launch import run

    res = run([sys.executable, "-m", "distrinews_course.memory", "adamw-step", model], timeout=timeout, echo=False)
    return json.loads(res.output.strip().splitlines()[-1])


if __name__ == "__main__":
    import json
    import sys

    if sys.argv[1:2] == ["adamw-step"] and len(sys.argv) == 3 and sys.argv[2] in SHAPES:
        print(json.dumps(_adamw_step_peaks(sys.argv[2])))
    else:
        raise SystemExit(f"usage: python -m distrinews_course.memory adamw-step {{{','.join(SHAPES)}}}")
