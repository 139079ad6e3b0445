"""The learner's side of chapter 03's checker: the exercises, their skeletons and hints, and check_exercise, which runs
a learner's file through the race's check and every probe and prints what passed and, in one line, the first mistake."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from distrinews_lib.errors import UserError

from . import CLASSES, SCRIPTS, TWO_LEVEL
from .check import PASS, mistake

# What each exercise's file must define, and the functions the learner writes (a stub raises NotImplementedError).
EXERCISES = {
    "overlapped": CLASSES["overlapped"],
    "bucketed": CLASSES["bucketed"],
    "zero1": CLASSES["zero1"],
    "zero3": "gather",
    "hierarchical": "across_nodes",  # chapter 08's: checked on 2 nodes x 2 ranks (TWO_LEVEL_WORLD)
    "hsdp": "node_group",  # chapter 08's too: the shard group and the replicate all-reduce
}
TWO_LEVEL_WORLD = (4, 2)  # (ranks, ranks per node) the two-level exercises are checked on, on this machine's loopback
SKELETONS = SCRIPTS / "skeletons"

HINTS = {
    "overlapped": [
        "register_post_accumulate_grad_hook(fn) calls fn(param) once param.grad holds this backward's whole gradient: "
        "register one per parameter in __init__.",
        "dist.all_reduce(tensor, async_op=True) returns a work handle at once; keep every handle, and call .wait() on "
        "them only in sync_gradients, before the optimizer needs the averages.",
        "gloo pairs the n-th all-reduce of every rank. If each hook launched its own gradient, two ranks whose "
        "gradients complete in different orders would pair different tensors: keep a fixed order (reverse parameter "
        "order) and, in each hook, launch every parameter that is next in that order and ready.",
        "A hook that fires for a parameter already marked ready means a second backward before the step: raise a "
        "UserError then (every rank does the same), or accumulate correctly.",
    ],
    "bucketed": [
        "Build the buckets once, in __init__: walk the parameters in reverse, add each to the current bucket, and "
        "start a new bucket once the current one holds at least the cap in bytes (numel x element_size).",
        "Count, per bucket, how many of its gradients are ready; a bucket may leave once the count equals its size "
        "AND every bucket before it has left: the launch order must be the same on every rank.",
        "A bucket's message is one flat tensor: torch.cat of its gradients, reshaped to 1-D, divided by the world "
        "size; launch its all-reduce with async_op=True and keep the buffer with the handle.",
        "In sync_gradients, wait for each bucket in launch order and copy each slice of the flat buffer back into "
        "its parameter's .grad (view_as the parameter), then reset the counters for the next step.",
    ],
    "zero1": [
        "One flat buffer for all parameters, padded so that its length is a multiple of the world size: rank r owns "
        "elements [r * shard, (r + 1) * shard). Make it with the parameters' dtype.",
        "The shard is an nn.Parameter holding a copy of this rank's slice of the flattened weights; the optimizer "
        "is built on it alone, so its AdamW state covers only that slice.",
        "dist.reduce_scatter_tensor(out, flat) sums flat over the ranks and gives each rank only its slice: divide "
        "flat by the world size first; that slice is the shard's .grad.",
        "After optimizer.step(), dist.all_gather_into_tensor(flat, shard) gives every rank every rank's updated "
        "slice, in rank order: copy it back into the parameters.",
    ],
    "hierarchical": [
        "dp.nodes holds the two groups: dp.nodes.intra, this node's ranks, and dp.nodes.cross, the ranks with this "
        "rank's local rank, one per node. A collective runs on the group passed as group=...; without one, on every "
        "rank.",
        "The shard is one node's partial sum. The average divides the sum over every rank of every node by dp.world "
        "(not by the node's size); dividing before or after the sum across the nodes gives the same bits here.",
        "Gathering is worth it only once every node's shard has been summed across the nodes: all_gather_into_tensor "
        "puts the node's g shards into flat in local-rank order, the order in which the reduce-scatter cut them.",
    ],
    "hsdp": [
        "Nodes(ranks_per_node) works out this rank's node and makes both groups (every rank together: group "
        "creation is a collective); keep it on dp, since replicate() needs its cross-node group.",
        "The group node_group() returns is the one every gather and reduce-scatter of the rung runs on; the ranks "
        "that hold the same shard of a block are one per node, with the same local rank.",
        "dist.all_reduce(tensor, group=..., async_op=True) sums in place and returns a work handle: launch one per "
        "block whose shard has a gradient, then wait for them all.",
    ],
    "zero3": [
        "A block's `full` buffer keeps its shape and its dtype (dp.param_dtype); only its memory comes and goes: "
        "full.untyped_storage().resize_(n) gives it n bytes (block.nbytes), resize_(0) takes them away.",
        "The shard is the master, in the model's dtype. What an all-gather sends must have the output's dtype: "
        "tensor.to(dtype) makes the low-precision copy that travels (and is no copy at all when the dtypes agree).",
        "The gradients arrive in dp.param_dtype; the sum belongs in dp.reduce_dtype. torch.cat(tensors, out=...) "
        "casts into a buffer of another dtype; reduce_scatter_tensor(out, buffer, group=..., async_op=True) leaves "
        "each rank its slice of the sum.",
        "An update reaches the next forward only through the tensor every gather reads from; the parameters the "
        "model computes with are rebuilt from it at each gather.",
    ],
}


def hint(rung: str, n: int = 1) -> None:
    """Print hint n (1, 2, ...) of an exercise, and no other."""
    hints = HINTS.get(rung)
    if not hints:
        raise UserError(f"no hints for {rung!r}: the exercises are {', '.join(HINTS)}")
    if not 1 <= n <= len(hints):
        print(f"{rung} has hints 1 to {len(hints)}.")
        return
    print(f"hint {n} of {len(hints)} ({rung}): {hints[n - 1]}")


def skeleton(rung: str) -> str:
    return (SKELETONS / f"{rung}.py").read_text()


def stubs(path) -> list:
    """The functions and methods of a file whose body still only raises NotImplementedError (a docstring aside)."""
    tree = ast.parse(Path(path).read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
            if len(body) == 1 and isinstance(body[0], ast.Raise) and body[0].exc is not None:
                exc = body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc
                if isinstance(exc, ast.Name) and exc.id == "NotImplementedError":
                    out.append(node.name)
    return out


def status(rung: str, path) -> tuple[str, list]:
    """("blank", stubs) when nothing is written yet (every function of the skeleton still a stub), ("partial", the
    stubs left) or ("written", [])."""
    left = stubs(path)
    if not left:
        return "written", []
    total = len(stubs_of_skeleton(rung))
    return ("blank" if len(left) >= total else "partial"), left


def stubs_of_skeleton(rung: str) -> list:
    return stubs(SKELETONS / f"{rung}.py")


def call_sites(rung: str) -> str:
    """Where the given code of exercise `rung`'s skeleton calls each function the learner writes: one line per call,
    'Class.method: the line', in the order of the file."""
    text = skeleton(rung)
    lines, blanks, out = text.splitlines(), set(stubs_of_skeleton(rung)), []
    for cls in ast.parse(text).body:
        if not isinstance(cls, ast.ClassDef):
            continue
        for fn in (f for f in cls.body if isinstance(f, ast.FunctionDef)):
            calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and getattr(n.func, "id", None) in blanks]
            out += [
                f"{cls.name}.{fn.name}: {lines[c.lineno - 1].strip()}" for c in sorted(calls, key=lambda c: c.lineno)
            ]
    return "\n".join(out)


def given_class(rung: str, name: str) -> str:
    """The source of class `name` in exercise `rung`'s skeleton: given code the learner's functions use."""
    text = skeleton(rung)
    node = next((n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == name), None)
    if node is None:
        raise ValueError(f"no class {name} in the {rung} skeleton")
    return ast.get_source_segment(text, node)


def verdict(res: dict, label: str) -> dict:
    """The first mistake the race found for contender `label` (its check on the tiny and tied models, then each
    probe in order), or PASS; with what passed."""
    passed = []
    for model, contenders in res.get("check", {}).items():
        r = contenders.get(label)
        if r is None:
            continue
        if r.get("verdict", PASS)["ok"] is False:
            return {**r["verdict"], "passed": passed}
        fsdp2 = r.get("max_weight_diff_vs_fsdp2")  # HSDP: also against torch's FSDP2 on a 2-D mesh
        passed.append(
            f"{model} model: {res['steps']} steps equal to torch's DDP (max difference {r['max_weight_diff']:.3g})"
            + ("" if fsdp2 is None else f" and to FSDP2 on a 2-D mesh ({fsdp2:.3g})")
        )
    for name, v in res.get("probes", {}).get(label, {}).items():
        if not v["ok"]:
            return {**v, "passed": passed}
        passed.append(f"{name}: {v.get('summary', 'as torch DDP')}")
    return {**PASS, "passed": passed}


def launch_error_line(err) -> str:
    """A failed launch in one line: the scripts' own message, else the last exception line."""
    lines = [l.strip() for l in str(err).splitlines() if l.strip()]
    first = next((l for l in lines if l.startswith("error:")), None)
    if first:
        rest = []
        for l in lines[lines.index(first) + 1 :]:
            if l.startswith(("error:", "[rank")) or not l:
                break
            rest.append(l)
        return " ".join([first[len("error:") :].strip(), *rest])
    exc = [l for l in lines if "Error" in l or "Exception" in l]
    return (exc[-1] if exc else lines[-1] if lines else "the launch failed")[:300]


