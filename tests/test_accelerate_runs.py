"""Chapter 09's claims (distrinews_course.accelerate_runs, batch_sharding), on run folders written here in the
formats the training scripts write (metrics.json, model.pt, TensorBoard event files): each claim holds on two runs
that agree, and a wrong figure makes it fail. Fast: no launch (tests/test_beyond_ddp.py launches the real pair)."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import matplotlib
import pytest
import torch

from distrinews_course import accelerate_runs as A
from distrinews_course import batch_sharding as B

matplotlib.use("Agg")
EPOCHS, STEPS = 2, 5  # optimizer steps per epoch


def _write_run(folder, *, weights, metrics, step_losses=None, epoch_logs=None):
    """One run's folder as train_ddp.py (step_losses) or train_accelerate.py (epoch_logs) leaves it."""
    from torch.utils.tensorboard import SummaryWriter

    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps(metrics))
    torch.save({"state_dict": weights}, folder / "model.pt")
    if step_losses is not None:  # train_ddp.py's RunTracker: every step's loss, each epoch's figures at its last step
        with SummaryWriter(str(folder / "tensorboard")) as w:
            for s, v in enumerate(step_losses, 1):
                w.add_scalar("train/loss_step", v, s)
            for e in metrics["epochs"]:
                w.add_scalar("train/loss", e["train_loss"], e["epoch"] * STEPS)
                w.add_scalar("val/accuracy", e["val_accuracy"], e["epoch"] * STEPS)
    if epoch_logs is not None:  # Accelerate's tracker: <project_dir>/distrinews/, one value per epoch
        with SummaryWriter(str(folder / "distrinews")) as w:
            for epoch, logs in enumerate(epoch_logs, 1):
                for tag, v in logs.items():
                    w.add_scalar(tag, v, epoch)


def _metrics(accuracies=(0.43, 0.47), losses=(1.3169, 0.9063), examples=401):
    epochs = [
        dict(epoch=i + 1, train_loss=l, val_accuracy=a, val_examples=examples, optimizer_steps=STEPS)
        for i, (a, l) in enumerate(zip(accuracies, losses))
    ]
    return {"epochs": epochs, "data": {"title": "AG News (test)"}}


def _pair(tmp_path, *, acc_metrics=None, acc_weights=None, acc_logs=None, ddp_steps=None):
    torch.manual_seed(0)
    w = {"a": torch.randn(4, 4), "b": torch.randn(4)}
    m = _metrics()
    logs = [{"train/loss": e["train_loss"], "val/accuracy": e["val_accuracy"]} for e in m["epochs"]]
    steps = ddp_steps if ddp_steps is not None else [1.4 - 0.05 * s for s in range(EPOCHS * STEPS)]
    _write_run(tmp_path / "ddp", weights=w, metrics=m, step_losses=steps)
    _write_run(
        tmp_path / "acc",
        weights=acc_weights or copy.deepcopy(w),
        metrics=acc_metrics or m,
        epoch_logs=acc_logs or logs,
    )
    return A.TrainingPair(tmp_path / "ddp", tmp_path / "acc")


def _failed(claims):
    return [claim for ok, claim in claims if not ok]


def test_two_runs_that_agree_pass_every_claim(tmp_path):
    pair = _pair(tmp_path)
    assert pair.gap == 0.0 and not _failed(pair.claims(401)) and not _failed(pair.tracking_claims())
    assert "largest weight difference between the two trained models: 0.0" in pair.table()
    fig = pair.tracking_figure()
    assert len(fig.axes) == 2 and len(fig.axes[0].lines) == 2


def test_a_weight_off_by_one_rounding_fails_bit_for_bit(tmp_path):
    torch.manual_seed(0)
    w = {"a": torch.randn(4, 4), "b": torch.randn(4)}
    w["b"][0] = torch.nextafter(w["b"][0], torch.tensor(10.0))  # one float one step away
    pair = _pair(tmp_path, acc_weights=w)
    assert 0 < pair.gap < 1e-6 and any("bit for bit" in c for c in _failed(pair.claims(401)))


@pytest.mark.parametrize(
    "wrong,words",
    [
        (dict(losses=(1.3169, 0.9064)), "the same training loss"),
        (dict(examples=402), "both counted 401 held-out texts"),
        (dict(examples=400), "both counted 401 held-out texts"),
    ],
)
def test_a_run_that_differs_fails_its_claim(tmp_path, wrong, words):
    pair = _pair(tmp_path, acc_metrics=_metrics(**wrong))
    assert any(words in c for c in _failed(pair.claims(401)))


def test_a_run_that_did_not_learn_fails(tmp_path):
    pair = _pair(tmp_path)
    pair.metrics["ddp"]["epochs"][-1]["val_accuracy"] = 0.26
    assert any("the runs learned" in c for c in _failed(pair.claims(401)))


