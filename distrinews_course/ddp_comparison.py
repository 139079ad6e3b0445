"""Chapter 02's comparison of the DDP run with chapter 01's one-process baseline: which baseline to use, whether the
machine was quiet during the launch, what DDP promised and kept, and how the two runs compare in accuracy and in
speed (one metric: steady samples/s).

    base = baseline_fits(SINGLE_DIR, env, EPOCHS)           # 01's metrics.json if it ran like this chapter, else None
    with OtherPrograms() as load:
        result = run([... scripts/run_ddp.sh ...])
    settle(promise_claims(d, base, result.output, env.nproc, env.backend))
    rows = comparison_rows(base, d); print(comparison_table(rows)); settle(comparison_claims(rows, d, tol))
    Markdown(speed_note(rows, d, env, load))                # the speed measured, stated, not claimed
"""

from __future__ import annotations

import json
import re

from distrinews_lib.checkpoint_format import DDP_PREFIX
from distrinews_lib.process_group.setup import choose_backend

from .bench.quiet import OtherPrograms
from .claims import Claim
from .notebook import accuracy_floor
from .plots import _pyplot, load_metrics


def baseline_fits(single_dir, env, epochs=None) -> dict | None:
    """Chapter 01's metrics.json when it ran with this chapter's preset, epochs and threads (one core per process on a
    CPU), on the data this chapter will read, and finished; None when it is missing, unreadable or ran otherwise (this
    chapter then trains it). The data: an AG News folder ($DISTRINEWS_DATA_DIR) against any other source, and which
    folder: a baseline of 01 run before the folder was set (or after it was unset) is trained again, not compared."""
    from distrinews_lib.data.sources import data_dir
    from distrinews_lib.training.config import read_preset

    try:
        m = load_metrics(single_dir)
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    want_epochs = epochs or read_preset(env.preset)[1].get("epochs", 3)
    try:
        fits = (
            m["config"]["preset"] == env.preset
            and len(m["epochs"]) == want_epochs
            and m["aggregates"].get("final_val_accuracy") is not None
            and m["config"]["threads"] == (None if env.n_gpus else 1)
            and _same_folder(m["data"], data_dir())
        )
    except (KeyError, TypeError):
        return None
    return m if fits else None


def _same_folder(data: dict, folder: str | None) -> bool:
    """Did the baseline read the folder this chapter reads (or, with no folder set, no folder either)?"""
    if folder is None:
        return data.get("source") != "folder"
    return data.get("source") == "folder" and str(data.get("detail", "")).startswith(folder)


def baseline_table(m: dict) -> str:
    e = m["epochs"][-1]
    return (
        f"{'baseline':<10} {'procs':>5} {'batch':>6} {'steps/epoch':>11} {'epochs':>6} {'accuracy':>9}\n"
        f"{'1 process':<10} {m['ddp']['world_size']:>5} {m['config']['batch_size']:>6} {e['optimizer_steps']:>11} "
        f"{len(m['epochs']):>6} {100 * m['aggregates']['final_val_accuracy']:>8.2f}%"
    )


def diff_sections(text: str) -> list[str]:
    """A script_diff of train_single.py against train_ddp.py in three parts, cut where the lesson reads it: the
    imports and the process group (the first two hunks, less the module docstring's lines, which say nothing about
    DDP and would push the part past a screen); the data, the model and the DDP wrap (up to the hunk with
    `DDP(model`); the loop and the end."""
    head, *hunks = text.split("\n@@")
    hunks[0] = _without_docstring(hunks[0])
    wrap = next((i for i, h in enumerate(hunks) if "DDP(model" in h), len(hunks) - 1) + 1
    parts = [hunks[:2], hunks[2:wrap], hunks[wrap:]]
    return ["\n@@".join([head, *parts[0]]), *("@@" + "\n@@".join(p) for p in parts[1:])]


