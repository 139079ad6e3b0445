"""Chapter 03's race on loopback (the machine's own link): the timing table and the claims its rounds support, and the
bucket-size sweep's table and figure.

    t = res["timing"]
    print(timing_table(t)); settle(timing_claims(t, target=1.10, quiet_cores=0.3))
    print(sweep_table(res["sweep"])); plot_sweep(res["sweep"])
    settle(collectives_claims(t, n_params=72))
"""

from __future__ import annotations

import statistics

from ..bench.timing import NOISY_SPREAD
from ..claims import Claim
from ..plots import finish


def quiet(t: dict, quiet_cores: float) -> bool:
    """Whether other programs left the cores alone while the rounds were timed (foreign_cores, the machine's busy time
    minus the race's own): a busy machine's ratios are noise as much as speed."""
    return t["foreign_cores"] is not None and t["foreign_cores"] <= quiet_cores


def timing_table(t: dict) -> str:
    lines = [f"{'':>10} {'median s/step':>13} {'vs DDP':>7}"]
    for n, s in t["median_step_s"].items():
        lines.append(f"{n:>10} {s:>13.4f} {(t['ratio_vs_ddp'].get(n) or 1.0):>6.2f}x")
    return "\n".join(lines)  # the rounds and the quiet cores: chapter 03's folded note, and timing_claims on a busy run


def ddp_spread(t: dict) -> float:
    """How far torch's DDP agrees with itself round to round: twice the median distance of its rounds from their
    median, as a share of it. A virtual machine's host can slow whole rounds with nothing in the machine to show for
    it, and no ratio to DDP is measured closer than DDP agrees with itself; the ratio is of medians, so the spread is
    the median's own (one odd round moves neither)."""
    rounds = t["step_s"]["ddp"]
    med = statistics.median(rounds)
    return 2 * statistics.median(abs(s - med) for s in rounds) / med


def timing_claims(t: dict, target: float, quiet_cores: float) -> list:
    """The hand-built bucketed rung runs at most `target` x torch's DDP's step, give or take DDP's own spread;
    bucketed beats naive. Overlapped is not claimed faster: on loopback its one async all-reduce per tensor can cost
    more than it hides (a CPU's backward leaves little to overlap). Checked on a quiet machine, the first only where
    DDP's rounds agree within NOISY_SPREAD. The first catches a rung far slower than DDP; on loopback it cannot tell
    overlap from none (flat is as fast): the dialed link's checks do."""
    med, ratio, spread = t["median_step_s"], t["ratio_vs_ddp"], ddp_spread(t)
    busy = None if quiet(t, quiet_cores) else f"other programs kept {t['foreign_cores']:.2f} cores busy"
    noisy = None if spread <= NOISY_SPREAD else f"DDP's own rounds moved by {100 * spread:.0f}%"
    return [
        Claim(
            f"the hand-built bucketed DDP runs at {ratio['bucketed']:.2f}x torch's DDP step time (<= "
            f"{target + spread:.2f})",
            ratio["bucketed"] <= target + spread,
            busy or noisy,
        ),
        Claim(
            f"bucketed ({med['bucketed']:.3f} s/step) is faster than naive ({med['naive']:.3f} s/step: a blocking "
            "all-reduce per gradient, none overlapped)",
            med["bucketed"] < med["naive"],
            busy,
        ),
    ]


def prediction_table(predicted: dict, measured: dict) -> str:
    """The learner's predicted collectives per step beside the counts the race measured, for the rungs asked about
    only (predicted's keys); "right" or "wrong" once a prediction is written (None: not yet)."""
    lines = [f"{'':>10} {'predicted':>9} {'measured':>8}"]
    for k, p in predicted.items():
        v = measured[k]
        lines.append(f"{k:>10} {str(p):>9} {v:>8.0f}" + ("" if p is None else ("  right" if p == v else "  wrong")))
    return "\n".join(lines)


def collectives_claims(t: dict, n_params: int) -> list:
    """What each rung launched in a step, counted from its calls to torch.distributed (race()'s warm-up step,
    watch.calls_per_step: t["collective_kinds"], {kind: calls}), against what its design sends on a model of
    `n_params` tensors: naive and overlapped an all-reduce per tensor, flat one all-reduce, ZeRO-1 one reduce-scatter
    and one all-gather, bucketed all-reduces only, exactly as many as torch's DDP has buckets (read from their sizes:
    DDP reduces in C++), and more than one. A rung that sends more, fewer or another kind fails its claim (a bucket
    rule off by one too); exact counts, since a call is a call."""
    k, per = t["collective_kinds"], t["collectives_per_step"]
    each = {"all_reduce": n_params}
    return [
        Claim(
            f"naive and overlapped called all_reduce once per parameter tensor ({n_params} on the wide model) and "
            "nothing else",
            k["naive"] == k["overlapped"] == each,
        ),
        Claim(
            "flat called 1 all_reduce; ZeRO-1 1 reduce-scatter and 1 all-gather (counted from their calls)",
            k["flat"] == {"all_reduce": 1} and k["zero1"] == {"reduce_scatter": 1, "all_gather": 1},
        ),
        Claim(
            f"bucketed called all_reduce {per['bucketed']:.0f} times, once per bucket of torch's DDP "
            f"({per['ddp']:.0f}): more than one, so they can overlap backward",
            set(k["bucketed"]) == {"all_reduce"} and per["bucketed"] == per["ddp"] > 1,
        ),
    ]


def per_message_line(t: dict) -> str:
    """What one more message cost on this run's loopback: naive's step less flat's, over the messages naive sends
    beyond flat's one (both block after backward; naive sends a message per gradient). A figure shown, not a claim."""
    per, med = t["collectives_per_step"], t["median_step_s"]
    extra = per["naive"] - per["flat"]
    ms = 1000 * (med["naive"] - med["flat"]) / extra
    return (
        f"on loopback a message cost about {ms:.2f} ms on this run: naive's {per['naive']:.0f} all-reduces took "
        f"{med['naive']:.3f} s/step, flat's one {med['flat']:.3f} ({extra:.0f} messages more)"
    )


def sweep_table(sw: dict) -> str:
    lines = [f"{'bucket MiB':>10} {'buckets (ours/DDP)':>18} {'ours s/step':>11} {'DDP s/step':>10}"]
    for mb, v in sw.items():
        lines.append(
            f"{mb:>10} {v['bucketed_buckets']:>9}/{v['ddp_buckets']:<8} {v['bucketed_step_s']:>11.4f} "
            f"{v['ddp_step_s']:>10.4f}"
        )
    return "\n".join(lines)


def plot_sweep(sw: dict, save_to=None):
    """Seconds per step against the bucket size, the hand-built rung and torch's DDP timed in the same rounds."""
    from ..plots import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3))
    mbs = [float(k) for k in sw]
    ax.plot(mbs, [v["bucketed_step_s"] for v in sw.values()], "o-", label="by hand (bucketed)")
    ax.plot(mbs, [v["ddp_step_s"] for v in sw.values()], "s--", label="torch DDP")
    ax.set_xscale("log")
    ax.set(xlabel="bucket size (MiB)", ylabel="s / step (median round)", title="the wide model on loopback")
    ax.legend()
    return finish(fig, save_to)
