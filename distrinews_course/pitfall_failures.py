"""Chapter 04's pitfalls that must fail (7, 9, 10, 11): whether each broken run failed by itself, of the error its
pitfall makes (a collective's timeout, NCCL without a GPU, DDP's unfinished reduction), and whether its fix finished.

Each function reads the broken run's launch (a LaunchResult: its output, return code and time) beside the JSON the
fixed run wrote, and returns a pitfall_symptoms.Symptom, as the pitfalls that finish do:

    s = found.add(uneven_inputs(res, r, HANG_TIMEOUT_S, failing.timeout))
    settle(s.claims)
"""

from __future__ import annotations

import json
import re

from .claims import Claim
from .demo import results
from .pitfall_symptoms import Symptom

# A collective that waited out its process group's timeout, as gloo and NCCL word it.
TIMEOUT_WORDS = re.compile(r"(?i)timed out|timeout|timing out")
# The error DDP raises in the forward after a step that left a parameter without a gradient.
REDUCTION_NOT_FINISHED = "Expected to have finished reduction in the prior iteration"
# PyTorch's own warning when find_unused_parameters=True found nothing unused: it names the walk's cost.
EXTRA_TRAVERSAL = "extra traversal of the autograd graph every iteration"


def _failed_by_itself(res, limit_s: float, what: str) -> Claim:
    return Claim(
        f"broken: the run failed by itself{what}, {res.seconds:.0f} s in (the launcher's limit: {limit_s:.0f} s)",
        not res.ok and not res.timed_out,
    )


def waited(res) -> list[float]:
    """How long each rank that reported waited before its collective failed (the scripts' waited_s)."""
    return [float(x["waited_s"]) for x in results(res.output) if "waited_s" in x]


# A rank whose partner's process exited (after its own timeout) while it still waited, as gloo words it.
PEER_GONE = re.compile(r"(?i)closed by peer|reset by peer|broken pipe")


def rank_outcomes(res) -> dict[int, str]:
    """What ended each rank, from its own error line: 'timed out' (its collective's timeout fired), 'lost its peer'
    (a partner's process exited first, so the connection closed), or 'other: <the error>'."""
    out = {}
    for line in res.output.splitlines():
        if m := re.match(r"^\[rank ?(\d+)\]:? (\w+(?:Error|Exception)\b.*)", line.rsplit("\r", 1)[-1]):
            err = m[2]
            out[int(m[1])] = (
                "timed out"
                if TIMEOUT_WORDS.search(err)
                else "lost its peer"
                if PEER_GONE.search(err)
                else f"other: {err[:60]}"
            )
    return out


def _each_rank_saw(res, world: int) -> Claim:
    """Every rank reported; at least one timed out, and each other rank timed out too or lost its peer (the rank that
    timed out had exited). Which rank's timer fires first is a race between processes: the claim names what each saw."""
    seen = rank_outcomes(res)
    words = "; ".join(
        f"rank {k} "
        + (
            "timed out in its collective"
            if v == "timed out"
            else v + (" when a timed-out rank exited" if v == "lost its peer" else "")
        )
        for k, v in sorted(seen.items())
    )
    return Claim(
        f"broken: each rank's error: {words or 'none found'}",
        sorted(seen) == list(range(world))
        and "timed out" in seen.values()
        and all(v in ("timed out", "lost its peer") for v in seen.values()),
    )


def default_timeout_min(backend: str) -> float:
    """torch's default process-group timeout for `backend`, in minutes: nccl's own (10) on nccl, else 30
    (torch.distributed.constants; a torch built without NCCL has no nccl default, and 10 is the documented one)."""
    from torch.distributed import constants

    default = constants.default_pg_nccl_timeout if backend == "nccl" else constants.default_pg_timeout
    return default.total_seconds() / 60 if default is not None else 10.0


def _hang_ended(res, hang_timeout_s: float, limit_s: float, world: int, backend: str | None = None) -> list:
    """The claims of a run that hangs on purpose: it failed by itself; each of its `world` ranks ended of a
    collective's timeout or of its peer leaving after one (rank_outcomes); after at least the timeout. 0.8 x the
    timeout: gloo's clock and the script's start apart by scheduling, and a shorter wait would mean another error; the
    launcher's limit bounds the rest, set against `backend`'s default timeout (None: the one demo.start chose, by the
    library's rule for `world` ranks on this machine)."""
    if backend is None:
        from distrinews_lib.distributed import choose_backend

        backend = choose_backend("auto", local_world_size=world)[0]
    w = waited(res)
    return [
        _failed_by_itself(res, limit_s, ""),
        _each_rank_saw(res, world),
        Claim(
            f"broken: the ranks that reported gave up after {_span(w)} s: no sooner than 0.8 x the "
            f"{hang_timeout_s:g} s timeout ({0.8 * hang_timeout_s:.1f} s: the script's clock and gloo's start apart) "
            f"and within the launcher's {limit_s:.0f} s limit, nowhere near {backend}'s default "
            f"{default_timeout_min(backend):g} minutes",
            bool(w) and min(w) >= 0.8 * hang_timeout_s and max(w) < limit_s,
        ),
    ]


