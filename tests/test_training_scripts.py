"""The two training scripts as a user runs them: end to end, and every bad input refused clearly."""

import json

import pytest
import torch

from distrinews_course.launch import torchrun
from distrinews_lib.serving import inference
from distrinews_lib.training import epochs, optim

from .helpers import AG_NEWS, SCRIPTS, run_script

SMALL = ["--config", "cpu_smoke", "--epochs", "1", "--num_samples", "400", "--eval_samples", "101", "--no-progress"]


@pytest.mark.slow
def test_single_process_run_on_synthetic_data(tmp_path):
    ck = tmp_path / "ck" / "m.pt"
    r = run_script(
        [SCRIPTS / "train_single.py", *SMALL, "--data", "synthetic", "--output", tmp_path / "run", "--checkpoint", ck]
    )
    assert r.returncode == 0, r.stderr
    assert "data: synthetic" in r.stdout and "SYNTHETIC" in r.stdout
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["data"]["is_synthetic"] is True and m["ddp"]["world_size"] == 1
    assert len(m["epochs"]) == 1 and m["epochs"][0]["val_examples"] == 101
    csv_lines = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    assert csv_lines[0].startswith("epoch,train_loss,val_loss,val_accuracy,val_perplexity,epoch_time_s,samples_per_s")
    assert len(csv_lines) == 2
    loaded = inference.load_checkpoint(ck)
    assert loaded.metadata["data_source"] == "synthetic" and loaded.metadata["world_size"] == 1
    assert "tokenizer_files" in inference.read_checkpoint(ck)


@pytest.mark.slow
def test_ddp_run_two_gloo_processes(tmp_path):
    ck = tmp_path / "m.pt"
    res = torchrun(
        SCRIPTS / "train_ddp.py",
        2,
        [*SMALL, "--data", "synthetic", "--output", tmp_path / "run", "--checkpoint", ck, "--grad_accum", "2"],
        timeout=240,
        echo=False,
    )
    assert "world size 2 | gloo" in res.output
    assert "parameters identical on all 2 ranks: True" in res.output
    assert res.output.count("saved ") == 1  # rank 0 alone writes
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["ddp"]["world_size"] == 2 and m["ddp"]["backend"] == "gloo"
    assert m["aggregates"]["params_max_difference"] == 0.0
    assert m["epochs"][0]["train_samples"] == 400  # the shards together cover the subset once
    raw = inference.read_checkpoint(ck)
    assert not any(k.startswith("module.") for k in raw["state_dict"])
    assert raw["metadata"]["world_size"] == 2


@pytest.mark.slow
def test_offline_without_a_data_folder_it_trains_on_the_embedded_real_sample(tmp_path):
    r = run_script(
        [SCRIPTS / "train_single.py", *SMALL, "--output", tmp_path / "run", "--checkpoint", tmp_path / "m.pt"],
        env={"DISTRINEWS_DATA_DIR": "", "HF_HUB_OFFLINE": "1"},
    )
    assert r.returncode == 0, r.stderr
    assert "plan (decided on" in r.stdout and "data embedded" in r.stdout and "SYNTHETIC" not in r.stdout
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["data"]["source"] == "embedded" and m["data"]["title"] == "AG News (embedded real sample)"
    assert inference.load_checkpoint(tmp_path / "m.pt").metadata["data_source"] == "embedded"


@pytest.mark.slow
def test_a_loss_that_turns_nan_stops_the_run_without_saving(tmp_path):
    r = run_script(
        [
            SCRIPTS / "train_single.py",
            *SMALL,
            "--data",
            "synthetic",
            "--lr",
            "1e30",
            "--snapshot_every",
            "2",
            "--output",
            tmp_path / "run",
            "--checkpoint",
            tmp_path / "m.pt",
        ]
    )
    assert r.returncode == 2, r.stdout + r.stderr
    text = " ".join(r.stderr.split())
    assert "became NaN or infinite at optimizer step" in text and "--lr" in text and "Traceback" not in text
    assert not (tmp_path / "m.pt").exists() and not (tmp_path / "run" / "snapshots").exists()


