"""Chapter 09's machinery: Accelerate trains what train_ddp.py trains (and its launch is counted), ZeRO-1 and
FSDP2 (and DeepSpeed where installed) end with DDP's weights while holding less, and the experiment trackers
really write their files."""

import json

import pytest
import torch

from distrinews_course.launch import LaunchError, accelerate_launch, run_python, torchrun
from distrinews_course.plots import load_metrics, read_tensorboard
from distrinews_lib.data.texts import AG_NEWS_LABELS
from distrinews_lib.models.build import build_model
from distrinews_lib.training.config import RunConfig

from .helpers import SCRIPTS


def _weights(path):
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


@pytest.fixture(scope="module")
def same_runs(tmp_path_factory):
    """train_ddp.py (torchrun) and train_accelerate.py (accelerate launch): same seed, data, global batch."""
    tmp = tmp_path_factory.mktemp("accelerate")
    model, tok, _ = build_model(RunConfig(model="tiny", seed=3), AG_NEWS_LABELS)
    for key in ("dropout", "attention_dropout", "seq_classif_dropout"):
        setattr(model.config, key, 0.0)
    model.save_pretrained(tmp / "model")
    tok.save_pretrained(tmp / "model")
    same = [
        "--config",
        "cpu_smoke",
        "--model",
        tmp / "model",
        "--num_samples",
        640,
        "--eval_samples",
        101,
        "--epochs",
        1,
        "--batch_size",
        16,
        "--lr",
        2e-3,
        "--no-group_by_length",
        "--no-progress",
        "--threads",
        1,
    ]
    torchrun(
        SCRIPTS / "train_ddp.py",
        2,
        [*same, "--output", tmp / "ddp", "--checkpoint", tmp / "ddp.pt"],
        echo=False,
        timeout=240,
    )
    acc = accelerate_launch(
        SCRIPTS / "train_accelerate.py",
        2,
        [*same, "--report_to", "tensorboard", "--output", tmp / "acc", "--checkpoint", tmp / "acc.pt"],
        echo=False,
        timeout=240,
    )
    return tmp, acc, build_model(RunConfig(model=str(tmp / "model")), AG_NEWS_LABELS)[0].state_dict()


# Chapter 09 asserts all of it under nbval, with dropout on: accelerate launch ran N processes, the weights of
# train_ddp.py bit for bit, the same training loss, each of 401 held-out texts counted once (section 1,
# accelerate_runs), its TensorBoard tracker's files (section 2), and the server answering with the checkpoint
@pytest.mark.also_in_notebook
@pytest.mark.slow
def test_accelerate_trains_the_same_weights_as_the_ddp_script(same_runs):
    tmp, acc, init = same_runs
    assert acc.ranks == 2
    a, b = _weights(tmp / "ddp.pt"), _weights(tmp / "acc.pt")
    gap = max(float((a[k] - b[k]).abs().max()) for k in a)
    moved = max(float((a[k] - init[k]).abs().max()) for k in a)
    # Both scripts shard with DistributedSampler: every rank sums the same gradients, so the weights are identical.
    assert moved > 1e-3 and gap == 0.0, (gap, moved)
    la, lb = load_metrics(tmp / "ddp")["epochs"][0], load_metrics(tmp / "acc")["epochs"][0]
    assert la["train_loss"] == lb["train_loss"] and la["val_examples"] == lb["val_examples"] == 101
    assert list((tmp / "acc").rglob("events.out.tfevents.*")), "Accelerate's TensorBoard tracker wrote its files"


@pytest.mark.also_in_notebook
@pytest.mark.slow
def test_the_accelerate_checkpoint_serves_unchanged(same_runs):
    from fastapi.testclient import TestClient

    from distrinews_lib.serving.app import create_app
    from distrinews_lib.serving.settings import ServingSettings

    tmp, _, _ = same_runs
    with TestClient(create_app(ServingSettings(checkpoint=str(tmp / "acc.pt")))) as client:
        assert client.get("/health").json()["checkpoint"]["world_size"] == 2
        answer = client.post("/predict", json={"text": "The team won the cup final"}).json()
    assert answer["label"] in ("World", "Sports", "Business", "Sci/Tech") and 0 < answer["confidence"] <= 1


