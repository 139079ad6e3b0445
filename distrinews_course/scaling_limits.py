"""How many devices DDP, ZeRO-3 and HSDP can use on the course's model before a step's communication takes longer
than its computation: Stanford CS336's cost question, on paper, and one point of it measured on the box's dialed link
(chapter 03).

    s = SETTINGS["kaggle_t4"]                    # a link (alpha, beta per level) and a device (its peak, an MFU)
    limit("ddp", s)                              # {"n_max": ..., "rows": [{"n", "comm_s", "compute_s"}, ...]}
    table()                                      # every strategy at every setting
    point("ddp", 2, box(mbit), model_bytes, compute_s)   # the box's dialed link, for the measured point

The question is asked at a fixed global batch (strong scaling, as the course's presets fix it): N devices each compute
1/N of the batch, so computation per step falls as 1/N, while what each device sends per step does not fall (a ring
sends 2(N-1)/N of the gradients for an all-reduce, nearly twice them at any N). Past some N the step waits on the link
however well communication overlaps computation: that N is the strategy's limit. n_max is the largest N of 1, 2, 4,
... (up to one example per device) at which a step's communication still fits in its computation.

A step's communication is what each strategy sends (chapter 08's plan of collectives, two_level.plan) at the cost of
the level each collective crosses: alpha per step of the ring plus the bytes at the level's rate (chapter 05's alpha
and beta):
  ddp    one all-reduce of the fp32 gradients over every device; past one node, the ring leaves each node by one edge;
  zero3  per block (each transformer layer, and the rest), two all-gathers of its weights in param_dtype (2 bytes:
         ZeRO-3 by hand's and FSDP2's mixed precision) and a reduce-scatter of its fp32 gradients, over every device;
  hsdp   zero3 inside a node, then an all-reduce of each gradient shard (1/g of the block) across the nodes.
The settings are the published figures of chapter 05's cluster_model, labelled as estimates: the results are too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import cluster_model, memory, two_level

STRATEGIES = ("ddp", "zero3", "hsdp")
PLAN = {"ddp": "ddp", "zero3": "fsdp", "hsdp": "hsdp"}  # two_level's name for each strategy's collectives


@dataclass(frozen=True)
class Level:
    """One level of links: alpha per step of a ring (seconds), beta per byte (seconds; a node's link for the level
    between nodes)."""

    alpha_s: float
    beta_s_per_byte: float

    @classmethod
    def of(cls, link: cluster_model.Link) -> Level:
        return cls(link.alpha_us * 1e-6, 1 / (link.gb_s * 1e9))

    def seconds(self, steps: int, nbytes: float) -> float:
        return steps * self.alpha_s + nbytes * self.beta_s_per_byte


@dataclass(frozen=True)
class Setting:
    name: str
    per_node: int  # devices per node
    intra: Level  # inside a node
    inter: Level  # between nodes (per node: what its link carries)
    text_s: float  # seconds of one text's forward and backward on one device (computation, no communication)
    backend: str = "nccl"  # nccl: a ring's reduce-scatter sends half an all-reduce; gloo: a whole one
    source: str = ""


# The course's model as the Kaggle preset trains it: distilbert-base, 32 texts of 128 tokens on each of 2 T4s
MODEL = memory.SHAPES["distilbert-base"]
GLOBAL_TEXTS, TOKENS = 64, 128
MFU = 0.4  # the share of the datasheet's peak a step reaches: chapter 05's estimate for the paper (an assumption)


def blocks(shape=MODEL) -> list[int]:
    """Elements of each ZeRO-3 block, the rest (embeddings, pre-classifier, classifier) first, then each layer."""
    t = shape.tensors()
    k = (len(t) - 8) // shape.layers  # tensors per layer
    return [sum(t[:4]) + sum(t[-4:]), *[sum(t[4 + i * k : 4 + (i + 1) * k]) for i in range(shape.layers)]]


def text_flops(shape=MODEL, tokens: int = TOKENS) -> float:
    """Training FLOPs of one text (forward and backward): 6 per non-embedding parameter and token, plus the
    attention's 12 L d T per token (distrinews_lib.training.flops, the course's MFU formula)."""
    embedding = (shape.vocab + shape.positions) * shape.hidden
    return 6.0 * (shape.n_params - embedding) * tokens + 12.0 * shape.layers * shape.hidden * tokens**2


def text_seconds(gpu: str, mfu: float = MFU, shape=MODEL, tokens: int = TOKENS) -> float:
    """Seconds of one text's forward and backward on one `gpu` (cluster_model.GPUS, its fp16 peak) at `mfu` of it."""
    if gpu not in cluster_model.GPUS:
        raise ValueError(f"unknown GPU {gpu!r}: one of {', '.join(cluster_model.GPUS)}")
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu {mfu!r}: a share of the peak, in (0, 1]")
    return text_flops(shape, tokens) / (cluster_model.GPUS[gpu] * 1e12 * mfu)


