"""Whether each of chapter 04's pitfalls showed its symptom when broken, and lost it when fixed.

Each function reads what a pitfall's script measured (scripts/pitfalls/NN_*.py writes a JSON) and returns a Symptom:
the claims the chapter checks, with the run's own figures in their words, a few lines that show the measurement, and
the pitfall's row of the summary table.

    found = Found()
    s = found.add(set_epoch(r))     # r: the JSON 01_set_epoch.py wrote
    print(s.table)                  # what the run measured, in a few lines
    settle(s.claims)                # 'checked: ...', or the notebook fails with 'claim failed: ...'
    found.markdown()                # every pitfall, measured broken and fixed

Most symptoms are counts (orders, samples, keys, rows, all-reduces): they hold exactly or not at all, and their
claims compare exactly. Where a claim compares floats or times, the function's docstring says why its margin is
what it is. The pitfalls whose broken run must fail (7, 9, 10, 11) are read in pitfall_failures.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .claims import Claim


@dataclass
class Symptom:
    pitfall: str  # "1. no set_epoch": the summary table's first column
    broken: str  # what the broken run measured, in a few words
    fixed: str  # what the fixed run measured
    claims: list = field(default_factory=list)  # Claim: what the chapter checks
    table: str = ""  # a few lines that show the measurement

    @property
    def holds(self) -> bool:
        return all(c.holds for c in self.claims)


class Found(list):
    """The chapter's symptoms, in order: add() keeps one and returns it; markdown() is the summary table."""

    def add(self, symptom: Symptom) -> Symptom:
        self.append(symptom)
        return symptom

    def markdown(self) -> str:
        cell = lambda text: str(text).replace("|", "/")
        rows = [f"| {cell(s.pitfall)} | {cell(s.broken)} | {cell(s.fixed)} |" for s in self]
        return "\n".join(["| pitfall | broken (measured) | fixed (measured) |", "|---|---|---|", *rows])


def set_epoch(r: dict) -> Symptom:
    """Pitfall 1: without set_epoch every epoch replays one order; with it each epoch has its own. Counts: exact."""
    e, b, f = r["epochs"], r["broken"], r["fixed"]
    nb, nf = b["distinct_orders_per_rank"], f["distinct_orders_per_rank"]
    claims = [
        Claim(
            f"broken: every rank saw {nb[0]} order in {e} epochs, the same batches in the same sequence",
            all(n == 1 for n in nb),
        ),
        Claim(f"fixed: every rank saw {nf[0]} different orders in {e} epochs", all(n == e for n in nf)),
        Claim(
            "either way each epoch covers every sample once across the ranks",
            b["each_epoch_covers_all"] and f["each_epoch_covers_all"],
        ),
    ]
    return Symptom(
        "1. no set_epoch", f"{nb[0]} distinct order in {e} epochs", f"{nf[0]} distinct orders in {e} epochs", claims
    )


def no_sampler(r: dict) -> Symptom:
    """Pitfall 2: without DistributedSampler every rank iterates over the whole dataset. Counts: exact."""
    b, f, n, world = r["broken"], r["fixed"], r["n"], r["world_size"]
    table = "\n".join(
        f"{mode:<6}: samples per rank {x['samples_per_rank']}, steps per rank {x['steps_per_rank']}, "
        f"each sample processed {x['duplication']:.1f}x"
        for mode, x in (("broken", b), ("fixed", f))
    )
    claims = [
        Claim(
            f"broken: every rank processed all {n} samples: {world}x the work",
            b["samples_per_rank"] == [n] * world and b["duplication"] == world,
        ),
        Claim(
            f"broken: {b['steps_per_rank'][0]} steps per rank, as many as one process: no speed-up",
            b["steps_per_rank"] == [r["single_process_steps"]] * world,
        ),
        Claim(
            f"fixed: each of the {n} samples processed once, {f['steps_per_rank'][0]} steps per rank",
            f["duplication"] == 1.0
            and f["distinct_samples"] == n
            and max(f["steps_per_rank"]) < max(b["steps_per_rank"]),
        ),
    ]
    return Symptom(
        "2. no DistributedSampler",
        f"{b['samples_per_rank'][0]} samples/rank, {b['duplication']:.0f}x the work",
        f"{f['samples_per_rank'][0]} samples/rank, 1x",
        claims,
        table,
    )


