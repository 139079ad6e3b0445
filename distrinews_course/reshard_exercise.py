"""Chapter 07's exercise: the learner writes the resharding load, load_resharded(folder, model, optimizer), in a file.

    verdict = check_exercise("outputs/fault_tolerance/ex_load_resharded.py", "outputs/.../step_00000020")

The check launches WORLD ranks (not the 2 that saved the checkpoint), builds the model and optimizer exactly as
scripts/train_sharded.py does (its own sharded_model), calls the learner's function on every rank, gathers what it
loaded and compares it with the checkpoint read whole in one process: the training state it returned, every weight,
every AdamW moment and step, bit for bit (a load copies; only training afterwards rounds differently). It prints one
line: passed, or the first mistake it found. A stub still raising NotImplementedError is "not attempted yet", with no
launch. Run as a script, this file is the worker (see main).
"""

from __future__ import annotations

import json
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

from distrinews_course import ROOT  # absolute: this file also runs as the check's worker script
from distrinews_course.attempt import is_stub
from distrinews_lib.errors import first_line

WORLD = 3  # not 2 (the saving world), and not a divisor of every tensor's rows: uneven shards, a real resharding
FUNCTION = "load_resharded"
SCRIPT = ROOT / "scripts" / "train_sharded.py"
TIMEOUT_S = 20  # the worker's collectives: a rank that skips one (a load on rank 0 only) fails in 20 s, not 30 min


# Wrong versions of the exercise, one per mistake the checker names (the words it says): its tests run each, and the
# chapter's solution shows one. Each is a whole file, as a learner's would be.
_HEAD = (
    "import json\nimport torch\nimport torch.distributed.checkpoint as dcp\n"
    "from torch.distributed.checkpoint.state_dict import (\n    get_model_state_dict, get_state_dict, "
    "set_model_state_dict, set_state_dict,\n)\n\n\n"
)
MISTAKES = {
    "model only": (
        _HEAD + "def load_resharded(folder, model, optimizer):\n"
        '    state = {"model": get_model_state_dict(model), "train": ""}\n'
        "    dcp.load(state, checkpoint_id=folder)\n"
        '    set_model_state_dict(model, state["model"])\n'
        '    return json.loads(state["train"])\n',
        "the optimizer was not loaded",
    ),
    "optimizer only": (
        _HEAD + "def load_resharded(folder, model, optimizer):\n"
        "    msd, osd = get_state_dict(model, optimizer)\n"
        '    state = {"optim": osd, "train": ""}\n'
        "    dcp.load(state, checkpoint_id=folder)\n"
        '    set_state_dict(model, optimizer, model_state_dict={}, optim_state_dict=state["optim"])\n'
        '    return json.loads(state["train"])\n',
        "the model was not loaded",
    ),
    "no training state": (
        _HEAD + "def load_resharded(folder, model, optimizer):\n"
        "    msd, osd = get_state_dict(model, optimizer)\n"
        '    state = {"model": msd, "optim": osd}\n'
        "    dcp.load(state, checkpoint_id=folder)\n"
        '    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])\n'
        '    return {"step": 0}\n',
        "not the checkpoint's training state",
    ),
    "its own old shard file": (
        _HEAD + "def load_resharded(folder, model, optimizer):\n"
        "    rank = torch.distributed.get_rank()\n"
        '    model.load_state_dict(torch.load(f"{folder}/__{rank}_0.distcp"))\n'
        "    return {}\n",
        "load_resharded raised",
    ),
}


@dataclass
class Verdict:
    path: str
    attempted: bool
    ok: bool
    mistake: str | None  # one line, None when ok


