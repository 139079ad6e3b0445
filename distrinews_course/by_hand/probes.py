"""The checker's cases ("probes"): each runs a contender and torch's DDP on a case where a wrong answer shows (check.py
says how), and returns PASS with a summary, or the mistake it shows, in one line."""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import TWO_LEVEL
from .check import PASS, Cases, across, compare, control, crashed, ended, everyone, mistake, names_of, outcome, short
from .watch import Collectives, sandbox


def probes_for(rung: str) -> list:
    """The cases each rung is checked on (a rung that cannot make a mistake is not checked for it)."""
    if rung in TWO_LEVEL:  # the exercise is the cross-node half only: its mistakes show in the check (check.py)
        return []
    names = ["accumulate", "dtype", "order", "unused_rank1", "unused_all"]
    if rung in ("overlapped", "bucketed", "zero2"):
        names.insert(0, "overlap")
    if rung in ("bucketed", "zero2"):
        names.insert(0, "bucket_rule")
    if rung == "zero3":
        names.append("mixed")
    return names


def probe(case: str, name: str, rung: str, cases: Cases) -> dict:
    """One case for contender `name` (a version of rung `rung`): PASS (with a summary) or the mistake it shows."""
    if case == "bucket_rule":
        return probe_bucket_rule(name, cases)
    if case == "overlap":
        return probe_overlap(name, cases)
    if case == "mixed":
        return probe_mixed(name, cases)
    if case == "accumulate":
        b = cases.batches("tiny", 2)
        ref = cases.reference("accumulate", "tiny", b, micro=2)
        got = cases.run(name, "tiny", b, micro=2)
        if all(o and o["clear"] for o in got["outcomes"]):
            return {
                **PASS,
                "summary": f"two backward passes per step: refused on every rank "
                f"({short(got['outcomes'][0]['message'], 80)})",
            }
        if any(got["outcomes"]):
            return mistake("second_backward", detail=f"not a clear error on every rank ({ended(got['outcomes'])})")
        first, worst = compare(got["weights"], ref["weights"], names_of(ref["runner"]))
        if worst > 1e-6:
            return mistake(
                "second_backward",
                detail=f"the weights end {worst:.3g} off torch DDP's, which accumulates both passes, silently",
            )
        return {
            **PASS,
            "summary": f"two backward passes per step: accumulated as torch's DDP does (max difference {worst:.3g})",
        }
    if case == "dtype":
        notes = []
        for dtype, tol in ((torch.float64, 0.0), (torch.bfloat16, 0.0)):
            b = cases.batches("tiny", 2)
            ref = cases.reference(f"dtype {dtype}", "tiny", b, dtype=dtype)
            with Collectives() as log:
                got = cases.run(name, "tiny", b, log=log, dtype=dtype)
            if any(got["outcomes"]):
                return crashed(got["outcomes"])
            kind = str(dtype).replace("torch.", "")
            other = [c for c in log.calls if c["dtype"] != str(dtype)]
            if other:
                return mistake(
                    "dtype",
                    detail=f"{kind} parameters, but a {other[0]['kind']} ran in "
                    f"{other[0]['dtype'].replace('torch.', '')}",
                )
            opt = [p.dtype for g in got["runner"].opt.param_groups for p in g["params"]]
            if any(d != dtype for d in opt):
                return mistake(
                    "dtype",
                    detail=f"{kind} parameters, but the optimizer updates "
                    f"{str(next(d for d in opt if d != dtype)).replace('torch.', '')} ones",
                )
            first, worst = compare(got["weights"], ref["weights"], names_of(ref["runner"]))
            if worst > tol:
                return mistake("dtype", detail=f"{kind} parameters end {worst:.3g} off torch DDP's in {kind}")
            notes.append(f"{kind} {worst:.3g}")
        return {**PASS, "summary": "float64 and bfloat16 models: max difference " + ", ".join(notes)}
    if case == "order":
        b = cases.batches("twoheads", 2)
        ref = cases.reference("order", "twoheads", b)
        got = cases.run(name, "twoheads", b)
        if any(got["outcomes"]):
            return crashed(got["outcomes"])
        _, worst = compare(got["weights"], ref["weights"], names_of(ref["runner"]))
        if worst > 1e-6:
            mine = torch.cat([w.reshape(-1).double() for w in got["weights"][-1]])
            zero = mine.clone()
            dist.broadcast(zero, src=0, group=control())
            apart = across(float((mine - zero).abs().max()))
            return mistake(
                "readiness_order",
                detail=f"weights {worst:.3g} off torch DDP's after {len(b)} steps, and the ranks {apart:.3g} apart",
            )
        return {**PASS, "summary": f"gradients ready in a different order on each rank: max difference {worst:.3g}"}
    if case in ("unused_rank1", "unused_all"):
        unused = case.split("_")[1]
        b = cases.batches("twoheads", 2)
        ref = cases.reference(case, "twoheads", b, unused=unused, find_unused=True)
        got = cases.run(name, "twoheads", b, unused=unused)
        where = "a head unused on rank 1" if unused == "rank1" else "a head unused on every rank"
        if all(o and o["clear"] for o in got["outcomes"]):
            return {
                **PASS,
                "summary": f"{where}: a clear error on every rank ({short(got['outcomes'][0]['message'], 70)})",
            }
        if any(got["outcomes"]):
            return mistake("unused_parameter", case=where, detail=ended(got["outcomes"]))
        first, worst = compare(got["weights"], ref["weights"], names_of(ref["runner"]))
        if worst > 1e-6:
            return mistake(
                "unused_parameter",
                case=where,
                detail=f"no error, and the weights end {worst:.3g} off torch DDP's with find_unused_parameters=True",
            )
        return {**PASS, "summary": f"{where}: as torch DDP with find_unused_parameters (max difference {worst:.3g})"}
    raise ValueError(f"unknown case {case!r}")


