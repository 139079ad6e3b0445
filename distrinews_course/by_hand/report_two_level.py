"""Chapter 08's notebook side of the two-level race: launch scripts/by_hand/race_two_level.py in the cluster in a box
(2 nodes x 2 ranks), or read the recorded run where no box can be built (Kaggle, a laptop without namespaces), and
read either into the tables the chapter prints (two_level_claims decides what they support, two_level_figures draws
them)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from .. import ROOT
from . import SCRIPTS

BENCHMARKS = ROOT / "benchmarks"
SCRIPT = SCRIPTS / "race_two_level.py"
NAMES = {  # contender -> what the chapter calls it
    "ddp": "torch's DDP",
    "flat": "flat rung, by hand",
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


def table(rec: dict, only: str | None = None) -> str:
    """Per contender: its step in ms (on the unshaped box, the computation the model takes from it, predicted at the
    dialed rate, measured) and the MiB over each node's link per step (predicted, counted on each node). only:
    "steps" or "bytes" for one half."""
    mib, m = 2**20, rec["grad_bytes"]
    steps = f"{'unshaped':>8} {'compute':>7} {'predicted':>9} {'measured':>8} {'':>5}"
    nbytes = f"{'x M predicted':>13} {'node0':>6} {'node1':>6}"
    head = {"steps": steps, "bytes": nbytes}.get(only, f"{steps} | {nbytes}")
    lines = [f"{'ms a step' if only != 'bytes' else 'over each link, per step':<28} {head}"]
    for name, c in rec["contenders"].items():
        s, b = c["step_s"], c["link_bytes_per_step"]
        err = 100 * (s["measured"] / s["predicted"] - 1)
        st = (
            f"{1000 * s['unshaped']:>8.0f} {1000 * s['computation']:>7.0f} {1000 * s['predicted']:>9.0f} "
            f"{1000 * s['measured']:>8.0f} {err:>+4.0f}%"
        )
        by = f"{b['predicted'] / m:>13.3f}" + "".join(f" {x / m:>6.3f}" for x in b["measured_per_node"])
        lines.append(f"{NAMES.get(name, name):<28} " + {"steps": st, "bytes": by}.get(only, f"{st} | {by}"))
    if only != "steps":
        lines.append(f"(M = {m / mib:.2f} MiB: one rank's gradients, {m // 4:,} fp32 parameters)")
    return "\n".join(lines)


def memory_table(rec: dict) -> str:
    """Each contender's peak MiB per rank, measured, beside chapter 06's calculator."""
    lines = [f"{'':<28} {'peak MiB/rank':>13} {'06 calculator':>13} {'':>6}"]
    for name, m in rec["peak_mb_per_rank"].items():
        lines.append(
            f"{NAMES.get(name, name):<28} {m['measured']:>13.1f} {m['calculator']:>13.1f} "
            f"{100 * (m['measured'] / m['calculator'] - 1):>+5.0f}%"
        )
    return "\n".join(lines)


def record_fields(rec: dict, live: dict | None, why_not: str, quiet: bool) -> dict:
    """What chapter 08's record keeps of the two-level race."""
    return {
        "live": live is not None,
        "not_live_because": None if live is not None else why_not,
        "link_mbit": rec["link_mbit"],
        "quiet": quiet,
        "foreign_cores": rec["foreign_cores"],
        "contenders": rec["contenders"],
        "sweep": rec.get("sweep"),
        "correct": rec["correct"],
    }


def headline(rec: dict, live: dict | None) -> str:
    step = {n: c["step_s"]["measured"] for n, c in rec["contenders"].items()}
    return (
        f"; 2x2 nodes at {rec['link_mbit']} Mbit/s: hierarchical {step['hierarchical'] / step['ddp']:.2f}x DDP's step, "
        f"HSDP {step['hsdp'] / step['fsdp2']:.2f}x full sharding's" + ("" if live is not None else " (recorded)")
    )


def terms_table(rec: dict) -> str:
    """The model's step at the race's rate, term by term (ms): computation, the collectives inside the node, those
    across (n x the link's alpha, and the link's bytes at its rate), their sum."""
    fit = rec["fits"]["inter"]
    lines = [
        f"{'ms a step':<28} {'compute':>7} {'inside':>6} {'n x alpha':>9} {'bytes/B_link':>12} {'= step':>7}",
    ]
    for name, t in rec["terms"].items():
        alpha = t["inter_ops"] * fit["alpha_s"]
        wire = t["link_bytes"] / fit["bytes_per_s"]
        lines.append(
            f"{NAMES.get(name, name):<28} {1000 * t['compute_s']:>7.0f} {1000 * t['intra_s']:>6.0f} "
            f"{1000 * alpha:>9.1f} {1000 * wire:>12.0f} {1000 * t['step_s']:>7.0f}"
        )
    return "\n".join(lines)


