"""Chapter 06's memory calculator: what one rank holds at its peak to train a DistilBERT-shaped classifier.

    from distrinews_lib.course.memory import SHAPES, estimate, calculator
    e = estimate("distilbert-base", batch=8, seq=64, world=2, stage=0)   # plain DDP
    e.peak_mb, e.parts_mb                                                  # the peak and what it is made of
    calculator(overhead_mb=30.0)   # a fixed table; in Jupyter with ipywidgets, sliders too

Inputs: the model's shape, the batch per rank, the sequence length, the precision, the ZeRO stage (0 = plain DDP,
1 = optimizer state sharded, 2 = + gradients, 3 = + parameters; how torch and DeepSpeed implement each differs, see
`impl`), the world size and activation recomputation. The model of a step (fp32 AdamW, eager PyTorch on a CPU;
scripts/memory_footprint.py measures the same steps):

    peak = weights + optimizer state + DDP's buckets + max(activations, gradients + AdamW's temporaries) + runtime

- forward ends with every activation saved for backward alive and no gradient yet (zero_grad(set_to_none=True));
  backward frees activations as it creates gradients; the optimizer step needs all gradients and, per tensor,
  two temporaries the size of that tensor (AdamW's sqrt(v) and its quotient), so the largest tensor decides them;
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

import os
from dataclasses import dataclass, field

MB = 2**20


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
    "tiny": Shape(hidden=64, layers=2, heads=2, ffn=256),               # the course's default model
    "distilbert-base": Shape(hidden=768, layers=6, heads=12, ffn=3072),  # 66M parameters
}

# bytes per parameter: weight held for compute, gradient, optimizer state (incl. any fp32 master), activations
PRECISIONS = {
    "fp32": dict(weight=4, grad=4, optimizer=8, act=4),
    # the ZeRO paper's mixed precision: fp16 weights and gradients, fp32 master weight and two moments
    "mixed (fp16 + fp32 master)": dict(weight=2, grad=2, optimizer=12, act=2),
}


def zero1_split(sizes: list[int], world: int) -> list[int]:
    """torch's ZeroRedundancyOptimizer: whole tensors, largest first, each to the rank holding the least so far."""
    ranks = [0] * world
    for n in sorted(sizes, reverse=True):
        ranks[ranks.index(min(ranks))] += n
    return ranks


def activation_bytes(shape: Shape, batch: int, seq: int, act_bytes: int = 4, recompute: bool = False,
                     padded: bool = True) -> int:
    """Bytes autograd saves in one forward for backward (the live activations at the start of backward); with
    recomputation, the layers' inputs plus one layer recomputed in backward. `padded`: the batch has padding, so
    each layer's attention also keeps a batch x seq x seq mask (fp32)."""
    tokens = batch * seq
    per_layer = (16 * tokens * shape.hidden * act_bytes + tokens * (16 + 4 * shape.heads)  # + LayerNorm stats, LSE
                 + (4 * batch * seq * seq if padded else 0))
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
        return {k: v / MB for k, v in self.parts.items()}

    @property
    def peak_mb(self) -> float:
        return self.peak / MB


