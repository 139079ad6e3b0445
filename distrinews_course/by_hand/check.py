"""Chapter 03's checker: what a rung of scripts/by_hand/ (the reference, or a learner's version of it) does in the
cases where a wrong answer shows, each compared with torch's DistributedDataParallel on the same 2 gloo ranks.

The rank side runs inside scripts/by_hand/race.py (--probes). Each case ("probe") runs in a process group of its
own (a sandbox, made the default group for the case), so that collectives the ranks did not join alike (a rank
that stopped, a second backward) stay there and the next case starts clean. The notebook side
(check_exercise) launches the race on the learner's file and prints one line: the first mistake found, named.

| mistake                                   | case that shows it                                                 |
|-------------------------------------------|--------------------------------------------------------------------|
| missing divide                            | the gradient the optimizer sees is N x DDP's (step 1, tiny model)  |
| no overlap: waiting at launch             | a link slowed to `delay` per collective: waits inside backward     |
| launch in readiness order                 | two heads, each rank completes their gradients in its own order    |
| a second backward before the step         | two backward passes per step: DDP's accumulated result, or a clear |
|                                           | error on every rank                                                |
| dtype not preserved                       | float64 and bfloat16 models: a collective or the update in another |
| an unused parameter                       | a head unused on rank 1 (and on every rank): a clear error on      |
|                                           | every rank, or DDP's find_unused_parameters result                 |
| the bucket rule not the one stated        | the buckets against torch's DDP's own assignment of the same sizes |
| ZeRO-3: weights not freed / not gathered  | checked by the rung where it uses and frees a block                |
| two levels: the wrong group               | the all-reduce's ranks against this rank's cross-node group        |
| two levels: all-gather before all-reduce  | the order of the collectives the rung called in a step             |
| HSDP: blocks sharded on the wrong group   | the ranks of every gather and reduce-scatter, against the node's   |
| HSDP: the replicate on the wrong group,   | the ranks of each all-reduce, against this rank's cross-node       |
|   or none                                 | group; a step without one                                          |
| mixed precision: a gather left in fp32    | param_dtype float16: the dtype of the shard each all-gather sent   |
| mixed precision: gradients reduced in the | param_dtype float16: the dtype of each reduce-scatter, against     |
|   compute dtype                           | reduce_dtype float32                                               |
| the optimizer steps the low-precision     | what the optimizer holds, against the rung's master shards         |
|   copy                                    |                                                                    |

The two-level exercise (chapter 08's cross-node half of hierarchical.py) runs on 4 ranks, 2 nodes x 2.
"""

from __future__ import annotations

import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from distrinews_lib.errors import UserError

from . import models
from .rung import agreement_group
from .watch import Collectives, sandbox


def outcome(err: BaseException | None, files=()) -> dict | None:
    """What a rank's run ended with: None (it finished), or the exception in one line, and whether it is a clear
    error: a UserError, or an exception raised by a `raise` statement of the rung's own code (files)."""
    if err is None:
        return None
    frames = traceback.extract_tb(err.__traceback__)
    last = frames[-1] if frames else None
    where = f" ({Path(last.filename).name}:{last.lineno}: {last.line.strip()})" if last and last.line else ""
    own = bool(last) and last.filename in files and (last.line or "").strip().startswith("raise")
    text = " ".join(str(err).split())
    collective = any(s in text.lower() for s in ("gloo", "connection", "timed out", "timeout", "peer"))
    return {
        "type": type(err).__name__,
        "message": text[:300],
        "where": where,
        "clear": (isinstance(err, UserError) or own) and not collective and not isinstance(err, NotImplementedError),
        "not_written": isinstance(err, NotImplementedError),
    }


def everyone(obj, group) -> list:
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=group)
    return out


# ------------------------------------------------------------------------------------------------- the mistakes