@pytest.mark.also_in_notebook
@pytest.mark.slow
@pytest.mark.skipif(not AG_NEWS.is_dir(), reason=f"real AG News not present at {AG_NEWS}")
def test_tiny_model_on_real_ag_news_beats_chance(tmp_path):
    r = run_script(
        [
            SCRIPTS / "train_single.py",
            "--config",
            "cpu_smoke",
            "--data",
            AG_NEWS,
            "--epochs",
            "2",
            "--num_samples",
            "3000",
            "--eval_samples",
            "1000",
            "--no-progress",
            "--output",
            tmp_path / "run",
            "--checkpoint",
            tmp_path / "m.pt",
        ],
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["data"]["source"] == "folder" and not m["data"]["is_synthetic"]
    assert m["aggregates"]["final_val_accuracy"] > 0.50  # chance is 0.25


def _bad_csv_folder(tmp_path, row):
    good = '"1","Peace talks","Diplomats met"\n"2","Cup final","Team won"\n'
    (tmp_path / "train.csv").write_text(good + row)
    (tmp_path / "test.csv").write_text(good)
    return tmp_path


BAD_INPUTS = {
    "missing data folder": (["--data", "/nonexistent/ag_news"], "data folder /nonexistent/ag_news does not exist"),
    "malformed row": (["--data", "{malformed}"], "train.csv, line 3: expected 3 fields"),
    "label outside 1..4": (["--data", "{label}"], "line 3: class 7 is outside 1..4"),
    "model not loadable offline": (["--model", "someone/not-a-model"], "could not load model 'someone/not-a-model'"),
    "fp16 on CPU": (["--amp", "fp16"], "--amp fp16 needs a CUDA GPU"),
    "unknown preset": (["--config", "huge"], "no such preset"),
    "zero epochs": (["--epochs", "0"], "--epochs must be at least 1"),
    "infinite learning rate": (["--lr", "inf"], "--lr must be a positive finite number"),
    "unknown data source": (["--data", "hubb"], "data folder hubb does not exist"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_gives_a_clear_message_and_exit_2(case, tmp_path):
    args, expected = BAD_INPUTS[case]
    rows = {"{malformed}": '"3","two fields"\n', "{label}": '"7","Title","Text"\n'}
    args = [str(_bad_csv_folder(tmp_path, rows[a])) if a in rows else a for a in args]
    r = run_script(
        [
            SCRIPTS / "train_single.py",
            "--config",
            "cpu_smoke",
            "--data",
            "synthetic",
            *args,
            "--output",
            tmp_path / "run",
            "--checkpoint",
            tmp_path / "m.pt",
        ],
        timeout=120,
        env={"HF_HUB_OFFLINE": "1"},
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert expected in " ".join(r.stderr.split()), r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "m.pt").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_nccl_without_gpus_is_refused_by_the_ddp_script(tmp_path):
    r = run_script(
        [
            SCRIPTS / "train_ddp.py",
            "--config",
            "cpu_smoke",
            "--backend",
            "nccl",
            "--data",
            "synthetic",
            "--output",
            tmp_path / "run",
            "--checkpoint",
            tmp_path / "m.pt",
        ],
        timeout=120,
    )
    assert r.returncode == 2
    assert "--backend nccl needs NVIDIA GPUs" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_nccl_under_torchrun_fails_fast_with_the_message(tmp_path):
    res = torchrun(
        SCRIPTS / "train_ddp.py",
        2,
        ["--config", "cpu_smoke", "--backend", "gloo", "--data", "synthetic", "--amp", "fp16"],
        timeout=120,
        echo=False,
        check=False,
    )
    assert res.returncode != 0 and not res.timed_out
    assert "--amp fp16 needs a CUDA GPU" in " ".join(res.output.split())
    assert res.output.count("error: --amp fp16") == 1  # rank 0 explains; rank 1 says one short line


def test_the_launcher_refuses_more_nccl_ranks_than_gpus():
    from distrinews_lib.errors import UserError

    with pytest.raises(UserError, match="nccl"):
        torchrun(SCRIPTS / "train_ddp.py", torch.cuda.device_count() + 1, ["--backend", "nccl"], echo=False)


def test_the_training_loop_is_in_the_scripts():
    names = [n for m in (epochs, optim) for n in vars(m) if "train" in n.lower() and callable(getattr(m, n))]
    assert not names, f"the loop belongs in the scripts, where a learner reads it: {names}"
    for name in ("train_single.py", "train_ddp.py"):
        text = (SCRIPTS / name).read_text()
        for step in (
            "with amp.autocast(device):",
            "out = model(input_ids=",
            "loss = out.loss",
            ".backward()",
            "scaler.unscale_(optimizer)",
            "clip_grad_norm_(",
            "scaler.step(optimizer)",
            "scheduler.step()",
            "optimizer.zero_grad(set_to_none=True)",
            "epochs.accumulate(train_loader, cfg.grad_accum",
        ):
            assert step in text, f"{name}: {step}"


def test_ddp_script_reads_as_a_small_diff_of_the_single_script():
    from distrinews_course.notebook import script_diff

    d = script_diff(SCRIPTS / "train_single.py", SCRIPTS / "train_ddp.py")
    assert d.added <= 38 and d.removed <= 15, f"{d.added} added, {d.removed} removed"
    # the DDP essentials are in the script itself, not hidden in the library
    text = (SCRIPTS / "train_ddp.py").read_text()
    for essential in (
        "dist.init_process_group(backend, init_method=init_method",
        "D.torchrun_env()",
        "DDP(model",
        "DistributedSampler(run.train_ds",
        "sampler.set_epoch(epoch)",
        "if rank == 0:",
        "dist.broadcast_object_list(run_plan, src=0)",
        "model.no_sync()",
        "dist.destroy_process_group()",
        "finally:",
    ):
        assert essential in text, essential