def print_every_rank(output: str, world: int) -> Symptom:
    """Pitfall 3: every rank prints its own loss; fixed, rank 0 prints the all-reduced mean once.

    Both modes draw the same data (the script reseeds each rank before each mode and never trains), so the fixed
    line of an epoch must be the mean of the broken lines of that epoch. The ranks' messages are read one by one,
    even where two share a line (print() writes the text and its newline apart, so they can interleave), and shown
    one per line. Margin 1.5e-4: every printed loss is rounded to 4 decimals (5e-5 each, on the mean and on the
    fixed line), plus float32 sums."""
    broken = re.findall(r"\[broken\] epoch (\d+) loss ([\d.]+)", output)
    fixed = {int(e): float(v) for e, v in re.findall(r"\[fixed\] epoch (\d+) loss ([\d.]+)", output)}
    by_epoch = {}
    for e, v in broken:
        by_epoch.setdefault(int(e), []).append(float(v))
    epochs = len(fixed)
    values_e0 = sorted({v for e, v in broken if e == "0"})
    means = {e: sum(v) / len(v) for e, v in by_epoch.items() if len(v) == world}
    worst = max((abs(fixed[e] - means[e]) for e in fixed if e in means), default=float("inf"))
    glued = sum(1 for line in output.splitlines() if line.count("[broken]") > 1)
    shown = [f"[broken] epoch {e} loss {v}" for e, v in broken] + [
        f"[fixed] epoch {e} loss {v:.4f}" for e, v in sorted(fixed.items())
    ]
    if glued:
        held = "1 line held" if glued == 1 else f"{glued} lines held"
        shown.insert(
            len(broken),
            f"(the broken run printed {len(broken)} messages on {len(broken) - glued} lines: {held} two ranks' "
            "messages, interleaved)",
        )
    e0 = by_epoch.get(0, [])
    e0_sum = " + ".join(f"{v:.4f}" for v in e0)
    claims = [
        Claim(
            f"broken: {len(broken)} messages for {epochs} epochs, one per rank, and epoch 0 'has' {len(values_e0)} "
            f"different losses ({', '.join(values_e0)})",
            epochs > 0 and len(broken) == world * epochs and len(values_e0) == world,
        ),
        Claim(
            f"fixed: {len(fixed)} lines, one per epoch, each the mean of that epoch's {world} broken lines (epoch 0: "
            f"({e0_sum}) / {len(e0)} = {means[0]:.4f}, printed {fixed[0]:.4f}; every epoch within {worst:.1g}, the "
            "printed digits' rounding)"
            if worst < 1 and 0 in means and 0 in fixed
            else "fixed: one line per epoch, each the mean of that epoch's broken lines",
            len(fixed) == epochs and set(means) == set(fixed) and worst < 1.5e-4,
        ),
    ]
    return Symptom(
        "3. printing on every rank",
        f"{world} messages/epoch, {len(values_e0)} different losses",
        "1 line/epoch, the global mean",
        claims,
        "\n".join(shown),
    )


def save_wrapper(r: dict) -> Symptom:
    """Pitfall 4: the wrapper's state_dict names every key 'module.'; a bare model refuses it. Exact."""
    b, f = r["broken"], r["fixed"]
    n = len(b["keys"])
    table = f"broken keys: {', '.join(b['keys'])}\nload_state_dict: {(b['error'] or '')[:150]}..."
    claims = [
        Claim(f"broken: all {n} keys start with 'module.'", b["module_prefixed"] == n > 0),
        Claim(
            "broken: a bare model refuses the file: its error names the missing keys",
            not b["loads_into_bare_model"] and "Missing key" in (b["error"] or ""),
        ),
        Claim(
            "rescue: with the prefix stripped, the old file loads strictly, and its weights are the trained model's",
            bool(b.get("loads_after_stripping_prefix")) and bool(b.get("rescued_weights_match")),
        ),
        Claim(
            "fixed: no 'module.' key; it loads strictly, and its weights are the trained model's",
            f["module_prefixed"] == 0 and f["loads_into_bare_model"] and f["weights_match"],
        ),
    ]
    return Symptom(
        "4. saving the DDP wrapper",
        f"{b['module_prefixed']}/{n} keys 'module.', load fails",
        "0 'module.' keys, loads strictly",
        claims,
        table,
    )


def shared_file(r: dict) -> Symptom:
    """Pitfall 5: every rank appends its own rows and truncates the one summary file. Exact."""
    b, f, e, world = r["broken"], r["fixed"], r["epochs"], r["world_size"]
    claims = [
        Claim(
            f"broken: {b['csv_rows']} log rows for {e} epochs, {world} per epoch with {b['distinct_losses_epoch0']} "
            "different (rank-local) losses for epoch 0",
            b["csv_rows"] == world * e and b["rows_per_epoch"] == world and b["distinct_losses_epoch0"] == world,
        ),
        Claim("broken: the summary file is torn: JSON cannot parse it", not b["summary_readable"]),
        Claim(
            f"fixed: {f['csv_rows']} rows, one global loss per epoch, and a readable summary",
            f["csv_rows"] == e and f["distinct_losses_epoch0"] == 1 and f["summary_readable"],
        ),
    ]
    return Symptom(
        "5. several ranks writing one file",
        f"{b['csv_rows']} rows for {e} epochs; summary unreadable",
        f"{f['csv_rows']} rows; summary readable",
        claims,
        f"broken summary file: {b['error']}",
    )