MISTAKES = {
    "missing_divide": "missing divide: the gradients your optimizer stepped with are {ratio:.2f}x torch DDP's "
    "average: they are summed over the {world} ranks, not averaged (divide by the world size)",
    "divided_twice": "divided twice: the gradients your optimizer stepped with are {ratio:.2f}x torch DDP's average "
    "(divide by the world size once)",
    "no_overlap": "no overlap: with a link that takes {delay_ms:.0f} ms per collective, your code waited for "
    "{waits} of them inside backward (backward took {slow_ms:.0f} ms instead of {fast_ms:.0f} ms): "
    "launch with async_op=True and wait only before the optimizer step",
    "readiness_order": "launched in readiness order, not a fixed one: on a model whose gradients become ready in a "
    "different order on each rank, your ranks paired different tensors ({detail}); launch in "
    "the same fixed order on every rank, as torch's DDP does",
    "second_backward": "a second backward before the step: {detail}; accumulate both backward passes as torch's DDP "
    "does, or stop every rank with a clear error",
    "dtype": "dtype not preserved: {detail}; make every buffer (and the shard) with the parameters' dtype",
    "unused_parameter": "an unused parameter ({case}): {detail}; every rank must stop with the same clear message "
    "(by_hand.stop_unless_every_rank_has), or handle it as find_unused_parameters does",
    "bucket_rule": "the bucket rule is not the one stated: {detail} (walk the parameters in reverse and close a "
    "bucket once it holds at least the cap, as torch's DDP does)",
    "wrong_group": "the wrong group: your all-reduce of the shard ran among ranks {got} ({what}); the ranks that hold "
    "the same shard are those with the same local rank, one per node (ranks {want} for rank {rank}: dp.nodes.cross)",
    "shard_group": "the wrong shard group: your blocks were gathered and reduce-scattered among ranks {got} ({what}); "
    "HSDP shards each block inside the node, ranks {want} for rank {rank} (dp.nodes.intra), so that only the "
    "replicate all-reduce crosses the slow link",
    "no_replicate": "no replicate: each node's gradient shards were summed over its own ranks only, never across the "
    "nodes (no all-reduce in a step); all-reduce each block's shard gradient over dp.nodes.cross after the node's "
    "reduce-scatters",
    "gather_first": "all-gather before all-reduce: your all-gather inside the node ran before the all-reduce across "
    "the nodes, so each node gathered shards summed over its own ranks only; sum the shard across the nodes first, "
    "then gather",
    "gather_low": "a gather left in {sent}: with param_dtype {want}, your all-gather sent the {sent} master shard "
    "({detail}); cast it to dp.param_dtype before it leaves: half the bytes on the wire, and the dtype the gathered "
    "weights compute in",
    "reduce_low": "gradients reduced in {got}: with param_dtype {got}, your reduce-scatter summed the gradients in "
    "{got}, where dp.reduce_dtype is {want}; copy them into a buffer of dp.reduce_dtype first ({got}'s sums lose the "
    "low bits of each rank's gradient, and float16 overflows past 65504)",
    "steps_compute_copy": "the optimizer steps the compute copy, not the master: it holds {detail}, the weights "
    "forward computes with (in param_dtype, a cast of the shard remade at every gather and freed after use, so no "
    "update of theirs reaches the next forward); step every block's master shard",
    "differs": "{detail}",
    "crashed": "your code raised {detail}",
    "stopped": "your code stopped: {detail}",
    "not_written": "still to write: {detail} raises NotImplementedError",
}


def mistake(key: str, **facts) -> dict:
    return {"ok": False, "mistake": key, "message": MISTAKES[key].format(**facts)}


def two_level_mistake(calls, rank: int, per_node: int, world: int) -> dict | None:
    """The mistakes of a hierarchical all-reduce's cross-node half, read from the collectives it called (each with
    its group's ranks, as Collectives records them): its all-reduce on a group other than the ranks with this rank's
    local rank, one per node; or an all-gather between a step's reduce-scatter and its all-reduce. None if neither."""
    node, local = divmod(rank, per_node)
    intra, cross = tuple(range(node * per_node, (node + 1) * per_node)), tuple(range(local, world, per_node))
    summed = True  # no reduce-scatter yet this step: nothing waits to be summed across the nodes
    for c in calls:
        ranks = tuple(c.get("group") or range(world))
        if c["kind"] == "reduce_scatter":
            summed = False
        elif c["kind"] == "all_gather" and not summed:
            return mistake("gather_first")
        elif c["kind"] == "all_reduce":
            if ranks != cross:
                what = (
                    "every rank: the default group"
                    if len(ranks) == world
                    else ("this rank's node: dp.nodes.intra" if ranks == intra else "another group")
                )
                return mistake(
                    "wrong_group", got=", ".join(map(str, ranks)), what=what, rank=rank, want=", ".join(map(str, cross))
                )
            summed = True
    return None


