"""Did a resumed run end where the uninterrupted run ended? Chapter 07 asks it twice: of a run restarted on the same
world size (the answer must be: bit for bit), and of a sharded run resumed on another world size (within TOLERANCE).

    l2, largest = distance(state_a, state_b)                    # two state dicts of tensors
    m = compare("2 -> 4 ranks", reference_end, resumed_from, other_end)   # three sharded checkpoint folders
    m.ok, m.bitwise, table([m, ...])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

# Why 3e-3: on another world size the same global batch is summed in another order (4 ranks of 8 texts are not the
# bits of 2 ranks of 16), and fp32 rounds each order differently. AdamW divides by sqrt(v): where a gradient is nearly
# zero, a rounding difference in it becomes a visible step, so the differences grow a little with every step. Measured
# with scripts/train_sharded.py (2 -> 4 and 2 -> 1 ranks, 10 steps after the resume, seeds 0-3, the embedded sample
# and the 12k AG News folder): the weights at most 3.3e-4 of the distance the resumed steps moved them, the moments up
# to 1.2e-5 of their size (a course run, 2 -> 1 rank). A real mistake is far larger: the uninterrupted run's own
# checkpoints one step apart differ by 0.14 (weights) and 0.68 (exp_avg). 3e-3 sits 9x above the noise and 47x below
# one step.
TOLERANCE = 3e-3


def distance(sa: dict, sb: dict) -> tuple[float, float]:
    """(L2 norm of the difference over the floating-point tensors both hold, the largest single |difference|)."""
    keys = [k for k in sa if torch.is_tensor(sa[k]) and sa[k].is_floating_point()]
    l2 = math.sqrt(sum(float((sa[k].double() - sb[k].double()).pow(2).sum()) for k in keys))
    return l2, max((float((sa[k].double() - sb[k].double()).abs().max()) for k in keys), default=0.0)


def norm(sa: dict) -> float:
    return math.sqrt(sum(float(v.double().pow(2).sum()) for v in sa.values() if torch.is_tensor(v)))


def parts(folder) -> dict:
    """A sharded checkpoint's weights and AdamW moments, whole: {"weights": {fqn: tensor}, "exp_avg": ..., ...}."""
    from distrinews_lib import sharded_checkpoint

    state = sharded_checkpoint.read_whole(folder, keys={"model", "optim"})
    moments = state["optim"]["state"]
    return {
        "weights": state["model"],
        **{m: {k: s[m] for k, s in moments.items()} for m in ("exp_avg", "exp_avg_sq")},
    }


@dataclass
class Match:
    label: str
    weights: float  # |w - w_ref| / |w_ref - w_start|: against the distance the resumed steps moved the weights
    exp_avg: float  # |m - m_ref| / |m_ref|
    exp_avg_sq: float  # |v - v_ref| / |v_ref|
    largest: float  # the largest single weight difference
    bitwise: bool  # every tensor equal, bit for bit

    @property
    def ok(self) -> bool:
        return max(self.weights, self.exp_avg, self.exp_avg_sq) <= TOLERANCE


def compare(label: str, reference_end, resumed_from, other_end) -> Match:
    """How far `other_end` (a run resumed from `resumed_from`) ended from `reference_end` (the run that never
    stopped), each part measured against its own scale (see TOLERANCE)."""
    ref, start, other = parts(reference_end), parts(resumed_from), parts(other_end)
    moved, _ = distance(ref["weights"], start["weights"])
    gap, largest = distance(ref["weights"], other["weights"])
    rel = {m: distance(ref[m], other[m])[0] / (norm(ref[m]) or 1.0) for m in ("exp_avg", "exp_avg_sq")}
    bitwise = all(torch.equal(ref[p][k], other[p][k]) for p in ref for k in ref[p])
    return Match(label, gap / (moved or 1.0), rel["exp_avg"], rel["exp_avg_sq"], largest, bitwise)


def table(matches: list[Match]) -> str:
    head = f"{'resumed run':<22} {'weights':>9} {'exp_avg':>9} {'exp_avg_sq':>10} {'largest |dw|':>12}  bit-identical"
    rows = [
        f"{m.label:<22} {m.weights:>9.1e} {m.exp_avg:>9.1e} {m.exp_avg_sq:>10.1e} {m.largest:>12.1e}  {m.bitwise}"
        for m in matches
    ]
    return "\n".join([head, *rows, f"(relative differences from the run that never stopped; tolerance {TOLERANCE:g})"])


def end_folder(run, step: int) -> Path:
    from distrinews_lib import sharded_checkpoint

    return sharded_checkpoint.folder_for(run, step)