def eval_padding(r: dict) -> Symptom:
    """Pitfall 6: summing correct/total over ranks counts the sampler's padded duplicates.

    Accuracies are ratios of small counts: two that differ, differ by at least 1/(n * padded) (over 1e-3 here), and
    two equal ones agree to rounding (1e-9)."""
    b, f, n, truth = r["broken"], r["fixed"], r["n"], r["truth_accuracy"]
    table = (
        f"{n} samples, padded to {r['padded_to']}: truth {truth:.4f}; broken {b['accuracy']:.4f} over "
        f"{b['counted']}; fixed {f['accuracy']:.4f} over {f['counted']}"
    )
    claims = [
        Claim(
            f"broken: counted {b['counted']} samples of a {n}-sample set, and accuracy {b['accuracy']:.4f}, not the "
            f"true {truth:.4f}",
            b["counted"] == r["padded_to"] > n and abs(b["accuracy"] - truth) > 1e-9,
        ),
        Claim(
            f"fixed: {f['counted']} samples, accuracy {f['accuracy']:.4f}, as one process measures it",
            f["counted"] == n and abs(f["accuracy"] - truth) < 1e-9,
        ),
        Claim(
            "the library's evaluate() (train_ddp.py's) is exact too", abs(r["library_evaluate_accuracy"] - truth) < 1e-9
        ),
    ]
    return Symptom(
        "6. eval counts sampler padding",
        f"{b['counted']} of {n} counted, acc {b['accuracy']:.4f} (true {truth:.4f})",
        f"{f['counted']} counted, acc {f['accuracy']:.4f}",
        claims,
        table,
    )


def no_sync(r: dict) -> Symptom:
    """Pitfall 8: accumulating K micro-batches without no_sync all-reduces after each of them.

    The counts and bytes are exact (a communication hook counts them). Time: each variant's fastest of its steps,
    the two stepped in turn, so both saw the same machine and other programs could only add time; broken moves K times
    the bytes, so it must be slower (no margin: any machine shows it). The parameters agree within 1e-5: the same sums,
    added in another order in fp32."""
    b, f, k = r["broken"], r["fixed"], r["accum"]
    table = "\n".join(
        f"{mode:<6}: all-reduces per micro-batch {x['allreduce_per_micro_batch']}, {x['mib_per_step']:.1f} MiB and "
        f"{x['ms_per_step']:.1f} ms per optimizer step"
        for mode, x in (("broken", b), ("fixed", f))
    )
    per_micro_fixed = f["allreduce_per_micro_batch"]
    claims = [
        Claim(
            f"broken: {k}x the all-reduces ({b['allreduce_per_step']:.0f} vs {f['allreduce_per_step']:.0f} per step) "
            f"and {k}x the bytes ({b['mib_per_step']:.1f} vs {f['mib_per_step']:.1f} MiB)",
            b["allreduce_per_step"] == k * f["allreduce_per_step"] > 0
            and abs(b["mib_per_step"] / f["mib_per_step"] - k) < 1e-6,
        ),
        Claim(
            f"fixed: only the last of the {k} micro-batches all-reduced",
            len(per_micro_fixed) == k and not any(per_micro_fixed[:-1]) and per_micro_fixed[-1] > 0,
        ),
        Claim(
            f"broken: slower, {b['ms_per_step']:.1f} vs {f['ms_per_step']:.1f} ms per optimizer step",
            b["ms_per_step"] > f["ms_per_step"],
        ),
        Claim(
            "the same parameters either way, within float rounding (max difference "
            f"{r['max_param_diff_broken_vs_fixed']:.1e})",
            r["max_param_diff_broken_vs_fixed"] < 1e-5,
        ),
    ]
    return Symptom(
        "8. accumulation without no_sync",
        f"{b['allreduce_per_step']:.0f} all-reduces, {b['ms_per_step']:.0f} ms per step",
        f"{f['allreduce_per_step']:.0f} all-reduces, {f['ms_per_step']:.0f} ms per step",
        claims,
        table,
    )


