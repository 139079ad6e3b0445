"""Chapter 10's figures: the path from DDP's rank 0 to the server, what a text costs in a batch, latency under load.

Each takes what the chapter measured (or the checkpoint's own metadata) and returns a matplotlib figure; nothing on
them is typed by hand.
"""

from __future__ import annotations

from .plots import _pyplot


def _box(ax, x, y, w, h, text, color, size=9):
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", fc=color, ec="black", lw=0.8))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size)


def _arrow(ax, start, end, text="", style="-|>", dashed=False):
    ax.annotate("", xy=end, xytext=start, arrowprops=dict(arrowstyle=style, lw=1.2, ls="--" if dashed else "-"))
    if text:
        ax.text((start[0] + end[0]) / 2, (start[1] + end[1]) / 2 + 0.05, text, ha="center", va="bottom", fontsize=8)


def draw_rank0_to_server(meta: dict, file_name: str, file_mb: float):
    """DDP's ranks (as many as the checkpoint's metadata says trained it), rank 0 alone writing the file, and the one
    server process that loads it."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 3.4))
    ax.set(xlim=(0, 10), ylim=(0, 3.4))
    ax.axis("off")
    world = int(meta.get("world_size") or 1)
    shown = list(range(min(world, 3)))
    top = 2.9
    for k, rank in enumerate(shown):
        y = top - 0.95 * (k + 1)
        name = f"rank {rank}" if not (world > 3 and k == 2) else f"rank {world - 1}"
        _box(ax, 0.2, y, 1.7, 0.55, f"{name}\nmodel replica", "#dbe8f6" if rank == 0 else "#eeeeee")
        if k:
            _arrow(ax, (1.05, y + 0.55), (1.05, y + 0.95), style="<|-|>")
            ax.text(1.15, y + 0.68, "all-reduce", fontsize=7, va="center")
    if world > 1:
        ax.text(
            1.05,
            top - 0.05,
            f"DDP: {world} processes ({meta.get('backend', '?')}),\nidentical after every step",
            ha="center",
            va="bottom",
            fontsize=8,
        )
    else:
        ax.text(1.05, top - 0.05, "one process trained it", ha="center", va="bottom", fontsize=8)
    y0 = top - 0.95
    _box(
        ax,
        2.9,
        y0 - 0.1,
        2.2,
        0.75,
        f"{file_name}\n{file_mb:.1f} MB: weights, tokenizer,\nlabels, metadata",
        "#fff2cc",
        size=8,
    )
    _arrow(ax, (1.9, y0 + 0.27), (2.9, y0 + 0.27), "rank 0 saves")
    if world > 1:
        ax.text(2.4, y0 - 0.5, "the other ranks\nwrite nothing", ha="center", fontsize=8, color="grey")
    _box(
        ax,
        6.0,
        0.5,
        2.0,
        2.1,
        "python -m\ndistrinews_lib.serving\n\none process,\nno process group:\nHTTP loop, a queue,\none model thread",
        "#d9ead3",
        size=8,
    )
    _arrow(ax, (5.1, y0 + 0.27), (6.0, y0 + 0.27), "loads once")
    for k, what in enumerate(("POST /predict", "POST /predict/batch", "GET /health")):
        y = 2.2 - 0.65 * k
        _box(ax, 8.6, y, 1.3, 0.45, what, "#f4cccc", size=7)
        _arrow(ax, (8.6, y + 0.22), (8.0, y + 0.22), style="<|-|>")
    ax.text(9.25, 2.85, "clients", ha="center", fontsize=9)
    acc = meta.get("final_accuracy")
    fig.suptitle(
        f"trained by {world} process{'es' * (world > 1)}, served by one"
        + (f" (the run recorded {100 * acc:.1f}% accuracy)" if acc is not None else ""),
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def _log2_axis(ax, values):
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(values), [str(v) for v in values])
    ax.minorticks_off()


def plot_cost_per_text(costs):
    """Time of one /predict/batch call, and per text, against the texts in the call (both axes logarithmic)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    sizes = [c.size for c in costs]
    ax.plot(sizes, [c.ms_per_call for c in costs], "o-", label="one call (ms)")
    ax.plot(sizes, [c.ms_per_text for c in costs], "s-", label="per text (ms)")
    ax.set_yscale("log")
    _log2_axis(ax, sizes)
    one, most = costs[0], costs[-1]
    ax.annotate(
        f"{most.ms_per_text:.2f} ms/text",
        (most.size, most.ms_per_text),
        textcoords="offset points",
        xytext=(-10, 10),
        ha="right",
        fontsize=8,
    )
    ax.set(
        xlabel="texts in one /predict/batch call",
        ylabel="milliseconds",
        title=f"a text alone: {one.ms_per_text:.1f} ms; in a batch of {most.size}: {most.ms_per_text:.2f} ms",
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_latency_under_load(levels):
    """Left: p50 and p95 latency of /predict against clients in flight. Right: answered requests per second, each
    point labelled with the requests the server ran per forward pass."""
    plt = _pyplot()
    fig, (lat, thr) = plt.subplots(1, 2, figsize=(10, 3.6))
    clients = [x.clients for x in levels]
    lat.plot(clients, [x.p50_ms for x in levels], "o-", label="p50")
    lat.plot(clients, [x.p95_ms for x in levels], "s--", label="p95")
    lat.set(xlabel="clients sending /predict back to back", ylabel="latency (ms)", title="each request waits longer")
    thr.plot(clients, [x.per_s for x in levels], "o-", color="tab:green")
    for x in levels:
        thr.annotate(
            f"{x.mean_batch:.1f}",
            (x.clients, x.per_s),
            textcoords="offset points",
            xytext=(0, 6),
            ha="center",
            fontsize=7,
        )
    thr.text(0.02, 0.97, "labels: requests per forward pass", transform=thr.transAxes, va="top", fontsize=8)
    thr.set(
        xlabel="clients sending /predict back to back",
        ylabel="answered requests / s",
        title="... and the server answers more",
        ylim=(0, 1.2 * max(x.per_s for x in levels)),
    )
    for ax in (lat, thr):
        _log2_axis(ax, clients)
        ax.grid(alpha=0.3)
    lat.legend(fontsize=8)
    fig.tight_layout()
    return fig
