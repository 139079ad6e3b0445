"""Chapter 00's figures: one DDP training step as a picture, how a sampler deals a dataset out over the ranks, the
idea of overlapping all-reduces with backward (a schematic, from overlap_schedule's arithmetic), the bucketed
all-reduce of one backward on a timeline, and what a straggler costs the other ranks. Each measured figure is drawn
from the numbers it is given (the JSON the concept scripts wrote) and returned."""

from __future__ import annotations

from .plots import _pyplot, finish


def ddp_step_figure(n_ranks: int):
    """dataset -> DistributedSampler shards -> each rank's forward+backward -> bucketed all-reduce -> the optimizer
    steps: rank 0 on top, the last rank below (the others alike)."""
    from matplotlib.patches import FancyBboxPatch

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(12, 3.6))

    def box(x, y, text, color, w=2.15, h=0.95):
        ax.add_patch(
            FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.06", fc=color, ec="black", lw=0.8)
        )
        ax.text(x, y, text, ha="center", va="center", fontsize=8)

    def arrow(x0, y0, x1, y1):
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0), arrowprops=dict(arrowstyle="->", lw=1.1))

    box(0, 0, "dataset\n(every sample)", "#eeeeee", w=1.7)
    box(
        9.6,
        0,
        "bucketed all-reduce\nduring backward():\nevery rank gets the\nAVERAGE gradient",
        "#ffd8a8",
        w=2.0,
        h=2.9,
    )
    for rank, y in ((0, 1.15), (n_ranks - 1, -1.15)):
        shard = f"DistributedSampler:\nrank {rank}'s shard, 1 of\nevery {n_ranks} samples; a new\norder per set_epoch"
        box(2.7, y, shard, "#d0ebff", w=2.3, h=1.15)
        box(
            6.0,
            y,
            f"rank {rank} (own process):\nits model copy,\nforward + backward\n-> local gradients",
            "#d3f9d8",
            w=2.4,
            h=1.15,
        )
        box(13.0, y, f"rank {rank}: optimizer.step()\nsame gradients, same\nweights -> same update", "#e5dbff", w=2.3)
        arrow(0.85, 0.25 if y > 0 else -0.25, 1.5, y)
        arrow(3.9, y, 4.8, y)
        arrow(7.2, y, 8.6, y * 0.6)
        arrow(10.6, y * 0.6, 11.85, y)
    if n_ranks > 2:
        ax.text(6.0, 0, f"... ranks 1..{n_ranks - 2} alike ...", ha="center", va="center", fontsize=8, style="italic")
    ax.set(
        xlim=(-1, 14.3),
        ylim=(-1.9, 1.9),
        title=f"One DDP training step on {n_ranks} ranks (each box is measured below)",
    )
    ax.axis("off")
    fig.tight_layout()
    return fig


def shards_figure(epochs: list, n: int):
    """Which rank trains on which sample, epoch by epoch: one row per epoch, one cell per sample (0..n-1) coloured by
    the rank that got it, and the position in that rank's order written in the cell. `epochs`: per epoch, the list
    of every rank's indices (as a sampler yields them)."""
    plt = _pyplot()
    colours = plt.get_cmap("tab10").colors
    fig, ax = plt.subplots(figsize=(min(12, 1.0 + 0.55 * n), 0.7 + 0.55 * len(epochs)))
    for row, ranks in enumerate(epochs):
        for rank, order in enumerate(ranks):
            for pos, i in enumerate(order):
                ax.add_patch(plt.Rectangle((i, row), 0.95, 0.9, color=colours[rank % 10], alpha=0.75))
                ax.text(i + 0.47, row + 0.45, str(pos), ha="center", va="center", fontsize=7, color="white")
    ax.set(xlim=(0, n), ylim=(len(epochs), 0), xlabel="sample index in the dataset")
    ax.set_xticks([i + 0.47 for i in range(n)], [str(i) for i in range(n)], fontsize=7)
    ax.set_yticks([r + 0.45 for r in range(len(epochs))], [f"epoch {r}" for r in range(len(epochs))], fontsize=8)
    ax.legend(
        handles=[plt.Rectangle((0, 0), 1, 1, color=colours[r % 10], alpha=0.75) for r in range(len(epochs[0]))],
        labels=[f"rank {r}" for r in range(len(epochs[0]))],
        fontsize=8,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
    )
    ax.set_title(
        "DistributedSampler: who trains on which sample (the number: its place in that rank's order)", fontsize=9
    )
    fig.tight_layout()
    return fig