def batchnorm(r: dict) -> Symptom:
    """Pitfall 12: BatchNorm's statistics per rank, against one process with the global batch.

    Broken differs by over 1e-3 (it differs by tenths: each rank's mean comes from 4 samples, not 8); fixed agrees
    between ranks within 1e-6 (the same all-reduced numbers) and with the one process within 1e-4 (the same sums,
    added in another order over 20 steps in fp32)."""
    b, f = r["broken"], r["fixed"]
    nccl = r["backend"] == "nccl"  # torch's SyncBatchNorm by convert_sync_batchnorm; on gloo the script's stand-in
    fixed_diff = max(f["mean_diff_to_global"], f["var_diff_to_global"])
    claims = [
        Claim(
            f"broken: the ranks' running means differ by up to {b['mean_diff_between_ranks']:.3f}, are off the global "
            f"batch's by up to {b['mean_diff_to_global']:.3f}, and the weights by {b['weight_diff_to_global']:.3f}: "
            "another model",
            min(b["mean_diff_between_ranks"], b["mean_diff_to_global"], b["weight_diff_to_global"]) > 1e-3,
        ),
        Claim(
            f"fixed: {'every BatchNorm layer became a SyncBatchNorm; ' if nccl else ''}the ranks' statistics agree "
            f"(max difference {f['mean_diff_between_ranks']:.1e}) and equal the global batch's within float rounding "
            f"(max difference {fixed_diff:.1e}), weights too ({f['weight_diff_to_global']:.1e})",
            (not nccl or all(s["type"] == "SyncBatchNorm" for s in f["per_rank"]))
            and f["mean_diff_between_ranks"] < 1e-6
            and fixed_diff < 1e-4
            and f["weight_diff_to_global"] < 1e-4,
        ),
    ]
    return Symptom(
        "12. BatchNorm without SyncBatchNorm",
        f"running means differ across ranks by {b['mean_diff_between_ranks']:.3f}, from global by "
        f"{b['mean_diff_to_global']:.3f}",
        f"= global within float rounding (max diff {fixed_diff:.0e})",
        claims,
    )


def lr_scaling(r: dict) -> Symptom:
    """Pitfall 13: the same learning rate on N times the global batch learns less per sample seen.

    The margins: the same lr must end over 0.05 higher in test loss and 2 points lower in accuracy (it ends 0.2 and
    10 points off here, on any machine: the data and the seeds are fixed); the scaled lr with warm-up must close over
    75% of the loss gap and come within half the accuracy gap (it closes 99.5% of it here)."""
    one, b, f = r["one_process"], r["broken"]["curve"], r["fixed"]["curve"]
    world, n = r["world_size"], r["n_train"] * r["epochs"]
    loss_gap, acc_gap = b[-1][1] - one[-1][1], one[-1][2] - b[-1][2]
    closed = 1 - abs(f[-1][1] - one[-1][1]) / loss_gap if loss_gap > 0 else 0.0
    # the figures a sentence states are those of the table above it: losses to 3 decimals, accuracies to 1 (in %)
    loss = {k: round(c[-1][1], 3) for k, c in (("one", one), ("broken", b), ("fixed", f))}
    acc = {k: round(100 * c[-1][2], 1) for k, c in (("one", one), ("broken", b), ("fixed", f))}
    shown = (
        1 - abs(loss["fixed"] - loss["one"]) / (loss["broken"] - loss["one"]) if loss["broken"] > loss["one"] else 0.0
    )
    table = "\n".join(
        f"{name:<45} {len(curve):>4} steps -> test loss {curve[-1][1]:.3f}, accuracy {100 * curve[-1][2]:.1f}%"
        for name, curve in lr_runs(r)
    )
    table += f"\n(each run is one epoch of the same {n:,} samples: one process in {len(one)} steps, DDP in {len(b)})"
    claims = [
        Claim(
            f"broken: the same lr ends {loss['broken'] - loss['one']:.3f} higher in test loss and "
            f"{acc['one'] - acc['broken']:.1f} points lower in accuracy: it learned less per sample",
            loss_gap > 0.05 and acc_gap > 0.02,
        ),
        Claim(
            f"fixed: lr x{world} with warm-up closes {100 * shown:.1f}% of the loss gap (accuracy "
            f"{acc['fixed']:.1f}% vs {acc['one']:.1f}%)",
            closed > 0.75 and abs(f[-1][2] - one[-1][2]) < acc_gap / 2,
        ),
    ]
    return Symptom(
        "13. same lr, N x the global batch",
        f"test acc {100 * b[-1][2]:.1f}% vs {100 * one[-1][2]:.1f}% (1 process)",
        f"lr x{world} + warm-up: {100 * f[-1][2]:.1f}%",
        claims,
        table,
    )


def lr_runs(r: dict) -> list:
    """(label, curve) of pitfall 13's three runs; a curve is [samples seen, test loss, test accuracy] per step."""
    world = r["world_size"]
    return [
        (f"1 process, batch {r['batch_per_rank']}, lr {r['lr_one_process']:g}", r["one_process"]),
        (f"{world} ranks, global batch {r['global_batch']}, same lr {r['broken']['lr']:g}", r["broken"]["curve"]),
        (
            f"{world} ranks, lr x{world} = {r['fixed']['lr']:g}, {r['fixed']['warmup_steps']} warm-up steps",
            r["fixed"]["curve"],
        ),
    ]