def kaggle_level() -> Level:
    """Kaggle's two T4s as measured (cluster_model.KAGGLE_NANOGPT: 16 MB of gradients all-reduced in 11.24 ms): no
    peer-to-peer path, every byte staged through the host, about a tenth of PCIe 3.0's datasheet rate. alpha: PCIe's."""
    k = cluster_model.KAGGLE_NANOGPT
    sent = two_level.sent_factor("all_reduce", 2) * k["params"] * 4  # what each rank sent: the buffer, at 2 ranks
    alpha = cluster_model.LINKS["pcie3"].alpha_us * 1e-6
    return Level(alpha, (k["comm_ms"] / 1000 - steps("all_reduce", 2) * alpha) / sent)


def settings(mfu: float = MFU) -> dict:
    """The two settings on paper: Kaggle's T4s at the rate measured between two of them (Kaggle has no second machine:
    beyond 2 devices, the same rate between every pair), and PyTorch's published DDP benchmark machine."""
    dgx = cluster_model.PUBLIC_DDP_TABLE["link"]
    return {
        "kaggle_t4": Setting(
            "Kaggle's T4s",
            2,
            kaggle_level(),
            kaggle_level(),
            text_seconds("T4", mfu),
            source=cluster_model.KAGGLE_NANOGPT["source"],
        ),
        "dgx1": Setting(
            "DGX-1 (8 V100, NVLink 2; 4x InfiniBand EDR between)",
            8,
            Level.of(dgx[8]),
            Level.of(dgx[16]),
            text_seconds("V100", mfu),
            source=cluster_model.PUBLIC_DDP_TABLE["source"],
        ),
    }


def steps(op: str, k: int) -> int:
    """A ring's steps for collective `op` among k devices: each pays alpha once."""
    if k <= 1:
        return 0
    return 2 * (k - 1) if op == "all_reduce" else k - 1


SETTINGS = settings()