def test_the_tracking_claims_fail_on_a_wrong_figure(tmp_path):
    lost_a_step = _pair(tmp_path / "one", ddp_steps=[1.0] * (EPOCHS * STEPS - 1))
    assert any("all 10 optimizer steps" in c for c in _failed(lost_a_step.tracking_claims()))
    m = _metrics()
    logs = [{"train/loss": e["train_loss"], "val/accuracy": e["val_accuracy"] + 0.01} for e in m["epochs"]]
    other = _pair(tmp_path / "two", acc_logs=logs)
    assert any("Accelerate's own tracker" in c for c in _failed(other.tracking_claims()))
    drifted = _pair(tmp_path / "three")
    drifted.metrics["ddp"]["epochs"][0]["val_accuracy"] = 0.44  # metrics.json and the event file disagree
    assert any("metrics.json's" in c for c in _failed(drifted.tracking_claims()))


def test_the_launch_claims_and_notes():
    ok = SimpleNamespace(ranks=2, output="preset cpu_smoke | world size 2 | ...", lines=["epoch 1/2"])
    assert not _failed(A.launch_claims(ok, 2)) and A.deepspeed_notice(ok) is None
    one = SimpleNamespace(ranks=1, output="preset cpu_smoke | world size 1 | ...", lines=[])
    assert len(_failed(A.launch_claims(one, 2))) == 1
    warned = SimpleNamespace(lines=["[WARNING] [real_accelerator.py] Setting accelerator to CPU. If you have GPU"])
    assert "1x" in A.deepspeed_notice(warned)
    assert A.key_lines("epoch 1/2 | train loss") and not A.key_lines("[WARNING] x")


def test_a_gap_prediction_is_judged_in_one_line(capsys):
    assert A.judge_gap_prediction(None, 0.0) is None
    assert A.judge_gap_prediction(0.0, 0.0) is True and A.judge_gap_prediction(1e-7, 0.0) is False
    assert A.judge_gap_prediction("0", 0.0) is None and "write a number" in capsys.readouterr().out


def test_the_two_shardings_hold_the_same_global_batches_split_differently():
    shares = B.rank_batches(n=16, world=2, global_batch=8)
    sampler, prepared = shares[B.SAMPLER], shares[B.PREPARED]
    assert sampler[0] == [[0, 2, 4, 6], [8, 10, 12, 14]] and prepared[0] == [[0, 1, 2, 3], [8, 9, 10, 11]]
    assert B.same_global_batches(shares)[0]
    moved = copy.deepcopy(shares)  # an example of step 2 trained in step 1: not the same global batch any more
    moved[B.PREPARED][1][0][-1], moved[B.PREPARED][1][1][0] = 12, 7
    assert not B.same_global_batches(moved)[0]
    same = {B.SAMPLER: sampler, B.PREPARED: copy.deepcopy(sampler)}  # no difference to show
    assert not B.same_global_batches(same)[0]
    assert len(B.sharding_figure(shares).axes[0].patches) == 2 * 16


def test_step_diff_sets_the_two_scripts_steps_side_by_side(tmp_path):
    text, removed, added = A.step_diff()
    lines = text.splitlines()
    assert any(x.startswith("- ") and "no_sync" in x for x in lines)  # train_ddp.py's by hand...
    assert any(x.startswith("+ ") and "accelerator.backward(loss)" in x for x in lines)  # ...Accelerate's call
    assert "~         scheduler.step()  # train_ddp.py: under `if scaler.get_scale() >= scale:`" in lines
    assert any(x.startswith("~ ") and "zero_grad" in x for x in lines)  # once a step there, every micro-batch here
    source = open("scripts/train_accelerate.py").read()  # a script that zeroes once a step, as train_ddp.py does
    once = tmp_path / "once.py"
    once.write_text(
        source.replace("\n                optimizer.zero_grad(set_to_none=True)", "").replace(
            "            run.record(", "            optimizer.zero_grad(set_to_none=True)\n            run.record("
        )
    )
    moved_back = A.step_diff(accelerate=once)[0].splitlines()
    assert "      optimizer.zero_grad(set_to_none=True)" in moved_back  # the same line under the same blocks
    assert any(x.startswith("~ ") and "scheduler.step()" in x for x in moved_back)
    assert removed == sum(x.startswith("- ") for x in lines) and added == sum(x.startswith("+ ") for x in lines)
    edited = tmp_path / "train_accelerate.py"  # a script whose loop was renamed: the markers are not found
    edited.write_text("for batch in loader:\n    pass\n")
    with pytest.raises(ValueError, match="was the script edited"):
        A.step_diff(accelerate=edited)


