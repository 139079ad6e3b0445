"""Chapter 05's figures, one per claim, every axis labelled. Each takes the object its section's claims come from and
returns the figure (saved to `save_to` where given); the notebook shows it.

    perf_figures.ring_allreduce(4)             # the idea: a ring all-reduce's chunks, step by step
    perf_figures.allreduce_cost(cost)          # section 1: time against message size, the fit through it
    perf_figures.step_gap(sweep)               # section 2: from the ideal step to DDP's, part by part
    perf_figures.speedup_by_batch(sweep)       # section 3: the model against the measured speedup
    perf_figures.dialed_allreduce(after)       # section 4: the link's all-reduce, predicted before the run
    perf_figures.dialed_speedup(after)         # section 4: the speedup against the link, and the break-even
    perf_figures.paper_efficiency(paper)       # section 5: the ESTIMATE's efficiency against the GPU count

Only values computed before a launch started are labelled "predicted before the run".
"""

from __future__ import annotations

import numpy as np

from .bench import perf_story
from .perf_model import ring_schedule
from .plots import _pyplot


def _size_label(nbytes: float) -> str:
    return f"{nbytes / 2**20:.0f} MiB" if nbytes >= 2**20 else f"{nbytes / 1024:.0f} KiB"


def _done(fig, save_to):
    fig.tight_layout()
    if save_to:
        fig.savefig(save_to, dpi=110)
    return fig


def ring_allreduce(n: int = 4, save_to=None):
    """The idea of section 1, drawn before any run: perf_model.ring_schedule(n) as a grid, one column per step and one
    row per rank; each box (gid 'chunk') is the chunk that rank sends to the next one in that step, coloured by chunk.
    No data: drawing it costs a few tens of milliseconds."""
    plt = _pyplot()
    steps = ring_schedule(n)
    fig, ax = plt.subplots(figsize=(6.4, 0.5 + 0.55 * n))
    colors = plt.get_cmap("tab10").colors
    for x, step in enumerate(steps):
        for src, dst, chunk, _ in step:
            box = plt.Rectangle((x + 0.08, src - 0.38), 0.84, 0.76, color=colors[chunk % 10], alpha=0.75, gid="chunk")
            ax.add_patch(box)
            ax.text(x + 0.5, src, f"c{chunk}\u2192r{dst}", ha="center", va="center", fontsize=7)
    half = n - 1
    ax.axvline(half, color="k", lw=1)
    top = -0.75
    ax.text(half / 2, top, "reduce-scatter: the receiver adds", ha="center", va="bottom", fontsize=8)
    ax.text(half * 1.5, top, "all-gather: the receiver keeps", ha="center", va="bottom", fontsize=8)
    ax.set(xlim=(0, len(steps)), ylim=(n - 0.5, -1.0), xlabel="step (each rank sends one chunk of S/N bytes)")
    ax.set_xticks([x + 0.5 for x in range(len(steps))], [str(x + 1) for x in range(len(steps))])
    ax.set_yticks(range(n), [f"rank {r}" for r in range(n)])
    ax.set_title(
        f"ring all-reduce on {n} ranks: {len(steps)} steps of S/{n}, {2 * (n - 1)}/{n} = "
        f"{2 * (n - 1) / n:.2f}x the message per rank",
        fontsize=9,
    )
    return _done(fig, save_to)