def bucket_timeline(report: dict, title: str):
    """Backward's gradient computation and every bucket's all-reduce (launch -> completion), per rank, on each rank's
    own clock; the dashed line is when backward() returned. `report`: 02_ddp_backward.py's JSON."""
    from matplotlib.patches import Patch

    plt = _pyplot()
    lanes_total = sum(len(r["steps"][-1]["buckets"]) + 2 for r in report["ranks"])
    fig, ax = plt.subplots(figsize=(10, 0.45 * lanes_total + 1.2))
    y, lanes = 0.0, []
    for r in report["ranks"]:
        step = r["steps"][-1]
        ready = [1000 * t for t, _ in step["grad_ready"]]
        top = y
        ax.broken_barh([(0, ready[-1])], (y - 0.35, 0.7), color="tab:blue")
        ax.plot(ready, [y] * len(ready), "|", color="white", ms=10)
        lanes.append((y, f"rank {r['rank']}: gradients"))
        for b in step["buckets"]:
            y += 1
            span = (1000 * b["launched"], 1000 * (b["done"] - b["launched"]))
            ax.broken_barh([span], (y - 0.35, 0.7), color="tab:orange")
            mib = b["numel"] * r["bytes_per_number"] / 2**20
            lanes.append((y, f"rank {r['rank']}: bucket {b['index']} ({mib:.2f} MiB)"))
        ax.vlines(1000 * step["backward_s"], top - 0.5, y + 0.5, colors="black", linestyles="--")
        y += 1.5
    ax.set_yticks([t for t, _ in lanes], [label for _, label in lanes], fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel="ms since this rank's backward() started", xlim=(0, None), title=title)
    handles = [
        Patch(color="tab:blue", label="computing gradients (a tick per gradient)"),
        Patch(color="tab:orange", label="all-reduce in flight"),
        plt.Line2D([], [], color="black", ls="--", label="backward() returns"),
    ]
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def straggler_figure(report: dict):
    """Each rank's median step split into its own work and the time it waited inside backward() for the others.
    `report`: 03_straggler.py's JSON."""
    plt = _pyplot()
    ranks = report["ranks"]
    fig, ax = plt.subplots(figsize=(7, 0.6 + 0.55 * len(ranks)))
    labels = [f"rank {r['rank']} ({'slow' if r['slow'] else 'fast'})" for r in ranks]
    own = [r["compute_s"] for r in ranks]
    wait = [r["backward_s"] for r in ranks]
    ax.barh(labels, own, color="tab:green", label="own work (forward, and the straggler's extra)")
    ax.barh(labels, wait, left=own, color="tab:red", alpha=0.7, label="backward(): waiting at the all-reduce")
    ax.axvline(report["delay"], color="k", ls=":", lw=0.8, label=f"the straggler's delay ({report['delay']} s)")
    ax.invert_yaxis()
    ax.set(xlabel="seconds per step (median)", title="One slow rank sets every rank's step time")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def overlap_schedule(layers: int = 6, per_bucket: int = 2, compute: float = 1.0, comm: float = 1.5) -> dict:
    """The idea of section 4 as numbers, not a measurement: backward computes `layers` gradients, the last layer's
    first, `compute` time units each; every `per_bucket` of them fill a bucket, whose all-reduce takes `comm` units
    and starts once the bucket is full and the all-reduce before it is done (one at a time). `overlapped`: DDP's
    schedule; `after`: the same all-reduces started only when backward is over. Intervals are (start, end)."""
    ready = [compute * per_bucket * (b + 1) for b in range(layers // per_bucket)]
    overlapped, after, end_o, end_a = [], [], 0.0, compute * layers
    for t in ready:
        start = max(t, end_o)
        overlapped.append((start, start + comm))
        after.append((end_a, end_a + comm))
        end_o, end_a = start + comm, end_a + comm
    backward = compute * layers
    return {
        "backward": (0.0, backward),
        "grads": [compute * (i + 1) for i in range(layers)],
        "overlapped": overlapped,
        "after": after,
        "exposed_overlapped": end_o - backward,
        "exposed_after": end_a - backward,
    }


def overlap_schematic(**sizes):
    """Two rows over one time axis: backward with the buckets' all-reduces started as each bucket fills (DDP), and
    the same all-reduces started after backward. The part of an all-reduce past backward's end is exposed: the GPU
    waits. `sizes`: overlap_schedule's arguments."""
    plt = _pyplot()
    s = overlap_schedule(**sizes)
    fig, ax = plt.subplots(figsize=(10, 2.6))
    rows = (
        ("DDP: all-reduce\nduring backward", 1.0, s["overlapped"], s["exposed_overlapped"]),
        ("all-reduce\nafter backward", 0.0, s["after"], s["exposed_after"]),
    )
    for label, y, comms, exposed in rows:
        ax.broken_barh([(0, s["backward"][1])], (y + 0.05, 0.35), color="tab:blue")
        ax.plot(s["grads"], [y + 0.225] * len(s["grads"]), "|", color="white", ms=12)
        ax.broken_barh([(a, b - a) for a, b in comms], (y - 0.4, 0.35), color="tab:orange", ec="black", lw=0.5)
        ax.text(comms[-1][1] + 0.1, y - 0.22, f"exposed: {exposed:g}", va="center", fontsize=8)
    ax.axvline(s["backward"][1], color="black", ls="--", lw=0.8)
    ax.set_yticks([1.0, 0.0], [rows[0][0], rows[1][0]], fontsize=8)
    ax.set(
        xlabel="time, in units of one layer's backward (made-up sizes: the idea, not a measurement)",
        xlim=(0, max(s["after"][-1][1], s["overlapped"][-1][1]) + 1.5),
        ylim=(-0.6, 1.6),
        title="Overlap: each bucket's all-reduce starts while backward computes the earlier layers",
    )
    handles = [
        plt.Rectangle((0, 0), 1, 1, color="tab:blue", label="backward, a tick per layer's gradient"),
        plt.Rectangle((0, 0), 1, 1, color="tab:orange", label="one bucket's all-reduce"),
        plt.Line2D([], [], color="black", ls="--", label="backward's compute ends"),
    ]
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return finish(fig)