def test_step_summary_credits_run_not_accelerate_with_the_lines_that_moved_into_it(tmp_path):
    text, removed, added = A.step_diff()
    said = A.step_summary(text, removed, added)
    assert f"{removed} lines of train_ddp.py became {added}" in said
    assert f"7 of the {removed} (" in said and "went into the course's Run" in said  # the accumulate loop, 4 calls
    for call in ("epochs.accumulate", "epochs.to_device", "meter.add", "meter.step", "snap.step"):
        assert call in said
    assert "no_sync" not in said  # what Accelerate replaced is not credited to Run
    source = open("distrinews_lib/accelerate_run.py").read()
    assert "self.snap.step(" in source
    mutant = tmp_path / "accelerate_run.py"  # a Run whose record() no longer makes the snapshot call
    mutant.write_text(source.replace("self.snap.step(", "print("))
    fewer = A.step_summary(text, removed, added, run_py=mutant)
    assert f"6 of the {removed} (" in fewer and "snap.step" not in fewer


def test_the_short_last_group_is_run_both_ways_and_a_wrong_figure_fails():
    real = A.short_last_group(micro_batches=4, grad_accum=3, epochs=2)  # a real Accelerator, in this process
    third = pytest.approx(1 / 3, abs=1e-6)
    assert real.groups == [[3, 1], [3, 1]]
    assert real.accelerate_steps == [
        [(1, 1, third), (1, 2, third), (1, 3, third)],
        [(1, 4, third), (2, 1, third), (2, 2, third)],
    ]
    assert real.left == [(2, 3, third), (2, 4, third)] and not _failed(real.claims())
    table = real.table()
    assert "step 2: epoch 1's 4 + epoch 2's 1, 2 (1/3 each)" in table and "never stepped: epoch 2's 3, 4" in table

    def wrong(**change):
        return _failed(A.ShortGroup(**{**vars(real), **change}).claims())

    e1, e2 = [(1, k, 1 / 3) for k in (1, 2, 3)], [(2, k, 1 / 3) for k in (1, 2, 3)]
    reset = [e1, [(1, 4, 1 / 3)], e2, [(2, 4, 1 / 3)]]  # Accelerate restarting its count each epoch
    assert len(wrong(accelerate_steps=reset, left=[])) == 1
    summed = [[(e, k, 1.0) for e, k, _ in s] for s in real.accelerate_steps]
    assert len(wrong(accelerate_steps=summed)) == 1  # ...or not dividing by grad_accum
    assert len(wrong(left=[])) == 1  # ...or stepping on the leftover
    assert len(wrong(groups=[[3], [3, 1]])) == 1  # train_ddp.py dropping or carrying the short group
    assert len(wrong(groups=[[3, 1]])) == 1  # ...or one epoch only
    even = A.short_last_group(micro_batches=6, grad_accum=3, epochs=2)  # no short group: nothing to show
    assert len(_failed(even.claims())) == 2


def test_the_launcher_claim_holds_only_for_identical_weights():
    assert A.same_launch_claim(0.0)[0]
    held, said = A.same_launch_claim(1e-7)
    assert not held and "1e-07" in said


def test_the_wandb_upload_command_is_judged(capsys):
    from distrinews_course.accelerate_exercises import judge_wandb_upload

    assert judge_wandb_upload(None, "out/wandb/offline-run-1") is None
    assert "wandb sync out/wandb/offline-run-1" in capsys.readouterr().out
    assert judge_wandb_upload("wandb sync out/wandb/offline-run-1", "out/wandb/offline-run-1") is True
    assert judge_wandb_upload("wandb upload out", "out/wandb/offline-run-1") is False


def test_the_typed_command_drops_the_course_plumbing():
    import sys
    from pathlib import Path

    from distrinews_course.launch import _PARENT_DEATH_SHIM, HARDEN, typed_command

    def shimmed(*cmd):
        return [sys.executable, "-c", _PARENT_DEATH_SHIM, "4242", sys.executable, *cmd]

    acc = shimmed(
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        f"{Path.cwd()}/configs/a.yaml",
        "--num_processes",
        "2",
        "-m",
        HARDEN,
        "scripts/train_accelerate.py",
        "--epochs",
        "2",
    )
    assert typed_command(acc) == (
        "accelerate launch --config_file configs/a.yaml --num_processes 2 scripts/train_accelerate.py --epochs 2"
    )
    tr = shimmed("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", HARDEN, "scripts/t.py")
    assert typed_command(tr) == "torchrun --standalone --nproc_per_node=2 scripts/t.py"
    assert typed_command([sys.executable, "-m", "distrinews_lib.serving", "--port", "1"]) == (
        "python -m distrinews_lib.serving --port 1"
    )
    for shown in (typed_command(acc), typed_command(tr)):
        assert "prctl" not in shown and "4242" not in shown and HARDEN not in shown and sys.executable not in shown