def _load_function(path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"learner_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, FUNCTION, None)
    if fn is None:
        raise AttributeError(f"{path} defines no function {FUNCTION}(folder, model, optimizer)")
    return fn


def check_exercises(paths: list, checkpoint, world: int = WORLD, timeout: float = 120) -> dict:
    """{path: Verdict} for learner files, checked in ONE launch of `world` ranks (stubs are not launched)."""
    from distrinews_course.launch import torchrun

    verdicts, launch = {}, []
    for path in map(str, paths):
        try:
            stub = is_stub(_load_function(path))
        except Exception as err:  # noqa: BLE001  (the learner's file: a syntax error, a missing function)
            verdicts[path] = Verdict(path, True, False, f"{path} could not be loaded: {type(err).__name__}: {err}")
            continue
        if stub:
            verdicts[path] = Verdict(path, False, False, None)
        else:
            launch.append(path)
    if launch:
        res = torchrun(__file__, world, [checkpoint, *launch], timeout=timeout, echo=False, check=False)
        found = [line for line in res.lines if line.startswith("VERDICT ")]
        found = json.loads(found[-1][len("VERDICT ") :]) if found else {}
        for path in launch:
            mistake = (
                found.get(path, "")
                if found
                else (
                    f"the check did not finish (exit code {res.returncode}{', timed out' if res.timed_out else ''}): "
                    "a collective that not every rank called? get_state_dict, dcp.load and set_state_dict are "
                    "collective: every rank calls each of them, in the same order"
                )
            )
            verdicts[path] = Verdict(path, True, mistake is None, mistake)
    return verdicts


def check_exercise(path, checkpoint, world: int = WORLD) -> Verdict:
    """Check one learner file and print one line."""
    v = check_exercises([path], checkpoint, world)[str(path)]
    if not v.attempted:
        print(
            f"{FUNCTION}: not attempted yet (it still raises NotImplementedError). Write it in {path}, run that "
            "cell, then this one."
        )
    elif v.ok:
        print(
            f"checked: {FUNCTION} loads a checkpoint saved by 2 ranks into {world} ranks, bit for bit: weights, "
            "AdamW's moments and steps, and the training state"
        )
    else:
        print(f"✗ {v.mistake}")
    return v


# --- the worker: runs on every rank under torchrun -----------------------------------------------------------------


def _mismatch(name: str, want: dict, got: dict) -> str | None:
    import torch

    if set(want) != set(got):
        missing = sorted(set(want) - set(got))
        return f"{name}: {len(missing)} of {len(want)} entries missing (e.g. {missing[:1]})"
    bad = [k for k in want if not torch.equal(want[k].cpu(), got[k].cpu())]
    return f"{len(bad)} of {len(want)} {name} differ from the checkpoint's (e.g. {bad[0]})" if bad else None


def judge(checkpoint, loaded_train, model_sd: dict, optim_sd: dict) -> str | None:
    """The first mistake in what a load left (whole state dicts, gathered on rank 0), or None when it is all there."""
    from distrinews_lib import sharded_checkpoint

    ref = sharded_checkpoint.read_whole(checkpoint, keys={"model", "optim", "train"})
    train = json.loads(ref["train"])
    if loaded_train != train:
        shown = json.dumps(loaded_train)[:80] if loaded_train is not None else "None"
        return (
            f"it returned {shown}, not the checkpoint's training state: load the 'train' entry (a JSON string, "
            f"saved at step {train['step']}) with the rest and return json.loads of it"
        )
    wrong = _mismatch("weights", ref["model"], model_sd)
    if wrong:
        return (
            f"the model was not loaded: {wrong}; dcp.load fills get_state_dict's model part, set_state_dict puts it in"
        )
    for moment in ("exp_avg", "exp_avg_sq", "step"):
        want = {k: s[moment] for k, s in ref["optim"]["state"].items()}
        got = {k: s[moment] for k, s in optim_sd.get("state", {}).items() if moment in s}
        wrong = _mismatch(f"AdamW's {moment} tensors", want, got)
        if wrong:
            return (
                f"the optimizer was not loaded: {wrong}; a resumed AdamW needs its moments, or its first steps "
                "jolt (load the optimizer's part too, and set it)"
            )
    return None


def main(argv=None) -> None:
    """Worker: build the model as train_sharded.py does, run each learner file's load, judge it on rank 0."""
    import runpy
    from datetime import timedelta
    from types import SimpleNamespace

    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    from distrinews_lib import sharded_checkpoint
    from distrinews_lib.data.texts import AG_NEWS_LABELS

    checkpoint, *paths = sys.argv[1:] if argv is None else argv
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=TIMEOUT_S))
    rank, world = dist.get_rank(), dist.get_world_size()
    lesson = runpy.run_path(str(SCRIPT), run_name="train_sharded")  # its functions; its main() does not run
    box = [json.loads(sharded_checkpoint.read_whole(checkpoint, keys={"train"})["train"]) if rank == 0 else None]
    dist.broadcast_object_list(box)
    args = SimpleNamespace(seed=box[0]["seed"], lr=4e-3, label_names=list(AG_NEWS_LABELS))
    verdicts = {}
    for path in paths:
        model, _, optimizer = lesson["sharded_model"](args, init_device_mesh("cpu", (world,)))
        try:
            got = _load_function(path)(checkpoint, model, optimizer)
            error = None
        except Exception as err:  # noqa: BLE001  (the learner's bug, reported in one line)
            frames = [
                f
                for f in traceback.extract_tb(err.__traceback__)
                if f.filename == str(Path(path).resolve()) or Path(f.filename).name == Path(path).name
            ]
            where = f" (line {frames[-1].lineno}: {frames[-1].line})" if frames else ""
            error = f"{FUNCTION} raised {type(err).__name__}: {first_line(err, 160)}{where}"
            got = None
        errors = [None] * world
        dist.all_gather_object(errors, error)
        error = next((e for e in errors if e), None)
        if error is None:
            full = StateDictOptions(full_state_dict=True, cpu_offload=True)
            model_sd, optim_sd = get_state_dict(model, optimizer, options=full)
            verdicts[path] = judge(checkpoint, got, model_sd, optim_sd) if rank == 0 else None
        else:
            verdicts[path] = error
        dist.barrier()
    if rank == 0:
        print("VERDICT " + json.dumps(verdicts), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