def probe_bucket_rule(name: str, cases: Cases) -> dict:
    """The contender's buckets against torch's DDP's own assignment (dist._compute_bucket_assignment_by_size) of
    the same parameters, in reverse order, on the tiny and the wide model at two caps."""
    checked = []
    for kind in ("tiny", "wide"):
        for cap_mb in (1.0, 0.25):
            got = cases.run(name, kind, [], bucket_mb=cap_mb)
            if any(got["outcomes"]):
                return crashed(got["outcomes"])
            dp = got["runner"].dp
            buckets = getattr(dp, "buckets", None)
            if not isinstance(buckets, (list, tuple)) or not all(isinstance(b, (list, tuple)) for b in buckets):
                return mistake(
                    "bucket_rule",
                    detail="no buckets to compare: keep them in self.buckets, a list of "
                    "lists of parameters, as the skeleton says",
                )
            order = list(reversed(dp.params))
            indices, _ = dist._compute_bucket_assignment_by_size(order, [int(cap_mb * 2**20)], [False] * len(order))
            want = [[id(order[i]) for i in b] for b in indices]
            if [[id(p) for p in b] for b in buckets] != want:

                def mib(groups):
                    return ", ".join(f"{sum(p.numel() * p.element_size() for p in g) / 2**20:.2f}" for g in groups)

                return mistake(
                    "bucket_rule",
                    detail=f"{kind} model at {cap_mb:g} MiB: your {len(buckets)} buckets "
                    f"hold {mib(buckets)} MiB; the rule's {len(want)} hold "
                    f"{mib([[order[i] for i in b] for b in indices])} MiB",
                )
            checked.append(f"{kind} {cap_mb:g} MiB: {len(want)}")
    return {**PASS, "summary": "the buckets of torch's DDP's rule (" + "; ".join(checked) + ")"}


DELAY_S = 0.1  # the slow link of the overlap case: every collective takes at least this long


