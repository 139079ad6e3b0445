"""Chapter 08's two-level figures: what crossed each node's link, the model's and the counted; and each contender's
step against the link's rate, the cost model's curve beside the steps the box measured at the rates it dialed, and
what hierarchical and HSDP save, by rate.

    step_vs_rate(rec, save_to="outputs/two_level/sweep.png")   # rec: race_two_level.summary's record
    link_bytes_bars(rec, save_to="outputs/two_level/link_bytes.png")   # the model's bytes per link beside the counted
    curve(rec, "hsdp", mbits)                                   # the model's seconds per step at each rate
    print(pays_line(rec))                                       # up to which rate each design pays: model, measured
"""

from __future__ import annotations

from .. import two_level as tl
from ..plots import finish
from .report_two_level import NAMES
from .two_level_claims import crossover_line, measured_savings, sweep_points

COLORS = {"ddp": "tab:blue", "hierarchical": "tab:cyan", "fsdp2": "tab:red", "hsdp": "tab:orange"}
PAIRS = {"HSDP over full sharding": ("fsdp2", "hsdp"), "hierarchical over DDP": ("ddp", "hierarchical")}


def curve(rec: dict, name: str, mbits) -> list[float]:
    """The model's step (seconds) of contender `name` on a link of each rate in `mbits`: its computation and its
    collectives inside the node as at the race's rate, each collective across at the link's fit scaled to the rate
    (two_level.step_at, two_level.link_fit)."""
    fit = rec["fits"]["inter"]
    terms = rec["terms"][name]
    return [tl.step_at(terms, tl.link_fit(fit["alpha_s"], fit["bytes_per_s"], m, rec["link_mbit"])) for m in mbits]


def plain(ax, which: str) -> None:
    """Plain numbers on a log axis (200, not 2 x 10^2), and no labels on its minor ticks."""
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    axis = ax.xaxis if which == "x" else ax.yaxis
    axis.set_major_formatter(ScalarFormatter())
    axis.set_minor_formatter(NullFormatter())


def rates_to_draw(rec: dict, points: int = 60) -> list[float]:
    """From a quarter of the race's rate to four times the sweep's fastest, evenly on a log scale."""
    lo, hi = rec["link_mbit"] / 4, 4 * max(sweep_points(rec) or {rec["link_mbit"]: 0})
    return [lo * (hi / lo) ** (i / (points - 1)) for i in range(points)]


def saving(rec: dict, slow: str, fast: str, mbit: float) -> float:
    """The model's seconds a step that `fast` saves over `slow` on a link of `mbit`."""
    a, b = curve(rec, slow, [mbit])[0], curve(rec, fast, [mbit])[0]
    return a - b


def break_even(rec: dict, slow: str, fast: str) -> float | None:
    """The link rate (Mbit/s) above which, on the model's curves, `fast` no longer saves over `slow`: found by bisection
    on a log scale within rates_to_draw's range; None where it saves at every rate drawn (or at none)."""
    xs = rates_to_draw(rec)
    lo, hi = xs[0], xs[-1]
    if (saving(rec, slow, fast, lo) > 0) == (saving(rec, slow, fast, hi) > 0):
        return None
    for _ in range(40):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if saving(rec, slow, fast, mid) > 0 else (lo, mid)
    return lo


def pays_line(rec: dict) -> str:
    """Per two-level design: up to which rate the model says it pays, or its saving at the slowest and fastest rates
    drawn where it pays at all of them; and where its break-even falls inside the rates drawn, what the box measured
    at the rates it dialed (two_level_claims.crossover_line). Near a break-even the saving is the difference of two
    steps each within 15% of the model, so the model's rate is an estimate and the box's points decide."""
    xs, out = rates_to_draw(rec), []
    for label, (slow, fast) in PAIRS.items():
        edge = break_even(rec, slow, fast)
        if edge is not None:
            out.append(f"the model: {label} pays on links slower than {edge:.0f} Mbit/s, and costs time above it")
            out.append(crossover_line(rec, label, slow, fast))
        else:
            a, b = (1000 * saving(rec, slow, fast, m) for m in (xs[0], xs[-1]))
            verb = "saves" if a > 0 else "never pays: it costs"
            out.append(
                f"the model: {label} {verb} {abs(a):.0f} ms a step at {xs[0]:.0f} Mbit/s, "
                f"{abs(b):.0f} ms at {xs[-1]:.0f}"
            )
    return "\n".join(out)


