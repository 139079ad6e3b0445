"""Chapter 07's checks of run B (killed, restarted, resumed) against run A, and of the snapshots it left: each
function returns the claims one cell settles, from figures the run just wrote.

    wm = weights_match(state_a, state_b, initial, plan.gpu, GPU_REL_TOL); print(wm.text); settle(wm.claims)
    print(metrics_table(m_a, m_b)); settle(metrics_claims(m_a, m_b, plan))
    settle_folded(snapshot_claims(snaps, model_pt, plan), "facts of the snapshot files ...")
    settle_folded(fallback_claims(out_c, last_c, prev, damaged, previous, plan), "facts of the fallback ...")
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from distrinews_lib.training import snapshot

from .claims import Claim
from .resume_demo import resumed_at
from .resume_match import distance

TIMINGS = ("epoch_time_s", "samples_per_s", "tokens_per_s")  # a metrics row's figures that differ from run to run


@dataclass(frozen=True)
class WeightsMatch:
    text: str  # how far training moved the weights, and how far B ends from A
    claims: list
    moved_l2: float  # L2 distance training moved run A's weights
    gap_l2: float  # L2 distance between A's and B's final weights


def weights_match(sa: dict, sb: dict, initial: dict, gpu: bool, rel_tol: float) -> WeightsMatch:
    """Run B's final weights against run A's, beside how far training moved A's from `initial` (so that a difference
    of zero cannot come from nothing having trained). On the CPU (gloo) every tensor must be bit-identical; on GPUs,
    whose kernels are not deterministic, B must end within rel_tol of the distance training moved: a bound that wide
    can miss a lost RNG or AdamW state, which the claim says."""
    moved_l2, moved_max = distance(sa, initial)
    gap_l2, gap_max = distance(sa, sb) if sa.keys() == sb.keys() else (float("inf"), float("inf"))
    n_equal = sum(torch.equal(sa[k], sb[k]) for k in sa if k in sb)
    text = (
        f"training moved the weights by L2 {moved_l2:.4g} (largest single change {moved_max:.3g})\n"
        f"run B's final weights differ from A's by L2 {gap_l2:.4g} (largest {gap_max:.3g}); "
        f"{n_equal}/{len(sa)} tensors bit-identical"
    )
    claims = [
        Claim(f"both hold the same {len(sa)} tensors, and training moved them", sa.keys() == sb.keys() and moved_l2 > 0)
    ]
    if gpu:
        claims.append(
            Claim(
                f"on GPUs, run B ends within {100 * rel_tol:.0f}% of the distance training moved "
                f"({100 * gap_l2 / max(moved_l2, 1e-30):.3g}%). Kernels are not deterministic, so a bound this wide "
                "can miss a lost RNG or AdamW state: only the CPU run's bit-for-bit check rules those out",
                gap_l2 <= rel_tol * moved_l2,
            )
        )
    else:
        claims.append(
            Claim(
                "run B's final weights equal run A's bit for bit (CPU, gloo): the resume was exact", n_equal == len(sa)
            )
        )
    return WeightsMatch(text, claims, moved_l2, gap_l2)


def metrics_table(m_a: dict, m_b: dict) -> str:
    """Both runs' metrics.json rows side by side: steps, train loss and val loss per epoch."""
    rows = [
        f"{'epoch':>5} {'steps A':>8} {'steps B':>8} {'train loss A':>13} {'train loss B':>13} {'val loss A':>11} "
        f"{'val loss B':>11}"
    ]
    for ea, eb in zip(m_a["epochs"], m_b["epochs"]):
        rows.append(
            f"{ea['epoch']:>5} {ea['optimizer_steps']:>8} {eb['optimizer_steps']:>8} {ea['train_loss']:>13.6f} "
            f"{eb['train_loss']:>13.6f} {ea['val_loss']:>11.6f} {eb['val_loss']:>11.6f}"
        )
    return "\n".join(rows)