def allreduce_cost(cost, save_to=None):
    """All-reduce time against message size, log-log: 2 processes measured, alpha + S / bandwidth through them, and
    4 processes (sharing 2 cores here: an upper bound)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    sizes = [r["bytes"] for r in cost.rows2]
    grid = np.geomspace(min(sizes), max(sizes), 100)
    ax.plot(sizes, [1000 * r["seconds"] for r in cost.rows2], "o", label="2 processes, measured (median)")
    ax.plot(grid, [1000 * cost.fit.seconds(s) for s in grid], "-", lw=1.2, label="alpha + S / bandwidth (the fit)")
    if cost.rows4:
        four = sorted(cost.rows4)
        ax.plot(four, [1000 * cost.rows4[s]["seconds"] for s in four], "x", color="gray", label="4 processes, measured")
    ax.axvline(cost.knee_bytes, color="k", lw=0.8, ls=":", label="latency = bytes' time")
    ax.set(xscale="log", yscale="log", xlabel="message size", ylabel="all-reduce time (ms)")
    ax.set_title("all_reduce on this machine", fontsize=10)
    ax.set_xticks(sizes, [_size_label(s) for s in sizes], fontsize=7)
    ax.xaxis.set_minor_formatter(plt.NullFormatter())
    ax.legend(fontsize=7)
    return _done(fig, save_to)


def step_gap(sweep, save_to=None):
    """A waterfall from the even split (1 process's step / N) to the measured one: each part, measured on its own,
    a bar that adds time (red) or saves it (green), and what none explains; a grey band as wide as the runs moved
    (gap_bound_s), under which no part can be ranked."""
    plt = _pyplot()
    gap = perf_story.gap_short(sweep)
    start, rows = 1000 * sweep.ideal_s, []
    for key, v in gap.items():
        rows.append((perf_story.GAP_SHORT[key][0], start, 1000 * v))
        start += 1000 * v
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    labels = [f"even split: 1 process / {sweep.n}", *(r[0] for r in rows), "DDP step, measured"]
    y = np.arange(len(labels))[::-1]
    ax.barh(y[0], 1000 * sweep.ideal_s, color="tab:gray")
    for yi, (_, left, width) in zip(y[1:-1], rows):
        ax.barh(yi, width, left=left, color="tab:red" if width > 0 else "tab:green")
        ax.text(max(left, left + width) + 3, yi, f"{width:+.1f}", va="center", fontsize=7)
    ax.barh(y[-1], 1000 * sweep.ddp_s, color="tab:blue")
    bound = 1000 * sweep.gap_bound_s()  # what a part must pass to be ranked (perf_story.rankable_parts)
    ax.axvspan(1000 * sweep.ddp_s - bound / 2, 1000 * sweep.ddp_s + bound / 2, color="k", alpha=0.12,
               label=f"{bound:.0f} ms, how far these runs moved:\na narrower part cannot be ranked")  # fmt: skip
    ax.legend(fontsize=7, loc="center left")
    ax.set_yticks(y, labels, fontsize=7)
    ax.set_xlim(0, 1.15 * max(1000 * sweep.ideal_s, 1000 * sweep.ddp_s, *(max(r[1], r[1] + r[2]) for r in rows)))
    ax.set_xlabel(f"ms per step, {sweep.large} examples per process")
    ax.set_title(f"DDP's step against the even split, part by part ({sweep.n} procs)", fontsize=10)
    return _done(fig, save_to)


def speedup_by_batch(sweep, save_to=None):
    """The speedup over 1 process at each batch: every round measured (dots), the median round (line), and the model
    made of the runs beside it (dashed); N, what splitting the work N ways gives."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    xs = sweep.batches
    for p in sweep.pts:
        ax.plot([p["b"]] * len(p["rounds"]), [r["measured"] for r in p["rounds"]], ".", color="tab:orange", alpha=0.5)
    ax.plot(
        xs, [p["measured"] for p in sweep.pts], "o-", color="tab:orange", label="measured (median round; dots: each)"
    )
    ax.plot(xs, [p["predicted"] for p in sweep.pts], "s--", color="tab:blue",
            label="model: the pair + DDP's own work + the all-reduce")  # fmt: skip
    ax.axhline(sweep.n, color="k", lw=0.8, ls=":", label=f"{sweep.n}x: the work split {sweep.n} ways")
    top = max(sweep.n, *(r["measured"] for p in sweep.pts for r in p["rounds"]), *(p["predicted"] for p in sweep.pts))
    ax.set(xscale="log", xlabel="batch per process", ylabel="speedup over 1 process", ylim=(0, top + 0.3))
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.xaxis.set_minor_formatter(plt.NullFormatter())
    ax.set_title(f"DDP on {sweep.n} {'GPUs' if sweep.gpus else 'CPU processes, one core each'}", fontsize=10)
    ax.legend(fontsize=7)
    return _done(fig, save_to)


def dialed_allreduce(after, save_to=None):
    """The all-reduce per step against the link: predicted before the run (lines), measured inside DDP's steps
    (markers), plain and with fp16 compression."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    bits = [r["bits"] for r in after.rows]
    grid = np.geomspace(min(bits) * 0.8, max(bits) * 1.25, 60)
    ax.plot(grid / 1e6, [1000 * after.before.comm_s(b) for b in grid], "-", color="tab:blue",
            label="predicted before the run")  # fmt: skip
    ax.plot(np.array(bits) / 1e6, [1000 * r["transfer"] for r in after.rows], "o", color="tab:blue", label="measured")
    ax.plot(grid / 1e6, [1000 * after.before.comm_s(b, 0.5) for b in grid], "--", color="tab:green",
            label="fp16 compression, predicted before the run")  # fmt: skip
    ax.plot([after.fp16["bits"] / 1e6], [1000 * after.fp16["transfer"]], "^", color="tab:green",
            label="fp16 compression, measured")  # fmt: skip
    ax.set(xscale="log", yscale="log", xlabel="each node's link (Mbit/s)", ylabel="all-reduce per step (ms)")
    ax.set_xticks(np.array(bits) / 1e6, [f"{b / 1e6:.0f}" for b in bits])
    ax.xaxis.set_minor_formatter(plt.NullFormatter())
    ax.set_title(f"the gradients' all-reduce on a dialed link ({after.before.grad_bytes / 2**20:.1f} MiB)", fontsize=10)
    ax.legend(fontsize=7)
    return _done(fig, save_to)


def dialed_speedup(after, save_to=None):
    """DDP's speedup over 1 process against the link: measured, the model on the runs beside it, the prediction made
    before the run, 1x, and where the model on this launch's runs puts the break-even."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    rows = sorted(after.rows, key=lambda r: r["bits"])
    xs = np.array([r["bits"] for r in rows]) / 1e6
    ax.plot(xs, [r["measured"] for r in rows], "o-", color="tab:orange", label="measured")
    ax.plot(xs, [r["model"] for r in rows], "s--", color="tab:blue", label="model on the runs beside it")
    ax.plot(xs, [r["speedup_before"] for r in rows], ":", color="gray", marker=".", label="predicted before the run")
    ax.axhline(1, color="k", lw=0.8, ls=":", label="1 process")
    be = after.model_break_even_bits()
    if be:
        ax.axvline(be / 1e6, color="tab:red", lw=0.8, ls="--", label=f"model's break-even, {be / 1e6:.0f} Mbit/s")
    ax.set(xscale="log", xlabel="each node's link (Mbit/s)", ylabel="speedup over 1 process")
    ax.set_xticks(xs, [f"{x:.0f}" for x in xs])
    ax.xaxis.set_minor_formatter(plt.NullFormatter())
    ax.set_title(f"DDP on 2 nodes, {after.before.large} per process, the link dialed", fontsize=10)
    ax.legend(fontsize=7)
    return _done(fig, save_to)


def paper_efficiency(paper, save_to=None):
    """Section 5's ESTIMATE rows as a picture: DDP's efficiency (the 1-GPU step over DDP's step) against the GPU count,
    one labelled point per row of cluster_model.on_paper, from the numbers already computed (well under a second)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for r in paper:
        e = r["estimate"]
        ax.plot(r["n"], 100 * e.efficiency, "o", color="C0")
        link = r["link"].name.split(",")[0].split(" (")[0]
        ax.annotate(
            f"{r['gpu']}, {link}\n{e.speedup:.1f}x",
            (r["n"], 100 * e.efficiency),
            fontsize=7,
            xytext=(5, 4),
            textcoords="offset points",
        )
    ax.axhline(100, color="gray", lw=0.8, ls=":", label="100%: N GPUs, N times as fast")
    ax.set(xscale="log", ylim=(0, 110), xlabel="GPUs (log scale)", ylabel="efficiency (%)")
    ax.set_xticks([r["n"] for r in paper], [str(r["n"]) for r in paper])
    ax.xaxis.set_minor_formatter(plt.NullFormatter())
    ax.set_title("ESTIMATE, not measured: DistilBERT's DDP efficiency (speedup beside each point)", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    return _done(fig, save_to)