def step_vs_rate(rec: dict, save_to=None):
    """Left: ms per step against the link's rate, the model's curve (a line) and the median round measured at each
    dialed rate (a dot; its bar the rounds' range). Right: what HSDP saves over full sharding and hierarchical over
    DDP, the model's and the measured (per round, the median)."""
    from ..plots import _pyplot
    from .two_level_claims import per_round_saving

    plt = _pyplot()
    pts = sweep_points(rec)
    xs = rates_to_draw(rec)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    names = [n for n in COLORS if n in rec["terms"]]
    for n in names:
        left.plot(xs, [1000 * s for s in curve(rec, n, xs)], color=COLORS[n], lw=1.5, label=f"{NAMES[n]}: model")
        at = [(m, p[n]) for m, p in pts.items() if n in p]
        if at:
            ys = [1000 * p["measured"] for _, p in at]
            lows = [1000 * (p["measured"] - min(p["rounds"])) for _, p in at]
            highs = [1000 * (max(p["rounds"]) - p["measured"]) for _, p in at]
            left.errorbar([m for m, _ in at], ys, yerr=[lows, highs], fmt="o", color=COLORS[n], ms=5, capsize=3)
    left.set_xscale("log")
    left.set_yscale("log")
    top = max(max(curve(rec, n, xs)) for n in names)
    low = min(min(curve(rec, n, xs)) for n in names)
    left.set_yticks([t for t in (50, 100, 200, 300, 500, 1000, 2000, 3000, 5000) if low <= t / 1000 <= top * 1.2])
    plain(left, "y")
    left.set_xlabel("each node's link, Mbit/s")
    left.set_ylabel("ms per step")
    left.legend(fontsize=7, loc="upper right")
    left.set_title("step time: the model's curve, the box's steps (dots)", fontsize=10)
    for label, (slow, fast) in PAIRS.items():
        if slow not in rec["terms"] or fast not in rec["terms"]:
            continue
        model = [1000 * (a - b) for a, b in zip(curve(rec, slow, xs), curve(rec, fast, xs))]
        line = right.plot(xs, model, lw=1.5, label=f"{label}: model")[0]
        at = [m for m, p in pts.items() if slow in p and fast in p]
        right.plot(
            at,
            [1000 * per_round_saving(rec, slow, fast, pts[m])[0] for m in at],
            "o",
            color=line.get_color(),
            label=f"{label}: measured",
        )
    right.axhline(0, color="black", lw=0.8)
    for label, (slow, fast) in PAIRS.items():
        edge = break_even(rec, slow, fast)
        if edge is not None:
            ms = measured_savings(rec, slow, fast)
            pays = [m for m, (_, _, sign) in ms.items() if sign > 0]
            after = [m for m, (_, _, sign) in ms.items() if sign <= 0 and pays and m > max(pays)]
            if after:
                right.axvspan(
                    max(pays), min(after), color="gray", alpha=0.15, label=f"{label}: measured to stop paying"
                )
            right.axvline(edge, color="gray", ls="--", lw=0.8)
            right.annotate(
                f"model: {label.split(' over')[0]} breaks even\nat {edge:.0f} Mbit/s",
                (edge, 0),
                xytext=(4, 12),
                textcoords="offset points",
                fontsize=7,
            )
    right.set_xscale("log")
    for ax in (left, right):
        ax.set_xticks(sorted({round(xs[0]), *pts, round(xs[-1])}))
        plain(ax, "x")
    right.set_xlabel("each node's link, Mbit/s")
    right.set_ylabel("ms saved per step")
    right.legend(fontsize=7)
    right.set_title("what the two-level designs save", fontsize=10)
    fig.suptitle(
        f"{rec['layout']['nodes']} nodes x {rec['layout']['ranks_per_node']} ranks: step time against the link's rate",
        fontsize=11,
    )
    return finish(fig, save_to)


def link_bytes_bars(rec: dict, save_to=None):
    """Per contender, what crossed each node's link per step, in M (one rank's gradients): the model's bytes (a grey
    bar) beside the bytes counted on node0's and node1's links (coloured bars), from the record."""
    from ..plots import _pyplot

    plt = _pyplot()
    m = rec["grad_bytes"]
    names = list(rec["contenders"])
    fig, ax = plt.subplots(figsize=(9, 3.2))
    height = 0.26
    for i, n in enumerate(names):
        b = rec["contenders"][n]["link_bytes_per_step"]
        bars = [("model", b["predicted"], "lightgray")]
        bars += [
            (f"node{k} counted", x, c)
            for k, (x, c) in enumerate(zip(b["measured_per_node"], ("tab:blue", "tab:orange")))
        ]
        for j, (label, x, color) in enumerate(bars):
            ax.barh(i + (j - 1) * height, x / m, height, color=color, label=label if i == 0 else None)
    ax.set_yticks(range(len(names)), [NAMES.get(n, n) for n in names], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"over each node's link per step, in M ({m / 2**20:.2f} MiB: one rank's gradients)")
    ax.set_title("what crossed each node's link: the model's bytes, the counted ones", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    return finish(fig, save_to)


def memory_bars(rec: dict, save_to=None):
    """Per design, its peak MiB per rank measured (a coloured bar) beside chapter 06's calculator (a grey bar), from
    the record's numbers: nothing is run, the figure costs the drawing only (well under a second)."""
    from ..plots import _pyplot

    plt = _pyplot()
    mem = rec["peak_mb_per_rank"]
    names = list(mem)
    fig, ax = plt.subplots(figsize=(9, 3.0))
    height = 0.38
    for i, n in enumerate(names):
        ax.barh(
            i - height / 2, mem[n]["calculator"], height, color="lightgray", label="06 calculator" if i == 0 else None
        )
        ax.barh(i + height / 2, mem[n]["measured"], height, color="tab:blue", label="measured peak" if i == 0 else None)
    ax.set_yticks(range(len(names)), [NAMES.get(n, n) for n in names], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("peak MiB per rank")
    ax.set_title("peak memory per rank: measured, beside chapter 06's calculator", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    return finish(fig, save_to)
