"""Chapter 00's runs, read back: the tables its cells print and the claims it checks, from the JSON the concept
scripts (scripts/concepts/) wrote. Each *_claims function returns distrinews_course.claims.Claim objects for
settle(); each margin is explained where it is set.

    res, hello = run_alone("scripts/concepts/01_hello_allreduce.py", OUT / "01_hello_allreduce.json", NP, TIMEOUT_S)
    print(hello_table(hello)); settle(hello_claims(hello))
    print(bucket_table(bwd)); settle(bucket_claims(bwd))
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass

from distrinews_lib.checkpoint_format import DDP_PREFIX

from .claims import Claim

GRAD_EXACT = 1e-5  # float32 gradients of a 3-weight model, summed in another order: they agree to ~1e-7


# Section 1: processes, ranks and the all-reduce
def hello_table(hello: dict) -> str:
    lines = [
        f"{'rank':>4} {'local_rank':>10} {'world_size':>10} {'pid':>8} {'device':>7} {'holds':>5} "
        f"{'all-reduce SUM':>14}"
    ]
    for r in hello["ranks"]:
        lines.append(
            f"{r['rank']:>4} {r['local_rank']:>10} {r['world_size']:>10} {r['pid']:>8} {r['device']:>7} "
            f"{r['value']:>5.0f} {r['sum']:>14.0f}"
        )
    return "\n".join(lines)


def _max_diff(a, b) -> float:
    return max(abs(x - y) for x, y in zip(a, b))


def hello_claims(hello: dict) -> list[Claim]:
    """What the collectives did. Who each process is (its RANK, LOCAL_RANK, WORLD_SIZE and PID) is not claimed:
    torchrun sets them, and rank 0 writes the report only once every rank has handed in its part, so no bug in the
    course's code could fail such a claim (reading LOCAL_RANK as the rank would pass on one machine);
    hello_table prints them as facts instead."""
    ranks = hello["ranks"]
    n = len(ranks)
    total = n * (n + 1) / 2  # rank r held r + 1
    worst = max(_max_diff(r["averaged_grad"], r["full_batch_grad"]) for r in ranks)
    return [
        Claim(f"all-reduce SUM gave every rank the same total, {total:.0f}", all(r["sum"] == total for r in ranks)),
        Claim(
            "each rank's local gradient differs (its own shard of the batch)",
            len({tuple(r["local_grad"]) for r in ranks}) == n,
        ),
        Claim(
            f"the mean of the ranks' local gradients is the gradient of the whole batch (max diff {worst:.1e})",
            worst < GRAD_EXACT,
        ),
    ]


# Section 3: DataParallel runs its replicas in this one process
@dataclass
class ReplicaCall:
    pid: int
    thread: int
    device: str
    rows: int


@contextmanager
def watch_replicas(module):
    """Record every forward of `module` (and of its replicas, which DataParallel copies with the hooks) while the
    block runs: in which process and thread it ran, on which device, on how many rows.

        with watch_replicas(net) as calls:
            y = torch.nn.DataParallel(net)(x)
    """
    calls = []
    hook = module.register_forward_hook(
        lambda mod, inp, out: calls.append(
            ReplicaCall(os.getpid(), threading.get_ident(), str(out.device), len(inp[0]))
        )
    )
    try:
        yield calls
    finally:
        hook.remove()


def replica_table(calls: list, rows: int) -> str:
    me = threading.get_ident()
    return "\n".join(
        f"replica forward: pid {c.pid}{' (this kernel)' if c.pid == os.getpid() else ''}, "
        f"{'this cell' if c.thread == me else 'a worker'} thread, {c.device}, "
        f"{c.rows} of the batch's {rows} rows"
        for c in calls
    )


def dataparallel_claims(calls: list, output, rows: int, n_gpus: int) -> list[Claim]:
    """With 2+ GPUs DataParallel splits the batch over one thread per GPU (checked); with one or none it calls the
    model once, which holds by construction (DataParallel.forward returns self.module(...)): a NOTE, not a check.
    That every replica runs inside this one process is not claimed: a hook in this process sees this process's PID
    whatever DP did, so such a check could not fail (replica_table prints the PID as a fact instead). Nor is DP's
    'module.' prefix: DP keeps the net as self.module, so its keys carry it by construction (the cell prints them;
    section 6 checks DDP's keys against the checkpoint's)."""
    me = threading.get_ident()
    claims = []
    if n_gpus >= 2:
        claims += [
            Claim(
                f"one forward per GPU ({n_gpus}), each on its own slice of the {rows} rows",
                sorted(c.device for c in calls) == [f"cuda:{i}" for i in range(n_gpus)]
                and sum(c.rows for c in calls) == rows
                and all(c.rows < rows for c in calls),
            ),
            Claim("... each in a worker thread of this process (hence the GIL)", all(c.thread != me for c in calls)),
            Claim(
                "... and the outputs gathered back on GPU 0", str(output.device) == "cuda:0" and output.shape[0] == rows
            ),
        ]
    else:  # DataParallel without 2 GPUs returns self.module(...): one call holds by construction
        claims.append(
            Claim(
                f"DP called the model once, on all {rows} rows, in this cell's own thread",
                len(calls) == 1 and calls[0].rows == rows and calls[0].thread == me,
                unchecked=f"with {n_gpus} GPU(s) DP has nothing to split over and calls the model as it is; the split "
                "over GPUs needs 2 or more",
            )
        )
    return claims


# Section 4: buckets during backward
def predicted_buckets(report: dict, cap_mb: float) -> int:
    """DDP's bucketing rule applied to the gradients in the order rank 0 computed them: fill a bucket until it
    holds at least cap_mb MiB, then close it; what is left at the end is one more bucket. (An explicit bucket_cap_mb, as
    here, caps every bucket; left at its default DDP caps the first bucket at 1 MiB.)"""
    r = report["ranks"][0]
    count, size = 0, 0
    for _, i in r["steps"][-1]["grad_ready"]:
        size += r["param_numel"][i] * r["bytes_per_number"]
        if size >= cap_mb * 2**20:
            count, size = count + 1, 0
    return count + (size > 0)


def bucket_table(report: dict) -> str:
    r0 = report["ranks"][0]
    first, step = r0["steps"]
    lines = [
        f"rank 0, step 1: backward took {1000 * step['backward_s']:.1f} ms; {len(r0['param_numel'])} parameter "
        f"tensors, {sum(r0['param_numel']):,} numbers",
        f"{'bucket':>6} {'numbers':>9} {'launched at':>12} {'completed at':>13} {'gradients still to compute':>28}",
    ]
    for b in step["buckets"]:
        lines.append(
            f"{b['index']:>6} {b['numel']:>9,} {1000 * b['launched']:>9.2f} ms {1000 * b['done']:>10.2f} ms "
            f"{b['not_ready']:>28}"
        )
    lines.append(
        f"(step 0 used {len(first['buckets'])} bucket(s); after the first step DDP rebuilds its buckets in the order "
        "the gradients arrived)"
    )
    return "\n".join(lines)


def bucket_claims(report: dict) -> list[Claim]:
    """What DDP did with the gradients of one backward: how many buckets, in which order, and the averages."""
    r0 = report["ranks"][0]
    buckets = r0["steps"][-1]["buckets"]
    layer = r0["param_numel"][0] + r0["param_numel"][1]  # one Linear's weights and bias
    cap = r0["bucket_cap_mb"]
    return [
        Claim(
            f"one backward = {len(buckets)} bucket all-reduces, not one per tensor nor one at the end",
            2 <= len(buckets) < len(r0["param_numel"]),
        ),
        Claim(
            f"the rule above predicts DDP's {len(buckets)} buckets at bucket_cap_mb={cap}: one layer's weights and "
            "bias each",
            predicted_buckets(report, cap) == len(buckets) and all(b["numel"] == layer for b in buckets),
        ),
        Claim(
            f"the first all-reduce started while {buckets[0]['not_ready']} of {len(r0['param_numel'])} gradients were "
            "not computed yet",
            buckets[0]["not_ready"] > 0,
        ),
        Claim(
            "DDP's .grad is the mean over the ranks of each rank's local gradient",
            all(r["ddp_vs_mean_of_local"] < 1e-6 for r in report["ranks"]),
        ),
        Claim(
            "... and differs from the local gradient (the sync did something)",
            all(r["ddp_vs_local"] > 0 for r in report["ranks"]),
        ),
        Claim(
            "after backward every rank holds bit-identical gradients", all(r["same_as_rank0"] for r in report["ranks"])
        ),
    ]


def bigger_bucket_claims(small: dict, big: dict) -> list[Claim]:
    """Exercise 3: the same backward with a larger bucket_cap_mb. The rule predicts the new count, and the first
    all-reduce can start only later in backward (fewer gradients left to compute behind which to hide it)."""
    cap = big["ranks"][0]["bucket_cap_mb"]
    want = predicted_buckets(big, cap)
    got = [len(r["steps"][-1]["buckets"]) for r in big["ranks"]]
    before = small["ranks"][0]["steps"][-1]["buckets"][0]["not_ready"]
    late = [r["steps"][-1]["buckets"][0]["not_ready"] for r in big["ranks"]]
    return [
        Claim(
            f"the rule reproduces section 4's buckets at bucket_cap_mb={small['ranks'][0]['bucket_cap_mb']}",
            predicted_buckets(small, small["ranks"][0]["bucket_cap_mb"])
            == len(small["ranks"][0]["steps"][-1]["buckets"]),
        ),
        Claim(
            f"bucket_cap_mb={cap}: {want} bucket all-reduces per backward on every rank, as the rule predicts",
            all(n == want for n in got),
        ),
        Claim(
            f"... and the first one started later in backward ({late[0]} gradients still to compute instead of "
            f"{before}): less computation left to hide the communication behind",
            all(n < before for n in late),
        ),
    ]


@dataclass
class Overlap:
    """One rank's backward, from its own clock: when its last gradient was computed, when backward() returned, and
    which all-reduces were still in flight at the last gradient."""

    rank: int
    last_grad_s: float
    backward_s: float
    first_launch_s: float
    in_flight: int  # all-reduces launched before the last gradient was computed and not completed by then
    not_launched: int  # all-reduces launched only after it (the last bucket waits for the last gradient)
    buckets: int
    out_of_order: bool  # a bucket completed before one launched earlier

    @property
    def exposed_ms(self) -> float:
        """Communication (and DDP's copy of the averages into .grad) that no computation hid."""
        return 1000 * (self.backward_s - self.last_grad_s)


def overlaps(report: dict) -> list[Overlap]:
    out = []
    for r in report["ranks"]:
        s = r["steps"][-1]
        last = s["grad_ready"][-1][0]
        done = [b["done"] for b in s["buckets"]]
        launched = [b["launched"] for b in s["buckets"]]
        out.append(
            Overlap(
                rank=r["rank"],
                last_grad_s=last,
                backward_s=s["backward_s"],
                first_launch_s=min(launched),
                in_flight=sum(a <= last < d for a, d in zip(launched, done)),
                not_launched=sum(a > last for a in launched),
                buckets=len(done),
                out_of_order=any(later < earlier for earlier, later in zip(done, done[1:])),
            )
        )
    return out


def overlap_claims(report: dict) -> list[Claim]:
    """The lesson's claim, on every rank's own clock: communication overlapped computation, i.e. DDP launched its
    first all-reduce before backward had computed the last gradient. An implementation that all-reduces only after
    backward (every launch after the last gradient) fails it. (Launched <= completed <= backward's return is not
    claimed: DDP's backward waits on every bucket's future, so that holds whenever DDP works.)"""
    runs = overlaps(report)
    lead = [o.last_grad_s - o.first_launch_s for o in runs]
    ms = " / ".join(f"{1000 * s:.1f}" for s in lead)
    ranks = " / ".join(str(o.rank) for o in runs)
    return [
        Claim(
            f"overlap: the first all-reduce began {ms} ms (rank {ranks}) before the last gradient",
            all(s > 0 for s in lead),
        )
    ]


def exposed_tail_text(report: dict, backend: str) -> str:
    """What rank 0's timeline shows about the overlap, in the run's own numbers (a Markdown paragraph)."""
    o = overlaps(report)[0]
    beside, alone = 1000 * (o.last_grad_s - o.first_launch_s), o.exposed_ms
    share = beside / (beside + alone) if beside + alone > 0 else 0.0
    text = (
        f"**On this run the overlap hid {100 * share:.0f}% of rank 0's communication.** All-reduces ran beside "
        f"backward's computation for {beside:.1f} ms, from the first launch to the last gradient. Then "
        f"{o.in_flight} of the {o.buckets} all-reduces were still in flight"
        + (f" and {o.not_launched} not launched yet" if o.not_launched else "")
        + f", and `backward()` returned {alone:.1f} ms later: communication alone, exposed."
    )
    if share <= 0.5:
        params = sum(report["ranks"][0]["param_numel"])
        text += (
            f" NOTE: a {params / 1e6:.1f}M-parameter model computes its backward in a few ms, which leaves little "
            "computation to hide the all-reduces behind"
            + (", and gloo sends them over TCP between CPU processes" if backend == "gloo" else "")
            + ". Chapter 05 returns to the overlap with the real model's buckets."
        )
    return text


# Section 5: a straggler
def straggler_table(report: dict) -> str:
    return "\n".join(
        f"rank {r['rank']} ({'slow' if r['slow'] else 'fast'}): own work {r['compute_s']:.3f} s, backward incl. "
        f"waiting {r['backward_s']:.3f} s, whole step {r['step_s']:.3f} s"
        for r in report["ranks"]
    )


def straggler_claims(report: dict) -> list[Claim]:
    """Margins are fractions of the delay, so they hold on a slow machine and on a GPU alike: the fast ranks' own
    work is a 64x64 layer on 16 rows (well under half the delay anywhere), their wait is the delay less that work
    (more than 0.7 of it), and the straggler's step holds the whole delay (more than 0.9 of it, sleep's own jitter
    aside) and each fast rank's step nine tenths of the straggler's at least: they end together, at the all-reduce."""
    delay = report["delay"]
    fast = [r for r in report["ranks"] if not r["slow"]]
    slow = [r for r in report["ranks"] if r["slow"]]
    slowest = max((r["step_s"] for r in slow), default=0.0)
    return [
        Claim(
            f"the fast ranks' own work took under {0.5 * delay:.2f} s", all(r["compute_s"] < 0.5 * delay for r in fast)
        ),
        Claim(
            f"... but their backward() lasted about the straggler's {delay} s: they waited at the all-reduce",
            all(r["backward_s"] > 0.7 * delay for r in fast),
        ),
        Claim(
            "the straggler itself did not wait: everyone was already there",
            all(r["backward_s"] < 0.5 * delay for r in slow),
        ),
        Claim(
            "every rank's step took as long as the slowest rank's",
            slowest > 0.9 * delay and all(r["step_s"] > 0.9 * slowest for r in fast),
        ),
    ]


def slower_straggler_claims(before: dict, after: dict) -> tuple[float, list[Claim]]:
    """Exercise 4: the same straggler with a longer delay. The fast ranks' step grows by the extra delay, give or
    take a quarter of it and twice the ranks' own work (which grows when the machine is busy). Returns (the fast
    ranks' measured step, the claims)."""
    fast_before = [r for r in before["ranks"] if not r["slow"]]
    fast_after = [r["step_s"] for r in after["ranks"] if not r["slow"]]
    extra = after["delay"] - before["delay"]
    expected = min(r["step_s"] for r in fast_before) + extra
    work = 2 * max(r["compute_s"] for r in [*fast_before, *after["ranks"]] if not r["slow"])
    return min(fast_after), [
        Claim(
            f"the fast ranks' step grew by the straggler's extra {extra:.1f} s ({expected:.2f} s expected, within a "
            f"quarter of the extra and {work:.3f} s of own work): the job runs at the slowest rank's pace",
            all(abs(a - expected) < 0.25 * extra + work for a in fast_after),
        )
    ]


# Section 6: the checkpoint
def checkpoint_claims(output: str, ck: dict, nproc: int) -> list[Claim]:
    """Section 6 on the launch's record. Every rank measured how far its weights were from rank 0's three times: before
    DDP wrapped its seed-made model (> 0), right after the wrap (0), and after loading the file, before wrapping it
    again (0: the file gave every rank the same weights; after a wrap DDP's broadcast would make that hold anyway).
    Where every rank runs on the CPU the file was saved from, map_location changes nothing: a NOTE, not a check.
    Who wrote the file is what the file says (the writer's ctx.rank and PID, saved in it), against each rank's PID
    and the "[rank r] saved" lines the ranks printed: a script where every rank saved, or the wrong one, fails."""
    saves = [line for line in output.splitlines() if "] saved " in line]
    ranks = ck["ranks"]
    writer = ck.get("writer") or {}
    pid_of = {r["rank"]: r.get("pid") for r in ranks}
    before = max(r["before_wrap"] for r in ranks)
    on_cpu = all(r["device"] == "cpu" for r in ranks)
    ddp_keys = ck.get("ddp_keys") or []
    return [
        Claim(
            f"exactly one rank wrote the checkpoint, rank 0: the file names its writer, rank {writer.get('rank')} "
            f"(PID {writer.get('pid')}, rank 0's process), and one rank printed that it saved",
            len(saves) == 1
            and saves[0].startswith(f"[rank {writer.get('rank')}] ")
            and writer.get("rank") == 0
            and writer.get("pid") is not None
            and pid_of.get(0) == writer.get("pid"),
        ),
        Claim(
            f"the checkpoint holds the unwrapped model: DDP's own state_dict has its {len(ddp_keys)} keys under "
            "'module.', the file has the same keys without it",
            bool(ddp_keys)
            and all(k.startswith(DDP_PREFIX) for k in ddp_keys)
            and [k.removeprefix(DDP_PREFIX) for k in ddp_keys] == ck["keys"],
        ),
        Claim(
            f"all {nproc} ranks loaded it (after the barrier) and got exactly the trained weights, the same on every "
            f"rank before any wrap (largest difference from rank 0's: {max(r['loaded_apart'] for r in ranks):.2g})",
            all(r["identical"] for r in ranks) and all(r["loaded_apart"] == 0.0 for r in ranks),
        ),
        Claim(
            f"every rank's resumed optimizer holds the trained one's state: {ranks[0].get('opt_restored_steps')} "
            f"steps (trained: {ranks[0].get('opt_trained_steps')}), every moment (exp_avg, exp_avg_sq) equal",
            all(
                r.get("opt_same") is True and r.get("opt_restored_steps") == r.get("opt_trained_steps", 0) > 0
                for r in ranks
            ),
        ),
        Claim(
            "map_location put the tensors on each rank's own device",
            all(r["loaded_on"] == r["device"] for r in ranks),
            unchecked="every rank here runs on the CPU the file was saved from, so the tensors land there with or "
            "without map_location; on GPUs rank 1 would otherwise load onto cuda:0"
            if on_cpu
            else None,
        ),
        Claim(
            f"each rank built its model with its own seed ({before:.2g} apart from rank 0's before the wrap), yet "
            "right after DDP(model) all were equal: the wrap broadcast rank 0's weights",
            before > 0.0 and all(r["at_wrap"] == 0.0 for r in ranks),
        ),
    ]


def interview_evidence(hello, calls, bwd, strag, ck, output_ck, epochs, n_gpus: int) -> str:
    """One line of this run's evidence per interview question. DP's line shows its split only with 2+ GPUs (section
    3 checks it there); with fewer, DP calls the model once by construction, which is no evidence, so it says so."""
    buckets = bwd["ranks"][0]["steps"][-1]["buckets"]
    sync = max(r["ddp_vs_mean_of_local"] for r in bwd["ranks"])
    fast_wait = min(r["backward_s"] for r in strag["ranks"] if not r["slow"])
    saves = sum("] saved " in line for line in output_ck.splitlines())
    rows = [
        (
            "1. DP vs DDP",
            f"DDP: {len({r['pid'] for r in hello['ranks']})} processes with distinct PIDs; DP: "
            + (
                f"{len(calls)} forwards for one call of the wrapper, one per GPU (section 3's check)"
                if n_gpus >= 2
                else f"not shown on this run (its split needs 2 GPUs, this machine has {n_gpus}: section 3's NOTE)"
            ),
        ),
        (
            "2. gradient sync",
            f"{len(buckets)} bucket all-reduces launched during backward; DDP's grad = mean of the "
            f"local grads (max diff {sync:.1e})",
        ),
        (
            "3. DistributedSampler",
            f"10 samples -> {len(epochs[0][0])} + {len(epochs[0][1])}, "
            f"{'disjoint' if set(epochs[0][0]).isdisjoint(epochs[0][1]) else 'OVERLAPPING'}; epoch 1 in "
            f"another order: {epochs[0] != epochs[1]}",
        ),
        (
            "4. a slower GPU",
            f"the slow rank sleeps {strag['delay']} s per step -> the fast ranks wait "
            f"{fast_wait:.2f} s inside backward()",
        ),
        (
            "5. checkpoints",
            f"{saves} writer (rank {(ck.get('writer') or {}).get('rank')}), "
            f"{sum(k.startswith('module.') for k in ck['keys'])} 'module.' "
            f"keys, {sum(r['identical'] for r in ck['ranks'])}/{len(ck['ranks'])} ranks reloaded exactly",
        ),
    ]
    return "\n".join(f"{q:<22} {e}" for q, e in rows)
