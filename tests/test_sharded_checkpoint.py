"""Sharded checkpoints (torch Distributed Checkpoint) with real gloo ranks: one checkpoint resumed on 2 -> 4, 4 -> 2,
2 -> 1 and 2 -> 2 ranks; a save killed midway; the async path's pre-step values; every kind of damage; the converter
to the one-file checkpoint; the exercise's checker against its mutants."""

import json
import shutil
import textwrap

import pytest
import torch

from distrinews_course import faults, reshard_exercise, resume_match, served_score
from distrinews_course.launch import torchrun
from distrinews_lib import checkpoint, sharded_checkpoint
from distrinews_lib.sharded_checkpoint import ShardedCheckpointError, folder_for

from .helpers import ROOT, SCRIPTS, run_script

SCRIPT = SCRIPTS / "train_sharded.py"
WORKERS = ROOT / "tests" / "workers"
# 12 steps of 32 texts, a checkpoint every 4 (all kept): steps 4, 8 and 12.
RUN = ["--steps", 12, "--save_every", 4, "--keep", 5, "--num_samples", 800, "--eval_samples", 200]


def _launch(nproc, out, *extra, timeout=180, **kw):
    args = [*RUN, "--output", out, *extra]
    if nproc == 1:  # a world of one: plain python, as on a machine with one GPU left
        res = run_script([SCRIPT, *args], timeout=timeout)
        assert res.returncode == 0, res.stdout + res.stderr
        return res.stdout + res.stderr
    return torchrun(SCRIPT, nproc, args, timeout=timeout, echo=False, **kw).output


@pytest.fixture(scope="module")
def run2(tmp_path_factory):
    """The uninterrupted run: 2 ranks, 12 steps, checkpoints at 4, 8 and 12."""
    out = tmp_path_factory.mktemp("sharded") / "run2"
    _launch(2, out)
    assert [p.name for p in sharded_checkpoint.committed(out)] == ["step_00000004", "step_00000008", "step_00000012"]
    return out


@pytest.mark.slow
def test_one_checkpoint_resumes_on_4_2_and_1_ranks_where_the_run_went(run2, tmp_path):
    runs = {}
    out = _launch(4, tmp_path / "r4", "--resume", folder_for(run2, 4))
    assert "saved by 2 rank(s), loaded by 4" in out
    runs["2 -> 4 ranks"] = (folder_for(run2, 4), tmp_path / "r4")
    out = _launch(2, tmp_path / "r42", "--resume", folder_for(tmp_path / "r4", 8))  # a checkpoint 4 ranks wrote
    assert "saved by 4 rank(s), loaded by 2" in out
    runs["4 -> 2 ranks"] = (folder_for(tmp_path / "r4", 8), tmp_path / "r42")
    out = _launch(1, tmp_path / "r1", "--resume", folder_for(run2, 4))
    assert "saved by 2 rank(s), loaded by 1" in out
    runs["2 -> 1 rank"] = (folder_for(run2, 4), tmp_path / "r1")
    _launch(2, tmp_path / "r22", "--resume", folder_for(run2, 4))
    runs["2 -> 2 ranks"] = (folder_for(run2, 4), tmp_path / "r22")

    end = folder_for(run2, 12)
    matches = {k: resume_match.compare(k, end, start, folder_for(run, 12)) for k, (start, run) in runs.items()}
    print(resume_match.table(list(matches.values())))
    assert all(m.ok for m in matches.values()), resume_match.table(list(matches.values()))
    assert matches["2 -> 2 ranks"].bitwise, "on the same world size the resume must be exact"
    assert not any(matches[k].bitwise for k in ("2 -> 4 ranks", "2 -> 1 rank")), "other world sizes round differently"
    # The tolerance tells a mistake apart: a run one checkpoint short (4 steps) is far outside it.
    short = resume_match.compare("4 steps short", end, folder_for(run2, 4), folder_for(run2, 8))
    assert not short.ok and short.weights > 10 * resume_match.TOLERANCE


@pytest.mark.slow
def test_a_save_killed_midway_leaves_the_previous_checkpoint_loadable(run2, tmp_path):
    out = tmp_path / "killed"
    res = torchrun(
        faults.WRAPPER,
        2,
        ["kill:rank=1:save=2", SCRIPT, *RUN, "--output", out],
        timeout=240,
        echo=False,
        torchrun_args=["--max-restarts=1"],
    )
    assert "[rank 1] injected fault: kill in save 2" in res.output
    assert f"resumed from {folder_for(out, 4)}: step 4" in res.output, res.output[-3000:]
    assert not list(out.glob("*.partial")), "the killed save's folder is cleaned up by the resumed run"
    assert resume_match.compare("killed", folder_for(run2, 12), folder_for(run2, 4), folder_for(out, 12)).bitwise
    attempts = {(e["attempt"], e["event"]) for e in faults.timeline(out)}
    assert {(0, "fault"), (0, "step"), (1, "start"), (1, "step")} <= attempts