def mesh_mistake(weights, reference, names, kind: str, tolerance: float) -> tuple:
    """(the largest difference, the mistake or None) of HSDP by hand's per-step weights against torch's FSDP2 on a 2-D
    mesh (replicate across the nodes, shard inside them), off by more than `tolerance`."""
    first, worst = compare(weights, reference, names)
    if worst <= tolerance:
        return worst, None
    detail = f"{kind} model: step {first['step']}, parameter {first['param']} is {first['diff']:.3g} off torch's FSDP2 "
    return worst, mistake("differs", detail=detail + "on a 2-D mesh (replicate across the nodes, shard inside them)")


def master_mistake(dp, optimizer) -> dict | None:
    """A sharded rung whose optimizer does not step its master shards (ZeRO-3, HSDP: dp.blocks[i].shard): the mistake,
    read from what the optimizer holds; None if it holds exactly the shards, or the rung has no blocks."""
    blocks = getattr(dp, "blocks", None)
    if not blocks:
        return None
    want = {id(b.shard) for b in blocks}
    got = [p for group in optimizer.param_groups for p in group["params"]]
    if {id(p) for p in got} == want and len(got) == len(want):
        return None
    dtypes = sorted({str(p.dtype).replace("torch.", "") for p in got})
    return mistake("steps_compute_copy", detail=f"{len(got)} tensors in {', '.join(dtypes) or 'no dtype'}")


def hsdp_mistake(calls, rank: int, per_node: int, world: int) -> dict | None:
    """The mistakes of HSDP's two functions (chapter 08's exercise), read from the collectives a step called (each with
    its group's ranks): a gather or reduce-scatter on a group other than this rank's node; an all-reduce on a group
    other than the ranks with this rank's local rank; no all-reduce at all. None if none."""
    node, local = divmod(rank, per_node)
    intra, cross = tuple(range(node * per_node, (node + 1) * per_node)), tuple(range(local, world, per_node))

    def said(ranks):
        if len(ranks) == world:
            return "every rank: the default group"
        return {intra: "this rank's node: dp.nodes.intra", cross: "the ranks across the nodes: dp.nodes.cross"}.get(
            ranks, "another group"
        )

    for c in calls:
        ranks = tuple(c.get("group") or range(world))
        if c["kind"] in ("all_gather", "reduce_scatter") and ranks != intra:
            got, want = ", ".join(map(str, ranks)), ", ".join(map(str, intra))
            return mistake("shard_group", got=got, what=said(ranks), want=want, rank=rank)
        if c["kind"] == "all_reduce" and ranks != cross:
            got, want = ", ".join(map(str, ranks)), ", ".join(map(str, cross))
            return mistake("wrong_group", got=got, what=said(ranks), rank=rank, want=want)
    if any(c["kind"] == "reduce_scatter" for c in calls) and not any(c["kind"] == "all_reduce" for c in calls):
        return mistake("no_replicate")
    return None


PASS = {"ok": True, "mistake": None, "message": ""}


# -------------------------------------------------------------------------------------------------- the cases

_AGREE = None  # the checker's own group (Cases makes it): the ranks compare their cases' ends there


def control():
    """Where the ranks agree on how a case ended: the checker's own group, which a learner's code never touches
    (a wrong rung may leave its own agreement group unmatched), else the rungs' agreement group."""
    return _AGREE or agreement_group()


def across(x: float, op=None) -> float:
    """x reduced over the ranks (MAX by default) on the control group."""
    t = torch.tensor([float(x)], dtype=torch.float64)
    dist.all_reduce(t, op=op or dist.ReduceOp.MAX, group=control())
    return float(t)