def check_exercises(
    items,
    out_dir="outputs/by_hand",
    *,
    timeout: float = 300,
    models="tiny,tied",
    probes=True,
    check_steps: int = 3,
    rungs: str = "",
    collective_timeout_s: float = 20,
) -> dict:
    """Check several learner files in ONE launch: items are (rung, path, label). Returns {label: verdict}; a file
    still blank or unfinished gets its verdict without being launched. collective_timeout_s: how long a rank waits in
    a collective its peer left (a case that ends that way costs this much)."""
    from ..launch import LaunchError
    from .report import run_race

    out, launch = {}, []
    for rung, path, label in items:
        try:
            state, left = status(rung, path)
        except SyntaxError as err:  # the learner's file does not parse: say where, in one line
            out[label] = {
                **mistake("crashed", detail=f"SyntaxError: {err.msg} (line {err.lineno}: {(err.text or '').strip()})"),
                "passed": [],
            }
            continue
        if state == "blank":
            out[label] = {
                "ok": None,
                "mistake": "not_attempted",
                "passed": [],
                "message": f"{rung}: not attempted yet (the skeleton's functions still raise "
                "NotImplementedError): write them in the exercise cell, run it, then this cell",
            }
        elif state == "partial":
            out[label] = {**mistake("not_written", detail=", ".join(left)), "passed": []}
        else:
            launch.append((rung, path, label))
    # One launch per world: chapter 03's exercises on 2 ranks, the two-level ones on 2 nodes x 2 ranks
    for two_level in (False, True):
        batch = [item for item in launch if (item[0] in TWO_LEVEL) == two_level]
        if not batch:
            continue
        args = ["--rungs", rungs, "--models", models, "--check_only", "--timeout_s", collective_timeout_s]
        args += ["--check_steps", check_steps]
        for rung, path, label in batch:
            args += ["--exercise", f"{rung}:{path}:{label}"]
        if probes:
            args += ["--probes", "all"]
        nproc = 2
        if two_level:
            nproc, per_node = TWO_LEVEL_WORLD
            args += ["--ranks_per_node", per_node]
        json_path = Path(out_dir) / f"check_{batch[0][2]}.json"
        json_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            res = run_race(args, json_path, timeout=timeout, nproc=nproc)
        except LaunchError as err:
            line = launch_error_line(err)
            for rung, path, label in batch:
                out[label] = {**mistake("crashed", detail=line), "passed": []}
            continue
        for rung, path, label in batch:
            out[label] = verdict(res, label)
        out["_race"] = res
    return out