def _span(w: list[float]) -> str:
    """The ranks' waited_s as one figure, or as a range where they differ at one decimal."""
    lo, hi = f"{min(w or [0]):.1f}", f"{max(w or [0]):.1f}"
    return lo if lo == hi else f"{lo}-{hi}"


def hang_ended_row(w: list[float], hang_timeout_s: float) -> str:
    """The summary row's words for a hang: the timeout, and the ranks' waited_s apart from it (it counts from the
    script's clock: from before the model was built in pitfall 7, so with its start-up; from the collective in 9)."""
    return f"error at the {hang_timeout_s:g} s timeout (the ranks waited {max(w or [0]):.1f} s)"


def uneven_inputs(res, r: dict, hang_timeout_s: float, limit_s: float) -> Symptom:
    """Pitfall 7: hand-made shards give rank 0 one batch more; its extra backward waits for partners that left."""
    per_rank = {int(x["rank"]): int(x["my_batches"]) for x in results(res.output) if "my_batches" in x}
    batches = [per_rank[k] for k in sorted(per_rank)]  # in rank order: rank 0 first
    even, join = r["even"], r["join"]
    w = waited(res)
    claims = [  # the batches per rank are the script's set-up (one sample too many), shown in the row, not checked
        *_hang_ended(res, hang_timeout_s, limit_s, len(batches)),
        Claim(
            f"fix (a) even shards: {even['batches_per_rank']} batches per rank; it finished, parameters identical",
            len(set(even["batches_per_rank"])) == 1 and even["max_param_diff"] == 0.0,
        ),
        Claim(
            f"fix (b) Join: steps {join['steps_per_rank']}, still uneven; it finished, parameters identical",
            len(set(join["steps_per_rank"])) == 2 and join["max_param_diff"] == 0.0,
        ),
    ]
    return Symptom(
        "7. uneven inputs",
        f"batches per rank {batches}: hang, {hang_ended_row(w, hang_timeout_s)}",
        f"finishes: even {even['batches_per_rank']}, Join {join['steps_per_rank']}; params identical",
        claims,
    )


def one_rank_collective(res, r: dict, hang_timeout_s: float, limit_s: float) -> Symptom:
    """Pitfall 9: an all-reduce inside `if rank == 0`. The fixed run's collectives must finish well inside the
    timeout (under 0.8 x): a run that waited for it would not show the fix."""
    world, w = r["world_size"], waited(res)
    claims = [
        *_hang_ended(res, hang_timeout_s, limit_s, world),
        Claim(
            f"fixed: every rank joined the all-reduce: global val loss {r['global_val_loss']:.3f}, the mean of "
            f"1..{world}",
            abs(r["global_val_loss"] - (world + 1) / 2) < 1e-6,
        ),
        Claim(
            f"fixed: the collectives completed in {1000 * r['seconds']:.0f} ms, without waiting for any timeout",
            r["seconds"] < 0.8 * hang_timeout_s,
        ),
    ]
    return Symptom(
        "9. collective on one rank only",
        f"hang, {hang_ended_row(w, hang_timeout_s)}",
        f"completes in {1000 * r['seconds']:.0f} ms",
        claims,
    )


def nccl_refusals(n_gpus: int, timeout: float) -> dict:
    """What the library answers when nccl is asked for with one rank more than this machine has GPUs: through
    choose_backend, and through a launch of train_ddp.py --backend nccl. {what was asked: its message, or None where
    it did not refuse}."""
    from distrinews_lib.distributed import choose_backend
    from distrinews_lib.errors import UserError

    from .launch import torchrun

    asked = {}
    try:
        choose_backend("nccl", local_world_size=n_gpus + 1)
        asked["choose_backend('nccl')"] = None
    except UserError as err:
        asked["choose_backend('nccl')"] = str(err)
    try:
        torchrun("scripts/train_ddp.py", n_gpus + 1, ["--backend", "nccl"], timeout=timeout, echo=False)
        asked[f"train_ddp.py --backend nccl, {n_gpus + 1} process(es)"] = None
    except UserError as err:
        asked[f"train_ddp.py --backend nccl, {n_gpus + 1} process(es)"] = str(err)
    return asked


