"""Snapshots, exact resume, and surviving a killed rank (CPU, 2 gloo processes, tiny model)."""

import json

import pytest
import torch

from distrinews_course import faults
from distrinews_course.launch import torchrun
from distrinews_lib.data.texts import AG_NEWS_LABELS
from distrinews_lib.errors import UserError
from distrinews_lib.models.build import build_model
from distrinews_lib.training import config, optim, precision, resume, snapshot
from distrinews_lib.training.config import RunConfig
from distrinews_lib.training.tracking import RunTracker

from .helpers import SCRIPTS, run_script

# 320 samples, batch 16, 2 ranks: 10 optimizer steps per epoch; a snapshot every 3 steps.
RUN = [
    "--config",
    "cpu_smoke",
    "--data",
    "synthetic",
    "--epochs",
    "2",
    "--num_samples",
    "320",
    "--eval_samples",
    "64",
    "--batch_size",
    "16",
    "--snapshot_every",
    "3",
    "--resume",
    "auto",
    "--no-progress",
]


def _state(path):
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


@pytest.mark.also_in_notebook
@pytest.mark.slow
def test_sigkill_one_rank_then_restart_ends_bit_identical(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    torchrun(SCRIPTS / "train_ddp.py", 2, [*RUN, "--output", a, "--checkpoint", a / "m.pt"], timeout=180, echo=False)
    res = torchrun(
        faults.WRAPPER,
        2,
        ["kill:rank=1:step=7", SCRIPTS / "train_ddp.py", *RUN, "--output", b, "--checkpoint", b / "m.pt"],
        timeout=240,
        echo=False,
        torchrun_args=["--max-restarts=1"],
    )
    assert "injected fault: kill after step 7" in res.output
    assert "resumed from" in res.output and "snap_e001_b000006.pt" in res.output
    sa, sb = _state(a / "m.pt"), _state(b / "m.pt")
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa), "resumed weights must equal the uninterrupted run's exactly"
    # The resumed epoch's metrics cover the whole epoch (its counters travel in the snapshot), marked as resumed.
    ma, mb = (json.loads((d / "metrics.json").read_text())["epochs"] for d in (a, b))
    untimed = lambda e: {
        k: v
        for k, v in e.items()
        if k not in ("epoch_time_s", "samples_per_s", "tokens_per_s", "resumed", "step_losses")
    }
    assert [untimed(e) for e in ma] == [untimed(e) for e in mb]
    # Each step's loss: a launch records its own steps, so the resumed epoch holds those after the snapshot, and
    # they are the uninterrupted run's last ones, exactly.
    resumed_steps = mb[0]["step_losses"]
    assert (
        0 < len(resumed_steps) < len(ma[0]["step_losses"])
        and ma[0]["step_losses"][-len(resumed_steps) :] == resumed_steps
    )
    assert ma[1]["step_losses"] == mb[1]["step_losses"]
    assert [e["resumed"] for e in mb] == [True, False] and not any(e["resumed"] for e in ma)


def _snapshotter(tmp_path, labels=AG_NEWS_LABELS, model_name="tiny", grad_accum=1):
    cfg = config.parse(
        "t",
        ["--config", "cpu_smoke", "--output", str(tmp_path), "--snapshot_every", "1", "--grad_accum", str(grad_accum)],
    )
    model, _, _ = build_model(RunConfig(model=model_name, seed=0), AG_NEWS_LABELS)
    opt = optim.make_optimizer(model, 1e-3)
    sched = optim.make_scheduler(opt, 10)
    scaler = precision.make_grad_scaler(precision.resolve_amp("off", torch.device("cpu")), torch.device("cpu"))
    tracker = RunTracker(tmp_path, {}, data={}, ddp={}, model={}, enabled=False)
    snap = snapshot.Snapshotter(
        cfg,
        model=model,
        optimizer=opt,
        scheduler=sched,
        scaler=scaler,
        tracker=tracker,
        label_names=labels,
        log=lambda m: None,
    )
    return snap, model


def _resume(snap, tmp_path):
    return snap.resume(resume.choose(tmp_path, "auto", log=lambda m: None))