@pytest.mark.slow
def test_an_accelerate_launch_that_starts_fewer_processes_fails_loudly(tmp_path):
    one_process = tmp_path / "cpu.yaml"  # what `accelerate launch --cpu --num_processes 2` amounts to here
    one_process.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nnum_machines: 1\n"
        "num_processes: 2\nmachine_rank: 0\nuse_cpu: true\nmixed_precision: 'no'\n"
    )
    with pytest.raises(LaunchError, match="ran 1 rank.*not 2"):
        accelerate_launch(
            SCRIPTS / "train_accelerate.py",
            2,
            [
                "--config",
                "cpu_smoke",
                "--num_samples",
                64,
                "--eval_samples",
                16,
                "--epochs",
                1,
                "--no-progress",
                "--output",
                tmp_path / "run",
                "--checkpoint",
                tmp_path / "m.pt",
            ],
            config_file=one_process,
            echo=False,
            timeout=240,
        )


# Chapter 06 asserts all of it under nbval on the same script: every run ends with DDP's weights (section 4), DDP
# holds exactly weights + gradients + two moments, FSDP2 1/N of it either way, ZeRO-1's shards sum to DDP's (section 6)
@pytest.mark.also_in_notebook
@pytest.mark.slow
def test_zero_and_fsdp_end_with_ddps_weights_and_hold_less(tmp_path):
    out = tmp_path / "memory.json"
    # the torch variants (notebook 06 runs DeepSpeed's too, and checks the same); each run in a fresh process
    torchrun(
        SCRIPTS / "memory_footprint.py",
        2,
        ["--out", out, "--steps", 2, "--variants", "ddp,zero1,fsdp2_reshard_off,fsdp2_reshard_on"],
        echo=False,
        timeout=300,
    )
    res = json.loads(out.read_text())["results"]
    ddp = res["ddp"]["per_rank"][0]
    for name, r in res.items():
        if "skipped" in r:
            assert name.startswith("deepspeed"), name
            continue
        assert all(x["max_weight_diff_vs_first"] < 1e-5 for x in r["per_rank"]), name
    assert ddp["total"] == ddp["params"] + ddp["grads"] + ddp["optimizer_state"]
    assert 0 <= ddp["optimizer_state"] - 2 * ddp["params"] < 1024, (
        "two moments per parameter (plus AdamW's step counters)"
    )
    for name in ("fsdp2_reshard_off", "fsdp2_reshard_on"):
        assert all(abs(x["total"] - ddp["total"] / 2) <= 0.01 * ddp["total"] for x in res[name]["per_rank"]), name
    z1 = res["zero1"]["per_rank"]
    assert sum(x["optimizer_state"] for x in z1) == ddp["optimizer_state"], "ZeRO-1 shards the moments, keeps them all"


TRACKED = [
    "--config",
    "cpu_smoke",
    "--data",
    "synthetic",
    "--num_samples",
    96,
    "--eval_samples",
    32,
    "--epochs",
    2,
    "--batch_size",
    16,
    "--no-progress",
    "--no-snapshots",
    "--threads",
    1,
]


# Chapter 09 asserts both through train_ddp.py's tracker: its TensorBoard file holds every optimizer step's loss and
# metrics.json's accuracy (section 2), and its W&B solution cell finds one offline run with its .wandb file.
@pytest.mark.also_in_notebook
def test_tensorboard_and_wandb_write_their_files(tmp_path):
    run_python(
        SCRIPTS / "train_single.py",
        [*TRACKED, "--report_to", "tensorboard", "--output", tmp_path / "tb", "--checkpoint", tmp_path / "tb.pt"],
        echo=False,
        timeout=240,
    )
    m = load_metrics(tmp_path / "tb")
    events = read_tensorboard(tmp_path / "tb")
    assert len(events["train/loss_step"]) == sum(e["optimizer_steps"] for e in m["epochs"]) == 12
    assert [round(v, 6) for _, v in events["val/accuracy"]] == [round(e["val_accuracy"], 6) for e in m["epochs"]]
    run_python(
        SCRIPTS / "train_single.py",
        [*TRACKED, "--report_to", "wandb", "--output", tmp_path / "wb", "--checkpoint", tmp_path / "wb.pt"],
        echo=False,
        timeout=240,
        env={"WANDB_MODE": "offline"},
    )
    runs = list((tmp_path / "wb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


def test_trackio_writes_its_database(tmp_path):  # no chapter uses Trackio
    run_python(
        SCRIPTS / "train_single.py",
        [*TRACKED, "--report_to", "trackio", "--output", tmp_path / "tr", "--checkpoint", tmp_path / "tr.pt"],
        echo=False,
        timeout=240,
    )
    assert list((tmp_path / "tr" / "trackio").rglob("*.db")), "Trackio wrote its SQLite database into the run folder"