def estimate(model="tiny", batch: int = 8, seq: int = 64, precision: str = "fp32", stage: int = 0, world: int = 1,
             recompute: bool = False, bucket_view: bool = False, impl: str = "torch", overhead_mb: float = 0.0,
             rank: str = "fullest") -> Estimate:
    """One rank's peak memory for a training step, and its parts (bytes).

    stage 0: plain DDP; 1: ZeRO-1 (impl "torch": ZeroRedundancyOptimizer, whole tensors per rank; "even": an even
    split); 2 and 3: FSDP2 with reshard_after_forward off / on (impl "torch"), or an even split of gradients
    (and parameters) (impl "even"). rank "fullest" is the rank with the most optimizer state under ZeRO-1."""
    shape = SHAPES[model] if isinstance(model, str) else model
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: one of {', '.join(PRECISIONS)}")
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage {stage!r}: 0 (plain DDP), 1, 2 or 3")
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
    weight_share = 1 / N if stage >= 2 and impl == "torch" or stage == 3 else 1.0  # FSDP2 shards weights in both settings
    parts = {
        "weights": b["weight"] * P * weight_share,
        "optimizer state": b["optimizer"] * P * opt_share,
        "gradients": b["grad"] * P * grad_share,
        # DDP (plain and under torch's ZeRO-1) all-reduces flat bucket copies of the gradients
        "DDP buckets": b["grad"] * P if (N > 1 and stage <= 1 and not bucket_view) else 0,
        # AdamW (per-tensor, CPU) makes two temporaries the size of the largest tensor it updates
        "AdamW temporaries": 2 * 4 * biggest * (grad_share if stage >= 2 else 1.0),
        "activations": activation_bytes(shape, batch, seq, b["act"], recompute),
    }
    if stage >= 2 and N > 1:
        # FSDP2 gathers a whole unit's weights to compute with it, and makes its whole gradient before the
        # reduce-scatter; the root unit (the embeddings and the head) is the largest
        unit = shape.tensors()[:4] + shape.tensors()[-4:]
        parts["gathered unit"] = 3 * b["weight"] * sum(unit) * (1 - 1 / N)
    else:
        parts["gathered unit"] = 0
    parts["runtime"] = overhead_mb * MB
    held = parts["weights"] + parts["optimizer state"] + parts["DDP buckets"] + parts["runtime"] + parts["gathered unit"]
    peak = held + max(parts["activations"], parts["gradients"] + parts["AdamW temporaries"])
    return Estimate({k: int(v) for k, v in parts.items()}, int(peak))


def rel_error(predicted: float, measured: float) -> float:
    return abs(predicted - measured) / measured


# ----------------------------------------------------------------------------------------------------------------
# The calculator: sliders where there is a front end to move them, a fixed table everywhere else.

GRID = [  # (model, batch, seq, stage, world, recompute) rows of the fixed table
    ("tiny", 8, 64, 0, 2, False), ("tiny", 32, 128, 0, 2, False), ("tiny", 32, 128, 0, 2, True),
    ("distilbert-base", 8, 64, 0, 1, False), ("distilbert-base", 8, 64, 0, 2, False),
    ("distilbert-base", 32, 512, 0, 2, False), ("distilbert-base", 32, 512, 0, 2, True),
    ("distilbert-base", 32, 512, 1, 8, True), ("distilbert-base", 32, 512, 3, 8, True),
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
    head = (f"{'model':<16} {'batch':>5} {'seq':>4} {'ZeRO':>4} {'world':>5} {'recomp':>6} | {'weights':>8} {'grads':>7} "
            f"{'optim':>7} {'buckets':>7} {'activ':>7} {'peak MB':>8}")
    lines = [head, "-" * len(head)]
    for model, batch, seq, stage, world, rec in rows:
        e = estimate(model, batch, seq, precision, stage, world, rec, overhead_mb=overhead_mb)
        p = e.parts_mb
        lines.append(f"{model:<16} {batch:>5} {seq:>4} {stage:>4} {world:>5} {('yes' if rec else 'no'):>6} | "
                     f"{p['weights']:>8.0f} {p['gradients']:>7.0f} {p['optimizer state']:>7.0f} {p['DDP buckets']:>7.0f} "
                     f"{p['activations']:>7.0f} {e.peak_mb:>8.0f}")
    return "\n".join(lines)


def calculator(overhead_mb: float = 0.0):
    """The fixed table, printed everywhere; in a Jupyter front end with ipywidgets, sliders below it too.
    Returns the table's text."""
    text = table(overhead_mb=overhead_mb)
    print(f"{precision_note()}\n{text}")
    if not interactive():
        return text
    import ipywidgets as W
    from IPython.display import display

    def show(model, batch, seq, precision, stage, world, recompute):
        e = estimate(model, batch, seq, precision, stage, world, recompute, overhead_mb=overhead_mb)
        for k, v in e.parts_mb.items():
            print(f"{k:<18} {v:9.1f} MB")
        print(f"{'peak':<18} {e.peak_mb:9.1f} MB per rank")

    display(W.interactive(show, model=list(SHAPES), batch=W.IntSlider(8, 1, 256), seq=W.IntSlider(64, 8, 512, 8),
                          precision=list(PRECISIONS), stage=W.IntSlider(0, 0, 3), world=W.IntSlider(2, 1, 64),
                          recompute=False))
    return text


def precision_note() -> str:
    return "fp32 AdamW; MB per rank (the fullest rank); runtime included in the peak"