def test_interrupted_save_leaves_the_previous_snapshot_loadable(tmp_path, monkeypatch):
    snap, _ = _snapshotter(tmp_path)
    first = snap.save(1, 4, None)
    real_save = torch.save

    def crash(obj, f, *a, **k):  # the process dies halfway through writing
        f.write(b"PK\x03\x04 half a zip")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        snap.save(1, 8, None)
    monkeypatch.setattr(torch, "save", real_save)
    assert snapshot.list_snapshots(tmp_path) == [first]
    assert snapshot.read_snapshot(first)["batches_done"] == 4
    assert not list((tmp_path / "snapshots").glob("*.tmp"))


def test_snapshot_of_another_label_set_is_refused(tmp_path):
    snap, _ = _snapshotter(tmp_path)
    snap.save(2, 0, None)
    other, _ = _snapshotter(tmp_path, labels=["A", "B", "C", "D"])
    with pytest.raises(UserError, match="does not fit this run.*labels"):
        _resume(other, tmp_path)
    accum, _ = _snapshotter(tmp_path, grad_accum=4)
    with pytest.raises(UserError, match="does not fit this run.*--grad_accum: snapshot 1, run 4"):
        _resume(accum, tmp_path)


def test_resume_restores_every_rng_and_the_position(tmp_path):
    import random

    snap, model = _snapshotter(tmp_path)
    snap.global_step = 5
    meter = {
        "loss_sum": 3.5,
        "samples": 80,
        "tokens": 900,
        "padded": 1000,
        "sum_sq": 12000,
        "steps": 5,
        "batches": 5,
        "seconds": 1.25,
    }
    snap.save(1, 5, meter)
    expected = (random.random(), torch.rand(1).item())
    random.random(), torch.rand(3)  # move on
    fresh, _ = _snapshotter(tmp_path)
    start = _resume(fresh, tmp_path)
    assert (start.epoch, start.skip(1), start.skip(2), fresh.global_step) == (1, 5, 0, 5)
    assert start.meter_state(1) == meter and start.meter_state(2) is None  # and asking twice changes nothing
    assert start.skip(1) == 5
    assert (random.random(), torch.rand(1).item()) == expected


def test_fault_specs_are_checked():
    assert faults.parse("kill:rank=1:step=7") == {"kind": "kill", "rank": 1, "step": 7}
    for bad, words in (
        ("kill:rank=x", "rank=R, step=N or save=N"),
        ("explode", "unknown kind"),
        ("hang:step=0", "from 1"),
    ):
        with pytest.raises(UserError, match=words):
            faults.parse(bad)


def test_a_fault_fires_once_per_run_even_on_a_fresh_agent(tmp_path):
    """A replacement node's agent starts with TORCHELASTIC_RESTART_COUNT=0 again: the marker in the (shared) --output
    folder is what keeps the fault from firing a second time there."""
    steps = tmp_path / "steps.py"  # a stand-in for the training script: 4 optimizer steps, takes --output like it
    steps.write_text(
        "import torch\nw = torch.nn.Parameter(torch.zeros(1))\nopt = torch.optim.SGD([w], lr=0.1)\n"
        "for _ in range(4):\n    w.sum().backward()\n    opt.step()\nprint('finished 4 steps')\n"
    )

    def run(output):  # rank 0 of a fresh agent: restart count 0
        return run_script(
            [faults.WRAPPER, "raise:rank=0:step=2", steps, "--output", output],
            timeout=120,
            env={"RANK": "0", "TORCHELASTIC_RESTART_COUNT": "0"},
        )

    first = run(tmp_path / "run")
    assert first.returncode != 0 and "injected fault: raise after step 2" in first.stdout
    assert (tmp_path / "run" / ".fault_fired_raise_rank0_step2").is_file()
    again = run(tmp_path / "run")  # the same run, as a fresh agent would start it
    assert again.returncode == 0 and "finished 4 steps" in again.stdout, again.stdout + again.stderr
    assert "already fired in this run" in again.stdout and "injected fault" not in again.stdout
    other = run(tmp_path / "other")  # another run: it fires there
    assert other.returncode != 0 and "injected fault: raise after step 2" in other.stdout