def race_or_recorded(enabled: bool, why_not: str, *, args=(), timeout: float = 300) -> tuple[dict, dict | None]:
    """(the record the chapter reads, the live launch or None): the race in a box where one can be built and
    `enabled`, else the recorded run, said in one line. The live launch's log (its predictions) is printed, each
    design's bytes per link left out (without_link_bytes): the learner predicts those before they are graded."""
    if enabled:
        live = run("outputs/two_level/race.json", args=args, timeout=timeout)
        print("\n".join(without_link_bytes(line) for line in live["log"]))
        from .race_two_level import summary

        return summary(live), live
    rec = recorded()
    if rec is None:
        raise FileNotFoundError("no benchmarks/two_level_*.json to show: record one (race_two_level.py --benchmark)")
    p = rec["provenance"]
    print(
        f"no box here ({why_not}): the recorded run instead ({p['cpu']}, commit {p['git_commit'][:7]}, "
        "benchmarks/), shown and not checked"
    )
    return rec, None


def without_link_bytes(line: str) -> str:
    """A line of the race's log without its bytes per link ("..., 11.96 MiB/step per link"): chapter 08 grades the
    learner's prediction of those after the race, beside the counters. Nor the rate's cap (" (held to 100-160: ...)"):
    the chapter's folded note says how the rate is dialed."""
    return re.sub(r",\s*[0-9.]+ MiB/step per link| \(held to [^)]*\)", "", line)


def embedding_share(rec: dict, dim: int | None = None, vocab: int | None = None) -> float | None:
    """The share of the race's gradients (rec["grad_bytes"], fp32) that is the tiny model's word embedding: its
    vocabulary (the WordPiece file shipped in distrinews_lib) times its width (TINY_CONFIG). None for another model."""
    if rec.get("model") != "tiny":
        return None
    from distrinews_lib.data.tokenization import VOCAB_FILE
    from distrinews_lib.models.build import TINY_CONFIG

    dim = TINY_CONFIG["dim"] if dim is None else dim
    vocab = len(VOCAB_FILE.read_text(encoding="utf-8").splitlines()) if vocab is None else vocab
    return vocab * dim / (rec["grad_bytes"] / 4)


def embedding_line(rec: dict) -> str:
    share = embedding_share(rec)
    if share is None:
        return f"the race's model is {rec.get('model')}: no share of its word embedding is computed"
    return (
        f"the word embedding is {100 * share:.0f}% of the race's {rec['grad_bytes'] / 4:,.0f} parameters: the last "
        "gradient backward makes, the first weight forward needs, so nothing overlaps"
    )


def link_rate_line(rec: dict) -> str:
    """The link's payload rate B_link as the race fitted it (on the sizes it timed: race_two_level.fit_level), beside
    the rate dialed / 8; a fit above that rate, which no link carries, is said to be one."""
    fit, mbit = rec["fits"]["inter"], rec["link_mbit"]
    fitted, wire = fit["bytes_per_s"] / 1e6, mbit / 8
    smallest = fit.get("smallest_bytes")
    on = f" on messages of {smallest / 2**20:.1f} MiB and more over the link" if smallest else ""
    line = f"across: B_link fitted at {fitted:.1f} MB/s{on}, {100 * fitted / wire:.0f}% of {mbit} Mbit/s / 8"
    line += f" ({wire:.1f} MB/s)"
    if fitted > wire:
        line += ": above what the wire carries, so this fit's timings were off (noise, or the filter's burst)"
    return line


def excerpt(path, qualname: str) -> str:
    """The source of one function or method of a file ('Class.method' or 'function'), as written there."""
    import ast

    text = Path(path).read_text()
    scope = ast.parse(text).body
    node = None
    for part in qualname.split("."):
        node = next((n for n in scope if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part), None)
        if node is None:
            raise ValueError(f"{path} has no {qualname}")
        scope = node.body
    lines = text.splitlines()
    start = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
    return "\n".join(lines[start : node.end_lineno])