def compare(weights, reference, names) -> tuple:
    """(first difference {step, param, diff} or None, largest difference) between two runs' per-step weights,
    over every rank (the control group)."""
    first, worst = None, 0.0
    for step, (mine, ref) in enumerate(zip(weights, reference), 1):
        for name, a, b in zip(names, mine, ref):
            d = float((a.double() - b.double()).abs().max()) if a.shape == b.shape else float("inf")
            worst = max(worst, d)
            if d > 0 and first is None:
                first = {"step": step, "param": name, "diff": d}
    firsts = everyone(first, control())
    return next((f for f in firsts if f), None), across(worst)


class Cases:
    """Runs a contender on a case inside a sandbox and says how each rank ended. make(name, kind, **kw) builds a
    runner (race.py's Runner); files: the contenders' source files, whose own `raise` is a clear error."""

    def __init__(self, make, batch_size: int, timeout_s: float, seed: int, files=()):
        global _AGREE
        self.make, self.batch_size, self.timeout_s, self.seed, self.files = make, batch_size, timeout_s, seed, files
        self.refs = {}
        # A rank may wait out a sandbox's default group, then its control group, before it gets here
        _AGREE = _AGREE or dist.new_group(backend="gloo", timeout=timedelta(seconds=3 * timeout_s + 10))

    def batches(self, kind, steps):
        return models.batches(kind, dist.get_rank(), dist.get_world_size(), steps, self.batch_size)

    def run(self, name, kind, batches, micro=1, log=None, **kw) -> dict:
        """Contender `name` built on model `kind` and trained on `batches` (micro backward passes per step) in a
        sandbox, its collectives watched (a freed tensor handed to one is an error, not a crash): how each rank
        ended, its weights after each step, the runner."""
        log = log or Collectives()
        with sandbox(self.timeout_s) as box, log if not log.active else _Nothing():
            err, weights, runner = None, [], None
            try:
                runner = self.make(name, kind, **kw)
                runner.timeline.start()  # its gradients' ready ticks: how often each hook fired
                torch.manual_seed(self.seed + dist.get_rank())  # dropout: the same masks for every contender
                for b in batches:
                    runner.step(b, micro=micro, log=log)
                    with log.pause():  # the checker's gathers: not the training's collectives
                        weights.append(runner.weights())
            except Exception as e:  # noqa: BLE001  (a learner's code may raise anything: it is the verdict)
                err = e
            outcomes = everyone(outcome(err, self.files), control())
            box["clean"] = not any(outcomes)
        return {"outcomes": outcomes, "weights": weights, "runner": runner, "calls": log.calls}

    def reference(self, key, kind, batches, micro=1, **kw) -> dict:
        """torch's DDP on the same case (once per case, shared by every contender)."""
        if key not in self.refs:
            self.refs[key] = self.run("ddp", kind, batches, micro, **kw)
            if any(self.refs[key]["outcomes"]):
                raise RuntimeError(f"torch's DDP failed on case {key}: {self.refs[key]['outcomes']}")
        return self.refs[key]


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def short(text: str, n: int) -> str:
    """text cut to about n characters at a word's end."""
    return text if len(text) <= n else text[:n].rsplit(" ", 1)[0] + " ..."


def ended(outcomes) -> str:
    """How the ranks ended, in a few words per rank."""
    return "; ".join(
        f"rank {r}: " + ("finished" if o is None else f"{o['type']}: {short(o['message'], 90)}{o['where']}")
        for r, o in enumerate(outcomes)
    )


def crashed(outcomes) -> dict:
    """The first rank's end, in one line: a clear error (the rung's own message says what is wrong) as it is; any
    other exception with the line that raised it."""
    o = next(o for o in outcomes if o)
    if o["not_written"]:
        return mistake("not_written", detail=o["where"].strip(" ()") or "a function")
    if o["clear"]:
        return mistake("stopped", detail=short(o["message"], 240))
    return mistake("crashed", detail=f"{o['type']}: {short(o['message'], 200)}{o['where']}")


def names_of(runner) -> list:
    return [n for n, _ in runner.model.named_parameters()]