@pytest.mark.also_in_notebook
@pytest.mark.slow
def test_truncated_newest_snapshot_falls_back_to_the_previous_one(tmp_path):
    args = [
        "--config",
        "cpu_smoke",
        "--data",
        "synthetic",
        "--num_samples",
        "160",
        "--eval_samples",
        "32",
        "--batch_size",
        "16",
        "--snapshot_every",
        "4",
        "--no-progress",
        "--output",
        tmp_path,
        "--checkpoint",
        tmp_path / "m.pt",
    ]
    r = run_script([SCRIPTS / "train_single.py", *args, "--epochs", "1"])
    assert r.returncode == 0, r.stderr
    snaps = snapshot.list_snapshots(tmp_path)
    assert len(snaps) == 2
    newest = snaps[-1]
    newest.write_bytes(newest.read_bytes()[:1000])  # truncated on disk
    r = run_script([SCRIPTS / "train_single.py", *args, "--epochs", "2", "--resume", "auto"])
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert f"snapshot {newest} is unreadable" in out and "Falling back to the previous snapshot" in out
    assert f"resumed from {snaps[-2]}" in out


@pytest.mark.also_in_notebook
@pytest.mark.slow
def test_resume_from_two_processes_on_one(tmp_path):
    args = [*RUN, "--output", tmp_path, "--checkpoint", tmp_path / "m.pt"]
    torchrun(
        SCRIPTS / "train_ddp.py",
        2,
        [*args[: args.index("--epochs") + 1], "1", *args[args.index("--epochs") + 2 :]],
        timeout=180,
        echo=False,
    )
    r = run_script([SCRIPTS / "train_ddp.py", *args])  # plain python: a world of one process
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert "taken with 2 process(es), this run has 1" in out and "data order changes" in out
    assert "epoch 2/2" in out and (tmp_path / "m.pt").is_file()
    # the LR schedule continued from the same point in *samples*: it ends at zero, as planned
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["epochs"][-1]["lr"] == pytest.approx(0.0, abs=1e-12)


@pytest.mark.slow
def test_a_rank_that_skips_collectives_fails_within_the_timeout(tmp_path):
    # Without the collective timeout rank 0 would wait forever, so ending on its own before the launch's limit
    # proves the timeout fired; no wall-clock bound that a slow machine could miss. The test waits it out whole: 5 s,
    # chapter 07's own hang demo's, far above the few seconds' lag between healthy ranks of this small synthetic run.
    res = torchrun(
        faults.WRAPPER,
        2,
        [
            "hang:rank=1:step=2",
            SCRIPTS / "train_ddp.py",
            *RUN,
            "--ddp_timeout",
            "5",
            "--output",
            tmp_path,
            "--checkpoint",
            tmp_path / "m.pt",
        ],
        timeout=240,
        echo=False,
        check=False,
    )
    assert res.returncode != 0 and not res.timed_out, "the ranks hung past the launch's limit"
    text = " ".join(res.output.split())
    assert "could not complete" in text and "skipped a collective" in text


@pytest.mark.slow
def test_a_crashing_rank_shows_its_root_cause(tmp_path):
    res = torchrun(
        faults.WRAPPER,
        2,
        [
            "raise:rank=1:step=2",
            SCRIPTS / "train_ddp.py",
            *RUN,
            "--ddp_timeout",
            "20",
            "--output",
            tmp_path,
            "--checkpoint",
            tmp_path / "m.pt",
        ],
        timeout=120,
        echo=False,
        check=False,
    )
    assert res.returncode != 0
    assert "Root Cause" in res.output and "injected failure on rank 1 after step 2" in res.output


def test_a_quoted_error_cut_mid_word_is_shown_in_whole_sentences():
    gloo = (
        "error: [rank 0] a collective operation could not complete (uneven numbers of batches per rank, a rank stuck "
        "in I/O). Look above. ([/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
        "[127.0.0.1]:27011: Connection reset by peer. This is typically caused by a rem)"
    )
    lines = faults.tidy(["before", *__import__("textwrap").wrap(gloo, 100, subsequent_indent="       "), "after"])
    text = " ".join(x.strip() for x in lines)
    assert lines[0] == "before" and lines[-1] == "after" and all(len(x) <= 100 for x in lines)
    assert text.endswith("Connection reset by peer. …) after") and "a rem" not in text
    assert "(uneven numbers of batches per rank, a rank stuck in I/O)" in text  # no full stop inside: kept whole
    assert faults.whole_words("val acc 53.50% (400 texts)") == "val acc 53.50% (400 texts)"
    assert faults.whole_words("(" + "x" * 70 + ". done.)") == "(" + "x" * 70 + ". done.)"