def probe_overlap(name: str, cases: Cases) -> dict:
    """The wide model, one step on the machine's own link, then two with every collective slowed to DELAY_S: a hook
    that waits where it launches makes backward wait for every collective; one that does not, for none."""
    b = cases.batches("wide", 3)
    fast_log, slow_log = Collectives(), Collectives(delay_s=DELAY_S)
    with sandbox(cases.timeout_s * 3) as box:
        err = runner = None
        try:
            runner = cases.make(name, "wide")
            runner.timeline.start()
            with fast_log:
                runner.step(b[0], log=fast_log)
            fast = [e["end"] - e["start"] for e in runner.timeline.events if e["kind"] == "backward"]
            runner.timeline.start()
            with slow_log:
                for batch in b[1:]:
                    runner.step(batch, log=slow_log)
            slow = [e["end"] - e["start"] for e in runner.timeline.events if e["kind"] == "backward"]
        except Exception as e:  # noqa: BLE001
            err = e
        outcomes = everyone(outcome(err, cases.files), control())
        box["clean"] = not any(outcomes)
    if any(outcomes):
        return crashed(outcomes)
    launched = sum(c["in_backward"] for c in slow_log.calls) / 2  # per step
    waits = len(slow_log.waits_in_backward) / 2
    slow_ms, fast_ms = 1000 * max(slow), 1000 * max(fast)
    stretched = launched >= 3 and slow_ms - fast_ms >= 800 * DELAY_S * (launched - 1) and slow_ms >= 2 * fast_ms
    if across(waits) > 0 or across(float(stretched)) > 0:
        return mistake(
            "no_overlap", delay_ms=1000 * DELAY_S, waits=f"{max(waits, 1):.0f}", slow_ms=slow_ms, fast_ms=fast_ms
        )
    return {
        **PASS,
        "summary": f"a {1000 * DELAY_S:.0f} ms link: {launched:.0f} collectives launched inside backward, "
        f"none waited for there (backward {slow_ms:.0f} ms, {fast_ms:.0f} ms without the "
        "delay)",
    }


MIXED_STEPS = 2  # steps of the mixed-precision case: the second shows a wrong update of the first


def probe_mixed(name: str, cases: Cases) -> dict:
    """param_dtype float16, reduce_dtype float32 (the rung's default): the contender's all-gathers must send float16
    shards, its reduce-scatters sum in float32, and its fp32 weights end equal to torch's FSDP2's with the same
    MixedPrecisionPolicy (the same arithmetic: bit-identical)."""
    b = cases.batches("tiny", MIXED_STEPS)
    if "mixed" not in cases.refs:  # torch's FSDP2, once, outside a sandbox (its device mesh is made once, here)
        torch.manual_seed(cases.seed + dist.get_rank())
        ref = cases.make("fsdp2", "tiny", param_dtype=torch.float16, dropout=False)
        weights = []
        for batch in b:
            ref.step(batch)
            weights.append(ref.weights())
        cases.refs["mixed"] = {"weights": weights, "names": names_of(ref)}
    ref = cases.refs["mixed"]
    with Collectives() as log:
        got = cases.run(name, "tiny", b, log=log, param_dtype=torch.float16, dropout=False)
    sent = [c for c in log.calls if c["kind"] == "all_gather" and c["dtypes"] != ["torch.float16"]]
    if sent:
        other = next(d for d in sent[0]["dtypes"] if d != "torch.float16").replace("torch.", "")
        return mistake("gather_low", sent=other, want="float16", detail=f"{len(sent)} of its all-gathers")
    summed = [c for c in log.calls if c["kind"] == "reduce_scatter" and c["dtype"] != "torch.float32"]
    if summed:
        return mistake("reduce_low", got=summed[0]["dtype"].replace("torch.", ""), want="float32")
    if any(got["outcomes"]):
        return crashed(got["outcomes"])
    _, worst = compare(got["weights"], ref["weights"], ref["names"])
    if worst > 0:
        return mistake(
            "differs",
            detail=f"param_dtype float16: after {len(b)} steps the weights are {worst:.3g} off torch's FSDP2 with "
            "MixedPrecisionPolicy(param_dtype=float16, reduce_dtype=float32), which does the same arithmetic",
        )
    return {
        **PASS,
        "summary": f"param_dtype float16: gathers in float16, gradients summed in float32, {len(b)} steps equal to "
        f"FSDP2's MixedPrecisionPolicy (max difference {worst:.3g})",
    }