def _without_docstring(hunk: str) -> str:
    """The first hunk (its text after the leading "@@") without the lines up to the docstring's closing quotes, its
    header renumbered to the lines that remain. A hunk that does not open on a docstring comes back as it was."""
    header, *lines = hunk.split("\n")
    m = re.fullmatch(r" -(\d+),(\d+) \+(\d+),(\d+) @@(.*)", header)
    if not m or not lines or not lines[0][1:].startswith('"""'):
        return hunk
    end = next((i for i, line in enumerate(lines[1:], 1) if line[1:].strip() == '"""'), None)
    if end is None:
        return hunk
    gone = lines[: end + 1]
    old = sum(line[:1] in " -" for line in gone)
    new = sum(line[:1] in " +" for line in gone)
    a, na, b, nb = (int(g) for g in m.groups()[:4])
    return "\n".join([f" -{a + old},{na - old} +{b + new},{nb - new} @@{m.group(5)}", *lines[end + 1 :]])


def promise_claims(d: dict, base: dict, output: str, nproc: int, backend: str) -> list[Claim]:
    """What DDP promises, on the run it just made: bit-identical weights on every rank (the script's own all-reduce of
    the largest difference, printed and recorded), the training set shared out per epoch (the ranks' summed count is
    the set padded to a multiple of N, not N times it; the run records no per-rank indices, so the shards' being
    disjoint is chapter 00's sampler check), the processes and backend asked for, and the baseline's texts."""
    seen = [e["train_samples"] for e in d["epochs"]]
    padded = -(-d["data"]["train_size"] // nproc) * nproc
    return [
        Claim(
            f"the script's own comparison found the weights identical on all {nproc} ranks (printed, and 0 in "
            "metrics.json)",
            f"parameters identical on all {nproc} ranks: True" in output
            and d["aggregates"]["params_max_difference"] == 0.0,
        ),
        Claim(
            f"the {nproc} ranks trained on {seen[0]:,} examples per epoch together: the training set's "
            f"{d['data']['train_size']:,} texts (padded to a multiple of {nproc}), not "
            f"{nproc * d['data']['train_size']:,} (every rank on all of them); that no text went to two ranks is "
            "chapter 00's sampler check (section 2), not this count's",
            all(s == padded for s in seen),
        ),
        Claim(
            f"the script itself found a world of {d['ddp']['world_size']} processes with {d['ddp']['backend']} (its "
            f"metrics.json, from torchrun's environment): the {nproc} with {backend} the launch asked for",
            d["ddp"]["world_size"] == nproc and d["ddp"]["backend"] == backend,
        ),
        Claim(
            f"DDP and the baseline trained on the same texts ({d['data']['title']}: the fingerprints of the two "
            "metrics.json files agree)",
            d["data"]["fingerprint"] == base["data"]["fingerprint"],
        ),
    ]


def saved_model_claims(payload: dict, nproc: int) -> list[Claim]:
    """The checkpoint holds the bare model (no DDP prefix) and records the number of processes the notebook launched.
    (Its final accuracy is not claimed: the same process writes it into the checkpoint and into metrics.json.)"""
    keys = list(payload["state_dict"])
    return [
        Claim(
            "no checkpoint key has the DDP wrapper's 'module.' prefix",
            bool(keys) and not any(k.startswith(DDP_PREFIX) for k in keys),
        ),
        Claim(
            f"the checkpoint says {payload['metadata']['world_size']} processes trained it: the {nproc} this notebook "
            "launched",
            payload["metadata"]["world_size"] == nproc,
        ),
    ]


def no_torchrun_claims(output: str, m: dict) -> list[Claim]:
    """Exercise 3: `python scripts/train_ddp.py` without a launcher. The world is one process, and `--backend auto`
    picks what `choose_backend` picks for one process on this machine: nccl where there is a GPU (Kaggle's T4 x2),
    gloo without one. Judged from the launch line the script printed and the metrics.json it wrote."""
    want = choose_backend("auto", 1)[0]
    ran = m["ddp"]
    return [
        Claim(
            f"plain python: a world of one process, with {want} (what --backend auto picks for one process on this "
            f"machine); the script said '| world size {ran['world_size']} | {ran['backend']}'",
            f"| world size 1 | {want}" in output and ran["world_size"] == 1 and ran["backend"] == want,
        ),
        Claim("... and it still trained an epoch and wrote its metrics", len(m["epochs"]) == 1),
    ]


def comparison_rows(base: dict, d: dict) -> list[dict]:
    rows = []
    for name, m in (("1 process", base), (f"DDP x{d['ddp']['world_size']}", d)):
        rows.append(
            dict(
                name=name,
                procs=m["ddp"]["world_size"],
                global_batch=m["ddp"]["global_batch_size"],
                steps=m["epochs"][-1]["optimizer_steps"],
                acc=m["aggregates"]["final_val_accuracy"],
                sps=m["aggregates"]["steady_samples_per_s"],
                per_epoch=[e["samples_per_s"] for e in m["epochs"]],
            )
        )
    return rows


def speedup(rows) -> float:
    """DDP's steady samples/s over one process's: the one speed metric of the comparison."""
    return rows[1]["sps"] / rows[0]["sps"]


def comparison_table(rows) -> str:
    lines = [f"{'run':<10} {'procs':>5} {'global batch':>12} {'steps/epoch':>11} {'accuracy':>9} {'samples/s':>10}"]
    for r in rows:
        lines.append(
            f"{r['name']:<10} {r['procs']:>5} {r['global_batch']:>12} {r['steps']:>11} {100 * r['acc']:>8.2f}% "
            f"{r['sps']:>10.0f}"
        )
    lines.append(f"speedup (DDP samples/s / 1-process samples/s): {speedup(rows):.2f}x")
    return "\n".join(lines)


def comparison_claims(rows, d: dict, tol: float) -> list[Claim]:
    """Steps: the same global batch takes the same optimizer steps (a missing DistributedSampler doubles them).
    Accuracy: the DDP model learned (accuracy_floor) and lands within `tol` of the baseline (3 points on the CPU
    preset, 2 on GPUs: a tolerance chosen for two runs whose steps hold other examples and other dropout masks, not a
    spread measured over seeds). Speed is not claimed here: `speed_note` states what the run measured."""
    single, ddp = rows
    claims = []
    if single["global_batch"] == ddp["global_batch"]:
        claims.append(
            Claim(
                f"same global batch ({ddp['global_batch']}), and the run counted the same {ddp['steps']} optimizer "
                f"steps per epoch as the baseline: each rank stepped through its own 1/{ddp['procs']} of the data, "
                "not all of it (the same kind of training)",
                single["steps"] == ddp["steps"],
            )
        )
    claims += [
        Claim(
            f"the DDP model learned: {100 * ddp['acc']:.1f}%, at least {100 * accuracy_floor(d):.0f}%",
            ddp["acc"] >= accuracy_floor(d),
        ),
        Claim(
            f"DDP's accuracy is within {100 * tol:.0f} points of the baseline's ({100 * ddp['acc']:.1f}% vs "
            f"{100 * single['acc']:.1f}%)",
            abs(ddp["acc"] - single["acc"]) <= tol,
        ),
    ]
    return claims


def speed_note(rows, d: dict, env, load: OtherPrograms) -> str:
    """What the run measured about speed, and what it means, in the run's own numbers (a Markdown paragraph)."""
    s = speedup(rows)
    grad_mib = 4 * d["model"]["num_parameters"] / 2**20  # fp32 gradients; 1 MiB = 2^20 bytes
    per = d["config"]["batch_size"]
    published = (
        " (Chapter 05 estimates what two T4s on Kaggle would give, from their measured link: not measured here.)"
    )
    if env.nproc == 1:
        return (
            f"DDP ran **one process** here: notebook 01's steps through DDP's machinery, at {s:.2f}x its samples/s. "
            "That is not a speedup: the two runs differ by warm-up and by what else the machine did meanwhile. A "
            "speedup needs 2+ processes (Kaggle's T4 x2); chapter 05 measures how it grows with the batch." + published
        )
    verdict = "slower than" if s < 0.95 else "about as fast as" if s < 1.05 else f"{s:.2f}x as fast as"
    text = f"Here the {env.nproc}-process run was **{verdict}** one process ({s:.2f}x the samples/s)"
    busy = "" if load.cores is None else f" ({load.cores:.1f} of a core)"
    if load.quiet:
        text += f", while other programs kept the machine quiet{busy}"
    else:
        text += f", on a machine where other programs were busy meanwhile{busy}, so take the figure with salt"
    text += "." + epoch_by_epoch(rows)
    split = step_split(rows, d)
    text += (
        f" Per optimizer step each process computed {per} examples and all-reduced {grad_mib:.1f} MiB of gradients "
        + ("over TCP" if not env.n_gpus else "between GPUs")
        + f". A DDP step took {split['step_ms']:.1f} ms, of which {per} examples at one process's rate take "
        f"{split['compute_ms']:.1f} ms"
    )
    if split["other_ms"] > 0:
        text += (
            f": the other {split['other_ms']:.1f} ms ({100 * split['other_share']:.0f}%) is not timed apart here; "
            "candidates: the all-reduce (sized by the model, not the batch), DDP's own work, "
            f"{env.nproc} processes sharing one machine"
            + (
                f", and the smaller batch per process (a whole optimizer step, with its fixed costs, per {per} "
                f"examples where one process took one per {rows[0]['global_batch']})"
                if per < rows[0]["global_batch"]
                else ""
            )
            + ". NOTE: chapter 05 times the all-reduce and sweeps the per-process batch."
        )
    else:
        text += ": what DDP adds per step (the all-reduce, its own work) added nothing visible to it."
    return text + published


def epoch_by_epoch(rows) -> str:
    """The speedup epoch against epoch, and whether each run's first epoch was slower than its later ones (the warm-up
    the steady metric leaves out), in the run's own figures; empty for a one-epoch run."""
    single, ddp = rows
    n = min(len(single["per_epoch"]), len(ddp["per_epoch"]))
    if n < 2:
        return ""
    ratios = ", ".join(f"{b / a:.2f}x" for a, b in zip(single["per_epoch"][:n], ddp["per_epoch"][:n]))

    def first(r):
        later = sum(r["per_epoch"][1:]) / (len(r["per_epoch"]) - 1)
        was = "slower" if r["per_epoch"][0] < later else "not slower"
        return f"{was} ({r['per_epoch'][0]:.0f} against {later:.0f} samples/s later) for {r['name']}"

    warm = "epoch 1, left out in case of a warm-up"
    return f" Epoch by epoch the ratio was {ratios}; {warm}, ran {first(single)}, {first(ddp)}."


def step_split(rows, d: dict) -> dict:
    """A DDP step's time, in the run's own figures: `step_ms` (the steady epoch's time over its optimizer steps, from
    DDP's samples/s), `compute_ms` (one process's examples of that step at the baseline's samples/s: what the step
    would take if splitting the examples were all DDP did) and `other_ms`, the rest, which did not shrink with the
    examples (the all-reduce, DDP's own work, the processes' sharing of the cores and the fixed costs of a step taken
    per fewer examples, not told apart), with its share of the step."""
    single, ddp = rows
    last = d["epochs"][-1]
    step_s = last["train_samples"] / ddp["sps"] / last["optimizer_steps"]
    compute_s = last["train_samples"] / ddp["procs"] / single["sps"] / last["optimizer_steps"]
    other_s = step_s - compute_s
    return dict(
        step_ms=1000 * step_s, compute_ms=1000 * compute_s, other_ms=1000 * other_s, other_share=other_s / step_s
    )


def speed_figure(rows, title: str = ""):
    """Samples/s in every epoch of each run, side by side: the one speed metric of the comparison."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    n = max(len(r["per_epoch"]) for r in rows)
    width = 0.8 / len(rows)
    for k, r in enumerate(rows):
        xs = [e + 1 + (k - (len(rows) - 1) / 2) * width for e in range(len(r["per_epoch"]))]
        bars = ax.bar(xs, r["per_epoch"], width, label=f"{r['name']} (steady {r['sps']:.0f})")
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks(range(1, n + 1), [f"epoch {e}" for e in range(1, n + 1)])
    ax.set(ylabel="training samples/s", title=title or f"speed: {speedup(rows):.2f}x the samples/s of one process")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig
