"""Chapter 08's notebook side of the two-level race: launch scripts/by_hand/race_two_level.py in the cluster in a box
(2 nodes x 2 ranks), or read the recorded run where no box can be built (Kaggle, a laptop without namespaces), and
read either into the figures the chapter prints and checks."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from .. import ROOT
from . import SCRIPTS

BENCHMARKS = ROOT / "benchmarks"
SCRIPT = SCRIPTS / "race_two_level.py"
NAMES = {  # contender -> what the chapter calls it
    "ddp": "torch's DDP (one flat ring)",
    "flat": "flat, by hand (one ring)",
    "hierarchical": "hierarchical, by hand",
    "zero3": "ZeRO-3, by hand",
    "fsdp2": "FSDP2, full sharding",
    "hsdp": "HSDP, by hand",
    "fsdp2_hsdp": "FSDP2 on a 2-D mesh (HSDP)",
}


def run(out_json, *, nodes: int = 2, per_node: int = 2, args=(), timeout: float = 300) -> dict:
    """The race in a box of `nodes` x `per_node` ranks, its links unshaped until the script dials them; its JSON."""
    from .. import link

    out_json = Path(out_json)
    out_json.unlink(missing_ok=True)
    out_json.parent.mkdir(parents=True, exist_ok=True)
    res = link.run_in_box(
        SCRIPT, [*map(str, args), "--out", out_json], nodes=nodes, ranks_per_node=per_node, timeout=timeout
    )
    out = json.loads(out_json.read_text())
    out["log"] = [l for l in res.lines if l.startswith(("step with", "fit:", "predicted"))]
    return out


def recorded(machine: str | None = None) -> dict | None:
    """The recorded run (benchmarks/two_level_<machine>.json): this machine's if there is one, else the newest."""
    files = sorted(BENCHMARKS.glob("two_level_*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    if machine:
        files = [p for p in files if p.stem == f"two_level_{machine}"] or files
    return json.loads(files[0].read_text()) if files else None


def per_round_saving(rec: dict, slow: str, fast: str) -> tuple[float, list]:
    """How much faster `fast` ran than `slow` in each round (both in the same round, back to back), and the median."""
    rounds = [
        a - b for a, b in zip(rec["contenders"][slow]["step_s"]["rounds"], rec["contenders"][fast]["step_s"]["rounds"])
    ]
    return statistics.median(rounds), rounds


def table(rec: dict) -> str:
    """Per contender, in ms a step: its step on the unshaped box, the computation the model takes from it, the step
    predicted at the dialed rate and the one measured; and the bytes over each node's link, predicted and counted."""
    mib = 2**20
    lines = [
        f"{'ms a step':<28} {'unshaped':>8} {'compute':>7} {'predicted':>9} {'measured':>8} {'':>5} | "
        f"{'MiB/link predicted':>18} {'node0':>6} {'node1':>6}"
    ]
    for name, c in rec["contenders"].items():
        s, b = c["step_s"], c["link_bytes_per_step"]
        counted = "".join(f" {x / mib:>6.2f}" for x in b["measured_per_node"])
        err = 100 * (s["measured"] / s["predicted"] - 1)
        lines.append(
            f"{NAMES.get(name, name):<28} {1000 * s['unshaped']:>8.0f} {1000 * s['computation']:>7.0f} "
            f"{1000 * s['predicted']:>9.0f} {1000 * s['measured']:>8.0f} {err:>+4.0f}% "
            f"| {b['predicted'] / mib:>18.2f}{counted}"
        )
    return "\n".join(lines)


def plot(rec: dict, save_to=None):
    """Two panels: each contender's step time and bytes over a node's link, predicted beside measured."""
    from ..plots import _pyplot

    plt = _pyplot()
    names = list(rec["contenders"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4))
    x = range(len(names))
    for ax, key, scale, label in (
        (axes[0], "step_s", 1000, "ms per step"),
        (axes[1], "link_bytes_per_step", 1 / 2**20, "MiB per step over a node's link"),
    ):
        pred = [rec["contenders"][n][key]["predicted"] * scale for n in names]
        meas = [
            (rec["contenders"][n][key].get("measured") or max(rec["contenders"][n][key]["measured_per_node"])) * scale
            for n in names
        ]
        ax.bar([i - 0.2 for i in x], pred, 0.4, label="predicted", color="tab:gray")
        ax.bar([i + 0.2 for i in x], meas, 0.4, label="measured", color="tab:blue")
        ax.set_xticks(list(x), names, rotation=20)
        ax.set_ylabel(label)
    axes[0].legend()
    fig.suptitle(f"2 nodes x 2 ranks, links at {rec['link_mbit']} Mbit/s: the cost model against the box")
    fig.tight_layout()
    if save_to:
        Path(save_to).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(save_to, dpi=110)
    return fig