def _rank_errors(res) -> list[str]:
    return [line.rsplit("\r", 1)[-1] for line in res.lines if re.search(r"^\[rank \d+\] \w+(Error|Exception)", line)]


def nccl_backend(res, r: dict, refusals: dict, n_gpus: int, limit_s: float) -> Symptom:
    """Pitfall 10: a hard-coded nccl fails where a rank has no GPU of its own; the library refuses, naming gloo."""
    world = r["world_size"]
    errors = _rank_errors(res)
    expected = "nccl" if n_gpus >= world else "gloo"
    named = [e for e in errors if re.search(r"NCCL|CUDA|GPU", e)]  # a rank's own error line, not any launcher text
    first = (named or errors)[0].split(": ", 1)[-1][:60] if errors else "see the story above"
    claims = [
        _failed_by_itself(res, limit_s, " at start-up"),
        Claim(f"broken: hard-coded nccl fails: {first}", bool(named)),
        *[
            Claim(
                f"the library refuses {what} with an error that names the fix (gloo)",
                message is not None and "gloo" in message,
            )
            for what, message in refusals.items()
        ],
        Claim(
            f"fixed: auto chose {r['backend']} ({r['reason']}); devices {r['devices']}",
            r["backend"] == expected and (len(set(r["devices"])) == world or expected == "gloo"),
        ),
        Claim(
            f"fixed: the all-reduce works ({r['allreduce_sum']:.0f} = "
            f"{' + '.join(map(str, range(1, world + 1))) if world <= 4 else f'1 + ... + {world}'}, each rank's number)",
            r["allreduce_sum"] == world * (world + 1) / 2,
        ),
    ]
    return Symptom(
        "10. nccl without a GPU per rank",
        f"error at start-up: {first[:50]}",
        f"auto -> {r['backend']}, all-reduce OK",
        claims,
    )


def unused_parameters(res, r: dict, output: str, limit_s: float) -> Symptom:
    """Pitfall 11: a head skipped on some steps leaves its gradients missing, and DDP's reduction unfinished."""
    rows = [x for x in results(res.output) if "failed_at_step" in x]
    fu, sg, n = r["find_unused"], r["static_graph"], r["n_params"]
    skipped = [step for step, used in enumerate(r["aux_used"]) if not used]
    claims = [
        _failed_by_itself(res, limit_s, ""),
        Claim(
            "broken: the ranks stopped in step 1, the step after the one that skipped the head, with DDP's error: "
            "the previous step's reduction never finished",
            bool(rows) and all(x["failed_at_step"] == "1" for x in rows) and REDUCTION_NOT_FINISHED in res.output,
        ),
        Claim(
            "... because step 0 left aux.weight and aux.bias without a gradient",
            bool(rows) and all(json.loads(x["no_grad_on_previous_step"]) == ["aux.weight", "aux.bias"] for x in rows),
        ),
        Claim(
            f"fix 1, find_unused_parameters=True: all {r['steps']} steps ran (the head skipped on {len(skipped)}); "
            f"parameters identical on every rank",
            len(fu["numbers_per_step"]) == r["steps"] and fu["max_param_diff"] == 0.0 and len(skipped) > 0,
        ),
        Claim(
            f"... yet each step all-reduced all {n:,} numbers, the head's {r['n_aux_params']} zeros too, and PyTorch "
            "warns of the other cost: a walk over the autograd graph on every step",
            all(fu["no_grad"][s] == ["aux.weight", "aux.bias"] and fu["numbers_per_step"][s] == n for s in skipped)
            and EXTRA_TRAVERSAL in output,
        ),
        Claim(
            f"fix 2, static_graph=True with the head unused on every step: all {r['steps']} steps ran; parameters "
            "identical",
            len(sg["numbers_per_step"]) == r["steps"] and sg["max_param_diff"] == 0.0,
        ),
    ]
    step = rows[0]["failed_at_step"] if rows else "?"
    return Symptom(
        "11. parameter unused on some steps",
        f"error in step {step}: reduction not finished",
        f"find_unused / static_graph: {r['steps']} steps, params identical",
        claims,
    )


def pytorch_warning(output: str, width: int = 160) -> str:
    """PyTorch's warning about find_unused_parameters, once (every rank prints it), up to the end of the sentence that
    names its cost (the rest is advice); cut to `width` if that sentence is not there."""
    line = next((x for x in output.splitlines() if EXTRA_TRAVERSAL in x), "")
    text = line.split("Warning: ", 1)[-1]
    end = text.find(".", text.find(EXTRA_TRAVERSAL)) if EXTRA_TRAVERSAL in text else -1
    if end >= 0:
        return text[: end + 1]
    return text if len(text) <= width else text[: width - 3] + "..."
