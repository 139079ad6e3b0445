"""Compare experiments: accuracy per epoch, time per epoch, and the speedup and efficiency of N processes over 1.

    python scripts/plot_results.py                      # every experiments/*/metrics.json
    python scripts/plot_results.py imdb_custom_1p imdb_custom_2p --out experiments/plots

Writes experiments/plots/accuracy_per_epoch.png, time_per_epoch.png, scaling.png and summary.json (the numbers
behind the plots), and prints the table. Each experiment is a folder written by scripts/run_experiment.py
(config.json, metrics.json).

Scaling pairs: two experiments are compared when they train the same data (its fingerprint) with the same
model, tokenizer, max_length and GLOBAL batch, on different numbers of processes. Their time per epoch is the
mean over the run's epochs of the training time (evaluation excluded); speedup = time(1 process) / time(N),
efficiency = speedup / N. Every figure's title names the data.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXPERIMENTS = REPO / "experiments"


def load(folder: Path) -> dict | None:
    metrics = folder / "metrics.json"
    if not metrics.is_file():
        return None
    m = json.loads(metrics.read_text())
    cfg_path = folder / "config.json"
    c = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    resolved = c.get("resolved", {})
    epochs = m.get("epochs", [])
    if not epochs:
        return None
    times = [e["epoch_time_s"] for e in epochs]
    return {
        "name": folder.name,
        "data": m["data"].get("title", m["data"].get("source")),
        "fingerprint": m["data"].get("fingerprint"),
        "model": resolved.get("model") or m["config"].get("model_resolved") or m["model"].get("resolved"),
        "tokenizer": resolved.get("tokenizer", "hf"),
        "parameters": m["model"].get("num_parameters"),
        "max_length": m["config"].get("max_length"),
        "world_size": m["ddp"]["world_size"],
        "global_batch": m["ddp"]["global_batch_size"],
        "threads": m["config"].get("threads"),
        "epochs": [e["epoch"] for e in epochs],
        "accuracy": [e["val_accuracy"] for e in epochs],
        "epoch_time_s": times,
        "mean_epoch_time_s": sum(times) / len(times),
        "samples_per_s": [e["samples_per_s"] for e in epochs],
        "final_accuracy": epochs[-1]["val_accuracy"],
        "test_examples": epochs[-1].get("val_examples"),
        "train_size": m["data"].get("train_size"),
        "checkpoint": m.get("aggregates", {}).get("checkpoint") or resolved.get("checkpoint"),
        "machine": m.get("machine", {}),
        "git_commit": m.get("git_commit"),
        "started": m.get("started"),
    }


def scaling_pairs(runs: list) -> list:
    """(1-process run, N-process run) with the same data, model, tokenizer, max_length and global batch."""
    key = lambda r: (r["fingerprint"], r["model"], r["tokenizer"], r["max_length"], r["global_batch"])  # noqa: E731
    pairs = []
    for base in (r for r in runs if r["world_size"] == 1):
        for other in (r for r in runs if r["world_size"] > 1 and key(r) == key(base)):
            speedup = base["mean_epoch_time_s"] / other["mean_epoch_time_s"]
            pairs.append({"data": base["data"], "model": base["model"], "tokenizer": base["tokenizer"],
                          "single": base["name"], "multi": other["name"], "processes": other["world_size"],
                          "global_batch": base["global_batch"],
                          "time_per_epoch_s": {"1": round(base["mean_epoch_time_s"], 2),
                                               str(other["world_size"]): round(other["mean_epoch_time_s"], 2)},
                          "speedup": round(speedup, 3), "efficiency": round(speedup / other["world_size"], 3),
                          "accuracy_gap_points": round(100 * (base["final_accuracy"] - other["final_accuracy"]), 3)})
    return pairs


def label(r: dict) -> str:
    return f"{r['name']} ({r['world_size']}p)"


def _pyplot():
    import matplotlib

    if not os.environ.get("MPLBACKEND"):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_accuracy(runs: list, path: Path) -> None:
    plt = _pyplot()
    datasets = sorted({r["data"] for r in runs})
    fig, axes = plt.subplots(1, len(datasets), figsize=(5.2 * len(datasets), 3.8), squeeze=False)
    for ax, d in zip(axes[0], datasets):
        for r in (r for r in runs if r["data"] == d):
            ax.plot(r["epochs"], [100 * a for a in r["accuracy"]], "o-" if r["world_size"] == 1 else "s--", label=label(r))
        ax.set(title=f"data: {d}", xlabel="epoch", ylabel="test accuracy (%)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("accuracy per epoch (full test sets)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_time(runs: list, path: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(runs) + 2), 3.8))
    names = [label(r) for r in runs]
    ax.bar(range(len(runs)), [r["mean_epoch_time_s"] for r in runs], color=["C0" if r["world_size"] == 1 else "C1" for r in runs])
    for i, r in enumerate(runs):
        ax.plot([i] * len(r["epoch_time_s"]), r["epoch_time_s"], "k.", ms=4)
        ax.annotate(f"{r['mean_epoch_time_s']:.0f} s", (i, r["mean_epoch_time_s"]), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(runs)), names, rotation=25, ha="right", fontsize=7)
    ax.set(ylabel="training time per epoch (s)", title="time per epoch (bars: mean; dots: each epoch) | data: "
           + ", ".join(sorted({r["data"] for r in runs})))
    ax.title.set_fontsize(8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_scaling(pairs: list, path: Path) -> None:
    plt = _pyplot()
    fig, (ax_s, ax_e) = plt.subplots(1, 2, figsize=(10, 3.8))
    names = [f"{p['data']}\n{p['model']} + {p['tokenizer']}" for p in pairs]
    xs = range(len(pairs))
    ax_s.bar(xs, [p["speedup"] for p in pairs], color="C2")
    ax_e.bar(xs, [100 * p["efficiency"] for p in pairs], color="C3")
    for ax, key, fmt in ((ax_s, "speedup", "{:.2f}x"), (ax_e, "efficiency", "{:.0%}")):
        for x, p in zip(xs, pairs):
            ax.annotate(fmt.format(p[key]), (x, p[key] * (100 if key == "efficiency" else 1)), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(xs), names, fontsize=7)
        ax.grid(alpha=0.3, axis="y")
    procs = sorted({p["processes"] for p in pairs})
    ax_s.axhline(max(procs) if procs else 2, color="grey", ls=":", lw=0.8, label="ideal")
    ax_s.axhline(1, color="black", lw=0.6)
    ax_s.set(ylabel="speedup (time 1 process / time N)", title=f"speedup of {', '.join(map(str, procs))} processes over 1")
    ax_e.axhline(100, color="grey", ls=":", lw=0.8)
    ax_e.set(ylabel="efficiency (%)", title="efficiency = speedup / N")
    ax_s.legend(fontsize=7)
    fig.suptitle("same global batch, same epochs; CPU processes with gloo", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("experiments", nargs="*", help="experiment names (folders in experiments/); default: all")
    p.add_argument("--root", default=str(EXPERIMENTS), help="the experiments folder")
    p.add_argument("--out", default=None, help="where the plots go (default: <root>/plots)")
    a = p.parse_args(argv)
    root = Path(a.root)
    folders = [root / n for n in a.experiments] if a.experiments else sorted(f for f in root.iterdir() if f.is_dir()) \
        if root.is_dir() else []
    runs = [r for r in (load(f) for f in folders) if r]
    if not runs:
        print(f"error: no experiment with a metrics.json in {root} {a.experiments or ''}. Run some first: "
              "python scripts/run_experiment.py --list", file=sys.stderr)
        return 2
    runs.sort(key=lambda r: (r["data"], r["model"], r["world_size"], r["name"]))
    out = Path(a.out) if a.out else root / "plots"
    out.mkdir(parents=True, exist_ok=True)
    pairs = scaling_pairs(runs)
    plot_accuracy(runs, out / "accuracy_per_epoch.png")
    plot_time(runs, out / "time_per_epoch.png")
    written = ["accuracy_per_epoch.png", "time_per_epoch.png"]
    if pairs:
        plot_scaling(pairs, out / "scaling.png")
        written.append("scaling.png")
    summary = {"experiments": runs, "scaling": pairs}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"{'experiment':28} {'data':32} {'model':8} {'procs':>5} {'final acc':>9} {'s/epoch':>8}")
    for r in runs:
        print(f"{r['name']:28} {r['data'][:32]:32} {str(r['model'])[:8]:8} {r['world_size']:>5} "
              f"{100 * r['final_accuracy']:8.2f}% {r['mean_epoch_time_s']:8.1f}")
    for s in pairs:
        print(f"scaling {s['single']} -> {s['multi']}: speedup {s['speedup']:.2f}x, efficiency {100 * s['efficiency']:.0f}%, "
              f"accuracy gap {s['accuracy_gap_points']:+.2f} points")
    print(f"wrote {', '.join(str(out / w) for w in written)} and {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