def test_a_partial_save_is_never_listed_or_loaded(run2, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(folder_for(run2, 4), folder_for(root, 4))
    partial = shutil.copytree(folder_for(run2, 8), root / "step_00000008.partial")
    (partial / "manifest.json").unlink()  # a save killed before its commit never wrote one
    assert sharded_checkpoint.committed(root) == [folder_for(root, 4)]
    assert sharded_checkpoint.newest(root, log=lambda m: None) == folder_for(root, 4)
    with pytest.raises(ShardedCheckpointError, match="its save did not finish"):
        sharded_checkpoint.verify(partial)
    assert sharded_checkpoint.discard_partials(root) == [partial] and not partial.exists()


@pytest.mark.slow
def test_the_async_save_writes_the_values_of_before_the_step(tmp_path):
    res = torchrun(WORKERS / "async_prestep.py", 2, [tmp_path], timeout=120, echo=False)
    verdict = json.loads(next(line for line in res.lines if line.startswith("VERDICT "))[8:])
    assert verdict["staged"] == {"before": True, "after": False, "moved": True}, verdict
    # The hazard is real: the step did change the tensors before the write, and an unstaged writer shows it.
    assert verdict["unstaged"] == {"before": False, "after": True, "moved": True}, verdict


@pytest.mark.slow
def test_async_save_needs_a_process_group_of_its_own():
    own = torchrun(WORKERS / "two_threads_one_group.py", 2, ["own"], timeout=60, echo=False)
    assert own.output.count("paired") == 2, own.output
    shared = torchrun(WORKERS / "two_threads_one_group.py", 2, ["shared"], timeout=60, echo=False, check=False)
    assert "failed:" in shared.output and "paired" not in shared.output, shared.output[-2000:]


def _damaged(run2, tmp_path, how):
    folder = shutil.copytree(folder_for(run2, 8), tmp_path / "step_00000008")
    shard = folder / "__0_0.distcp"
    if how == "missing shard":
        shard.unlink()
        return folder, shard, "is missing"
    if how == "truncated shard":
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
        return folder, shard, "is truncated"
    if how == "changed shard":
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
        return folder, shard, "changed after the save"
    if how == "metadata of another save":
        shutil.copy(folder_for(run2, 4) / ".metadata", folder / ".metadata")
        return folder, folder / ".metadata", "comes from another save or another run"
    if how == "shard of another save":
        shutil.copy(shard, folder / "__2_0.distcp")
        return folder, folder / "__2_0.distcp", "a shard from another save"
    if how == "no manifest":
        (folder / "manifest.json").unlink()
        return folder, folder / "manifest.json", "never committed"
    raise AssertionError(how)


DAMAGE = [
    "missing shard",
    "truncated shard",
    "changed shard",
    "metadata of another save",
    "shard of another save",
    "no manifest",
]


@pytest.mark.parametrize("how", DAMAGE)
def test_each_damage_gets_an_error_that_names_the_file(run2, tmp_path, how):
    folder, named, words = _damaged(run2, tmp_path, how)
    with pytest.raises(ShardedCheckpointError) as err:
        sharded_checkpoint.verify(folder)
    assert str(named) in str(err.value) and words in str(err.value), str(err.value)
    with pytest.raises(ShardedCheckpointError, match=words):  # no partial load: the converter refuses it too
        sharded_checkpoint.to_single_file(folder, tmp_path / "out.pt")
    assert not (tmp_path / "out.pt").exists()


def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(run2, tmp_path):
    root = tmp_path / "root"
    for step in (4, 8):
        shutil.copytree(folder_for(run2, step), folder_for(root, step))
    (folder_for(root, 8) / "__1_0.distcp").unlink()
    said = []
    assert sharded_checkpoint.newest(root, log=said.append) == folder_for(root, 4)
    assert "__1_0.distcp is missing" in said[0] and "Falling back" in said[0]


def test_serving_refuses_a_sharded_folder_and_says_how_to_convert(run2, tmp_path):
    for given in (folder_for(run2, 12), run2):
        with pytest.raises(checkpoint.CheckpointError) as err:
            checkpoint.read_checkpoint(given)
        message = str(err.value)
        assert "sharded" in message and f"sharded_checkpoint convert {folder_for(run2, 12)}" in message, message
    folder, named, _ = _damaged(run2, tmp_path, "truncated shard")
    with pytest.raises(checkpoint.CheckpointError, match="cannot be converted as it is") as err:
        checkpoint.read_checkpoint(folder)
    assert str(named) in str(err.value)


def test_the_converted_checkpoint_scores_as_the_model_did_in_training(run2, tmp_path):
    out = sharded_checkpoint.to_single_file(folder_for(run2, 12), tmp_path / "model.pt")
    payload = checkpoint.read_checkpoint(out, task="classify")
    assert payload["metadata"]["converted_from"] == str(folder_for(run2, 12))
    served = served_score.score(out, run2)
    print(served.table())
    assert served.matches, served.table()
    wrong = served_score.score(sharded_checkpoint.to_single_file(folder_for(run2, 4), tmp_path / "early.pt"), run2)
    assert not wrong.matches, "a checkpoint of another step must not pass for the trained one"


def test_the_command_line_verifies_and_converts(run2, tmp_path):
    res = run_script(["-m", "distrinews_lib.sharded_checkpoint", "verify", folder_for(run2, 12)])
    assert res.returncode == 0 and "complete, step 12, saved by 2 rank(s)" in res.stdout, res.stdout + res.stderr
    folder, _, _ = _damaged(run2, tmp_path, "missing shard")
    res = run_script(["-m", "distrinews_lib.sharded_checkpoint", "convert", folder, tmp_path / "x.pt"])
    assert res.returncode == 2 and "is missing" in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_the_global_order_does_not_depend_on_the_world_size():
    import runpy

    lesson = runpy.run_path(str(SCRIPT), run_name="train_sharded")
    sampler = lesson["GlobalOrderSampler"]
    for step in (0, 5, 30):  # step 30 is in the second epoch of 25 steps
        one = sampler(800, 32, 0, 0, 1).indices(step)
        for world in (2, 4):
            parts = [sampler(800, 32, 0, r, world).indices(step) for r in range(world)]
            assert torch.equal(torch.cat(parts), one)
    with pytest.raises(Exception, match="does not split evenly among 3 ranks"):
        sampler(800, 32, 0, 0, 3)


def test_fault_specs_name_a_step_or_a_save():
    assert faults.parse("kill:rank=1:save=2") == {"kind": "kill", "rank": 1, "save": 2}
    assert (
        faults.marker_for(faults.parse("kill:rank=1:save=2"), ["--output", "o"]).name == ".fault_fired_kill_rank1_save2"
    )
    with pytest.raises(Exception, match="not both"):
        faults.parse("kill:step=1:save=1")
    with pytest.raises(Exception, match="counts saves from 1"):
        faults.parse("kill:save=0")


@pytest.mark.slow
def test_the_exercise_checker_passes_the_answer_and_names_each_mistake(run2, tmp_path):
    import inspect

    from distrinews_course.notebook import answer

    files = {"answer": tmp_path / "answer.py", "stub": tmp_path / "stub.py"}
    files["answer"].write_text(textwrap.dedent(inspect.getsource(answer("07_fault_tolerance", "load_resharded", True))))
    files["stub"].write_text("def load_resharded(folder, model, optimizer):\n    raise NotImplementedError\n")
    for name, (text, _) in reshard_exercise.MISTAKES.items():
        files[name] = tmp_path / f"{name.replace(' ', '_')}.py"
        files[name].write_text(text)
    verdicts = reshard_exercise.check_exercises(list(files.values()), folder_for(run2, 8))
    got = {name: verdicts[str(path)] for name, path in files.items()}
    assert got["answer"].ok, got["answer"].mistake
    assert not got["stub"].attempted and not got["stub"].ok
    for name, (_, words) in reshard_exercise.MISTAKES.items():
        assert not got[name].ok and words in got[name].mistake, (name, got[name].mistake)


def test_the_layout_on_disk_is_fsdp2s_cut_of_the_saving_world(run2):
    from distrinews_course import shard_layout

    lay = shard_layout.layout(folder_for(run2, 8))
    manifest = json.loads((folder_for(run2, 8) / "manifest.json").read_text())
    assert lay.files == ["__0_0.distcp", "__1_0.distcp"]
    for f in lay.files:  # the pieces DCP lists cover each file, byte for byte
        assert sum(lay.bytes_by_kind(f).values()) == manifest["files"][f]["bytes"]
    assert lay.saved_by_fsdp2(2) and not lay.saved_by_fsdp2(4) and not lay.saved_by_fsdp2(1)
    fig = shard_layout.plot_layout(lay, load_world=4)
    assert "rank 3" in [t.get_text().split("\n")[0] for t in fig.axes[1].texts]


def test_a_checkpoint_of_another_run_is_refused_naming_what_differs():
    """train_sharded.py resumes only the run that saved the checkpoint: the order of the global batches is drawn
    from the global batch, the seed and the data (distrinews_lib/sharded_run.py)."""
    from distrinews_lib import sharded_run
    from distrinews_lib.errors import UserError

    args = sharded_run.parse_args(["--output", "o", "--seed", "1"])
    assert (args.global_batch, args.steps, args.resume, args.async_save) == (32, 30, "auto", "off")
    same = {"global_batch": 32, "seed": 1, "num_samples": 3200}
    sharded_run.check_same_run("step_00000010", same, args, 3200)
    for wrong, named in (({"seed": 0}, "--seed 0"), ({"global_batch": 16}, "--global_batch 16"), ({}, "3200 texts")):
        with pytest.raises(UserError, match=named):
            sharded_run.check_same_run("step_00000010", {**same, **wrong}, args, 3000 if not wrong else 3200)