def metrics_claims(m_a: dict, m_b: dict, plan) -> list:
    """Run B's metrics.json holds every epoch, its first counts all the epoch's steps although its process died in
    it, and is marked resumed (A's is not); on the CPU, every figure but the timings equals A's. A row's step_losses,
    where the record has them, are the steps its own launch ran: B's resumed epoch holds the last of A's."""
    untimed = lambda e: {k: v for k, v in e.items() if k not in (*TIMINGS, "resumed", "step_losses")}
    tail = lambda ea, eb: ea.get("step_losses", [])[len(ea.get("step_losses", [])) - len(eb.get("step_losses", [])) :]
    a, b = m_a["epochs"], m_b["epochs"]
    claims = [
        Claim(
            f"run B's metrics.json has every epoch; its epoch 1 counts all {plan.steps} steps and is marked resumed",
            len(b) == plan.epochs and b[0]["resumed"] and not a[0]["resumed"] and b[0]["optimizer_steps"] == plan.steps,
        )
    ]
    if not plan.gpu:
        claims.append(
            Claim(
                "every figure of both epochs but the timings is identical in A and B",
                [untimed(e) for e in b] == [untimed(e) for e in a]
                and all(eb.get("step_losses", []) == tail(ea, eb) for ea, eb in zip(a, b)),
            )
        )
    return claims


def snapshot_claims(snaps: list, model_pt, plan) -> list:
    """The snapshots run B kept (snapshot.list_snapshots, oldest first): two, the newest at the end of the last epoch;
    each over 2.5x the inference checkpoint (weights and AdamW's two moments: about 3x); the scheduler's position the
    steps taken and every rank's RNG state; an epoch-end snapshot without running totals, a mid-epoch one with every
    rank's, counted up to its position."""
    model_size = Path(model_pt).stat().st_size
    newest, oldest = snapshot.read_snapshot(snaps[-1]), snapshot.read_snapshot(snaps[0])
    return [
        Claim(
            f"two snapshots are kept, the newest written at the end of epoch {plan.epochs}",
            len(snaps) == 2 and Path(snaps[-1]).name == f"snap_e{plan.epochs + 1:03d}_b000000.pt",
        ),
        Claim(
            "each snapshot is over 2.5x the inference checkpoint (weights + AdamW's two moments)",
            all(Path(p).stat().st_size > 2.5 * model_size for p in snaps),
        ),
        Claim(
            f"the scheduler's position equals the steps taken; the RNG states of all {plan.nproc} ranks are there",
            newest["scheduler"]["last_epoch"] == newest["global_step"] and len(newest["rng"]) == plan.nproc,
        ),
        Claim(
            "an epoch-end snapshot needs no running totals; a mid-epoch one holds every rank's, up to its position",
            newest["meters"] is None
            and oldest["meters"] is not None
            and len(oldest["meters"]) == plan.nproc
            and all(m["batches"] == oldest["batches_done"] for m in oldest["meters"]),
        ),
    ]


def fallback_claims(out_c: str, last_c: dict, prev: dict, damaged, previous, plan) -> list:
    """Run C (one process, after the newest snapshot `damaged` was cut short): it warned and resumed from `previous`
    (whose payload is `prev`), warned that the data order changes, rescaled the snapshot's position to its own batches
    and steps (x plan.nproc: one step of the snapshot took a batch on every rank), covered the whole epoch in its
    metrics row `last_c`, and wrote a good snapshot over the damaged one. out_c: its output, whitespace squeezed."""
    skipped, step_1 = resumed_at(out_c)
    try:
        rewritten = snapshot.read_snapshot(damaged)["world_size"] == 1
    except snapshot.SnapshotError:
        rewritten = False
    return [
        Claim(
            f"the truncated snapshot was detected, with a warning, and the run resumed from {Path(previous).name}",
            f"warning: snapshot {damaged} is unreadable" in out_c and f"resumed from {previous}" in out_c,
        ),
        Claim(
            f"the script warned that {plan.nproc} -> 1 process changes the data order",
            f"taken with {plan.nproc} process(es), this run has 1" in out_c and "will not be bit-identical" in out_c,
        ),
        Claim(
            f"one process skipped {skipped} batches ({prev['batches_done']} x {plan.nproc} ranks) and counts the "
            f"snapshot's {prev['global_step']} steps as {step_1} of its own; its metrics cover the whole epoch "
            f"({plan.n} samples)",
            skipped == prev["batches_done"] * plan.nproc
            and step_1 == prev["global_step"] * plan.nproc
            and last_c["train_samples"] == plan.n
            and bool(last_c["resumed"]),
        ),
        Claim("the damaged file was replaced by a good snapshot", rewritten),
    ]