def check_exercise(
    rung: str, path, out_dir="outputs/by_hand", *, strict: bool = False, timeout: float = 300, probes: bool = True
) -> dict:
    """Run the learner's `rung` (the file at `path`) through the race's check and every probe, against torch's DDP;
    print what passed and, in one line, the first mistake. strict=True (solutions, tests): raise AssertionError
    with that line instead of returning a failed verdict."""
    v = check_exercises([(rung, path, rung)], out_dir, timeout=timeout, probes=probes)[rung]
    for line in v.get("passed", []):
        print(f"✓ {line}")
    if v["ok"] is None:
        print(v["message"])
        if strict:
            raise AssertionError(f"{rung}: not attempted")
    elif not v["ok"]:
        print(f"✗ {v['message']}")
        if strict:
            raise AssertionError(v["message"])
    else:
        also = " and torch's FSDP2 on a 2-D mesh do" if rung == "hsdp" else " does"
        print(f"checked: your {rung} trains as torch's DDP{also}, in every case above")
    return v


REFERENCE_RUNGS = ("overlapped", "bucketed", "zero1", "zero3")


def reference_claims(verdicts: dict, rungs=REFERENCE_RUNGS) -> list:
    """What the solutions show, from check_exercises' verdicts on the reference answers: each passes the checker (a
    reference the checker rejects fails its claim); the all-reduce-in-the-hook rungs refuse a second backward before
    the step on every rank; and a parameter without a gradient, on rank 1 only or on every rank, gets a clear error on
    every rank from every rung probed. The probes' summaries are the race's own sentences (scripts/by_hand/race.py's
    probes), so a probe that hung, crashed one rank or accumulated fails its claim."""
    from ..claims import Claim

    probes = (verdicts.get("_race") or {}).get("probes") or {}  # none: the launch crashed before its probes
    out = [
        Claim(f"the reference {r} passes the checker ({len(verdicts[r]['passed'])} checks)", verdicts[r]["ok"] is True)
        for r in rungs
    ]
    refused = "two backward passes per step: refused on every rank"
    out.append(
        Claim(
            "a second backward before the step: the all-reduce-in-the-hook rungs refuse it on every rank",
            all(
                probes.get(r, {}).get("accumulate", {}).get("summary", "").startswith(refused)
                for r in ("overlapped", "bucketed")
            ),
        )
    )
    out.append(
        Claim(
            "a parameter without a gradient (on rank 1 only, or everywhere): a clear error on every rank, every rung",
            bool(probes)
            and all(
                "clear error on every rank" in probes[r][c]["summary"]
                for r in probes
                for c in ("unused_rank1", "unused_all")
            ),
        )
    )
    return out


def run_reference_solutions(write, out_dir="outputs/by_hand", rungs=REFERENCE_RUNGS) -> list:
    """The solutions cell: write each exercise's reference answer (`write(rung, path)`, from notebooks/answers/), check
    them all in ONE launch (the race's check, then every case), print what each passed, and return reference_claims."""
    items = [(r, write(r, f"{out_dir}/solution_{r}.py"), r) for r in rungs]
    verdicts = check_exercises(items, out_dir)
    for r in rungs:
        print(f"{r}:\n  " + "\n  ".join(verdicts[r]["passed"]))
    return reference_claims(verdicts, rungs)


def save_json(path, obj) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(obj, indent=1, default=str))