def layout(n: int, per_node: int) -> two_level.Layout:
    """n devices filling nodes of `per_node` (one node while they fit)."""
    if n < 1:
        raise ValueError(f"{n} devices: at least 1")
    if n <= per_node:
        return two_level.Layout(1, n)
    if n % per_node:
        raise ValueError(f"{n} devices do not fill nodes of {per_node}")
    return two_level.Layout(n // per_node, per_node)


def comm_seconds(strategy: str, n: int, s: Setting, params=None, param_bytes: int = 2, grad_bytes: int = 4) -> float:
    """Seconds of one step's collectives for `strategy` on n devices of setting s, one after another. params: the
    elements of each block (default: the course's model); param_bytes: what a gather sends per weight (ZeRO-3 and
    HSDP; DDP gathers none), grad_bytes: per gradient."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
    lay = layout(n, s.per_node)
    total = 0.0
    for o in two_level.plan(PLAN[strategy], list(params or blocks()), lay, grad_bytes):
        if o.op == "all_gather":
            o = replace(o, nbytes=o.nbytes * param_bytes / grad_bytes)  # the weights travel in param_dtype
        k, sent, across = lay.size(o.group), o.rank_bytes(lay, s.backend), o.link_bytes(lay, s.backend)
        if across == 0:  # inside a node
            total += s.intra.seconds(steps(o.op, k), sent)
        elif o.group == "world":  # a ring over every device: its slowest edge sets the pace, inside or between nodes
            total += max(s.intra.seconds(steps(o.op, k), sent), s.inter.seconds(steps(o.op, k), across))
        else:  # rings across the nodes, one per local rank: the node's link carries all of them at once
            total += s.inter.seconds(steps(o.op, k), across)
    return total


def candidates(texts: int) -> list[int]:
    """N = 1, 2, 4, ... while every device still has a text."""
    n, out = 1, []
    while n <= texts:
        out.append(n)
        n *= 2
    return out


def limit(strategy: str, s: Setting, texts: int = GLOBAL_TEXTS, **kw) -> dict:
    """Communication and computation per step at N = 1, 2, 4, ... (up to a text per device), the global batch of
    `texts` split over them; n_max, the largest N at which communication does not exceed computation (1: not even
    2 devices)."""
    if texts < 1:
        raise ValueError(f"a global batch of {texts!r} texts: at least 1")
    rows = [
        {"n": n, "comm_s": comm_seconds(strategy, n, s, **kw), "compute_s": texts * s.text_s / n}
        for n in candidates(texts)
    ]
    fits = [r["n"] for r in rows if r["comm_s"] <= r["compute_s"]]
    return {"strategy": strategy, "setting": s.name, "texts": texts, "n_max": max(fits, default=1), "rows": rows}


def texts_to_hide(strategy: str, n: int, s: Setting, **kw) -> float:
    """The texts each of n devices must compute per step for its computation to last as long as the step's
    communication: below it, the step is communication-bound."""
    return comm_seconds(strategy, n, s, **kw) / s.text_s


def table(texts=(GLOBAL_TEXTS, 1024), n: int = 8, mfu: float = MFU) -> list[dict]:
    """Every strategy at every setting: at n devices, the communication per step and the texts per device that hide
    it; at each global batch of `texts`, n_max."""
    out = []
    for key, s in settings(mfu).items():
        for strategy in STRATEGIES:
            row = {"setting": key, "strategy": strategy, "comm_s": comm_seconds(strategy, n, s)}
            row["texts_per_device"] = texts_to_hide(strategy, n, s)
            row["n_max"] = {t: limit(strategy, s, t)["n_max"] for t in texts}
            out.append(row)
    return out


def box(mbit: float, alpha_s: float = 0.0) -> Level:
    """The box's dialed link (scripts/cluster/box.py): what TCP carries of `mbit` (link.PAYLOAD_SHARE, the ceiling
    chapter 05 fits on the same cable); alpha per ring step (none by default: chapter 05's loopback fit puts it under
    a millisecond, next to the hundreds a dialed step's messages take)."""
    from .link import PAYLOAD_SHARE

    if not mbit > 0:
        raise ValueError(f"a link of {mbit!r} Mbit/s: give a positive rate")
    return Level(alpha_s, 1 / (mbit * 1e6 / 8 * PAYLOAD_SHARE))


def point(strategy: str, n: int, level: Level, params: list[int], step_s: float, texts: int) -> dict:
    """One point on the box: n ranks, each in its own namespace (a node of one), gloo, every collective on the dialed
    `level`; `step_s` one rank's step of `texts` texts with no communication. Communication and computation per step
    of each rank, the global batch n x texts."""
    s = Setting("the box's dialed link", 1, level, level, step_s / texts, backend="gloo")
    return {"n": n, "comm_s": comm_seconds(strategy, n, s, params, 4, 4), "compute_s": step_s}


def table_text(rows: list, n: int = 8) -> str:
    """table()'s rows as the notebook prints them: two columns at `n` devices (table()'s n), then n_max at each
    global batch."""
    texts = list(rows[0]["n_max"])
    head1 = f"{'ESTIMATE':<17} {f'at {n} devices:':<29} n_max, global batch of"
    head2 = f"{'':<17} {'comm ms':>10} {'texts/device to hide it':>23}" + "".join(f" {f'{t} texts':>11}" for t in texts)
    lines = [head1, head2]
    for r in rows:
        lines.append(
            f"{r['setting']:<10} {r['strategy']:<6} {1000 * r['comm_s']:>10.1f} {r['texts_per_device']:>23.0f}"
            + "".join(f" {r['n_max'][t]:>11}" for t in texts)
        )
    return "\n".join(lines)


def kaggle_line(strategy: str = "ddp", texts: int = GLOBAL_TEXTS, mfu: float = MFU) -> str:
    """Kaggle's case in one sentence, labelled an estimate with its sources (no cell measures a 2x T4 step): on its
    2 T4s, the texts per device that would hide `strategy`'s communication, against the preset's `texts` per step
    split over the two."""
    s, n, k = settings(mfu)["kaggle_t4"], 2, cluster_model.KAGGLE_NANOGPT
    comm, need, given = comm_seconds(strategy, n, s), texts_to_hide(strategy, n, s), texts / n
    share = comm / (given * s.text_s)
    verdict = (
        "enough to hide it" if given >= need else f"so the link would take {share:.1f}x as long as the computation"
    )
    return (
        f"ESTIMATE (the link's rate from one {k['params'] * 4 / 1e6:.0f} MB all-reduce in a public Kaggle notebook, "
        f"applied to DistilBERT's {MODEL.n_params * 4 / 1e6:.0f} MB of gradients; the computation at "
        f"{100 * mfu:.0f}% of a T4's fp16 peak): Kaggle has 2 T4s, not 8, and there {strategy}'s communication "
        f"would take {1000 * comm:.0f} ms a step, which {need:.0f} texts per T4 would hide; the preset gives each T4 "
        f"{given:.0f} ({texts} a step), {verdict}"
    )


def plot(key: str = "dgx1", texts: int = 1024, mfu: float = MFU, save_to=None):
    """Communication per step of each strategy, and computation per device, against the number of devices, at
    setting `key` and a global batch of `texts`: where a strategy's line crosses the computation's, it stops paying."""
    from .plots import _pyplot

    plt = _pyplot()
    s = settings(mfu)[key]
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for strategy in STRATEGIES:
        lim = limit(strategy, s, texts)
        rows = lim["rows"][1:]  # one device sends nothing
        label = f"{strategy}: communication (n_max {lim['n_max']})"
        ax.plot([r["n"] for r in rows], [1000 * r["comm_s"] for r in rows], "o-", label=label)
    rows = limit("ddp", s, texts)["rows"]
    ax.plot([r["n"] for r in rows], [1000 * r["compute_s"] for r in rows], "k--", label="computation per device")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set(
        xlabel="devices",
        ylabel="ms per step (ESTIMATE)",
        title=f"{s.name.split(' (')[0]}: {texts} texts of {TOKENS} tokens a step",
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    if save_to:
        from pathlib import Path

        Path(save_to).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(save_to, dpi=110)
    return fig
