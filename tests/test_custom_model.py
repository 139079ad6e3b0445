"""--model custom with --tokenizer hash: the same gradients under DDP as in one process, snapshots and exact
resume, the checkpoint path, and the server answering an IMDB checkpoint with negative/positive."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from fastapi.testclient import TestClient

from distrinews_course.launch import torchrun
from distrinews_lib import checkpoint
from distrinews_lib.data.texts import AG_NEWS_LABELS
from distrinews_lib.errors import UserError
from distrinews_lib.models.build import build_model
from distrinews_lib.models.custom import CustomClassifier
from distrinews_lib.serving import inference
from distrinews_lib.serving.app import create_app
from distrinews_lib.serving.settings import ServingSettings
from distrinews_lib.training.config import RunConfig

from .helpers import ROOT, SCRIPTS, run_script
from .test_datasets import imdb_rows, needs_imdb, write_csv

SMALL_CUSTOM = [
    "--config",
    "cpu_smoke",
    "--model",
    "custom",
    "--custom_dim",
    "32",
    "--custom_ffn",
    "64",
    "--custom_heads",
    "4",
    "--hash_buckets",
    "4096",
    "--max_length",
    "64",
    "--lr",
    "2e-3",
    "--no-progress",
    "--threads",
    "1",
]


@pytest.fixture(scope="module")
def custom_ddp_checks(tmp_path_factory):
    out = tmp_path_factory.mktemp("custom_ddp")
    torchrun(ROOT / "tests" / "workers" / "custom_ddp_checks.py", 2, [out], timeout=240, echo=False)
    return json.loads((out / "custom_ddp_checks.json").read_text())


@pytest.mark.slow
def test_custom_model_under_ddp_has_the_gradients_of_one_process(custom_ddp_checks):
    assert custom_ddp_checks["world_size"] == 2
    assert custom_ddp_checks["ids_same_on_every_rank"], "each rank hashes on its own and must get the same ids"
    assert len(custom_ddp_checks["grad_max_diff_per_step"]) == 5
    assert max(custom_ddp_checks["grad_max_diff_per_step"]) < 1e-5
    assert max(custom_ddp_checks["param_max_diff_per_step"]) < 1e-5
    assert custom_ddp_checks["ranks_max_param_diff"] == 0.0
    assert custom_ddp_checks["embedding_rows"] == 2048  # the hash buckets: no vocabulary


def test_the_model_fits_one_screen_and_answers_like_a_classifier():
    import inspect

    from distrinews_lib.models import custom as custom_model

    assert len(inspect.getsource(custom_model.CustomClassifier).splitlines()) <= 50
    cfg = RunConfig(model="custom", custom_dim=32, custom_ffn=64, max_length=40, hash_buckets=512)
    model, tok, info = build_model(replace(cfg, seed=0), ["negative", "positive"])
    assert isinstance(model, CustomClassifier) and info.kind == "preset" and not info.pretrained
    enc = tok(["a fine film", "awful"], padding=True, return_tensors="pt")
    assert model(**enc).logits.shape == (2, 2)
    assert checkpoint.position_limit(model) == 40
    with pytest.raises(UserError, match="--tokenizer hash needs a model trained from scratch"):
        build_model(RunConfig(model="minilm", tokenizer="hash"), AG_NEWS_LABELS)


def test_padding_does_not_change_the_answer():
    cfg = RunConfig(model="custom", custom_dim=32, custom_ffn=64, max_length=40, hash_buckets=512)
    model, tok, _ = build_model(replace(cfg, seed=0), ["a", "b"])
    model.eval()
    alone = model(**tok(["a short text"], return_tensors="pt")).logits
    padded = model(**tok(["a short text", "a much longer text " * 5], padding=True, return_tensors="pt")).logits[:1]
    assert torch.allclose(alone, padded, atol=1e-5)


@pytest.fixture(scope="module")
def imdb_run(tmp_path_factory):
    """A small IMDB run of the custom model (160 real reviews), with a snapshot every 3 of its 10 steps."""
    tmp = tmp_path_factory.mktemp("imdb_run")
    folder = tmp / "imdb"
    folder.mkdir()
    for split, n in (("train", 160), ("test", 40)):
        write_csv(
            folder / f"{split}.csv",
            [[r["id"], r["rating"], r["label"], r["text"]] for r in imdb_rows(split, n)],
            header=["id", "rating", "label", "text"],
        )
    common = [
        *SMALL_CUSTOM,
        "--dataset",
        "imdb",
        "--data",
        folder,
        "--truncation",
        "head_tail",
        "--batch_size",
        "16",
        "--epochs",
        "1",
    ]
    whole = run_script(
        [
            SCRIPTS / "train_single.py",
            *common,
            "--snapshot_every",
            "3",
            "--keep_snapshots",
            "3",
            "--output",
            tmp / "whole",
            "--checkpoint",
            tmp / "whole.pt",
        ],
        timeout=240,
    )
    assert whole.returncode == 0, whole.stderr[-2000:]
    return {"tmp": tmp, "args": common, "stdout": whole.stdout, "checkpoint": tmp / "whole.pt"}


@pytest.mark.slow
@needs_imdb
def test_imdb_run_reports_balance_and_resumes_bit_identically(imdb_run):
    tmp = imdb_run["tmp"]
    assert "class balance: train negative 80 (50.0%), positive 80 (50.0%)" in imdb_run["stdout"]
    assert "tokenizer hash-blake2b-4096" in imdb_run["stdout"] and "truncation head_tail" in imdb_run["stdout"]
    # Resumed from the snapshot the run took after 6 of its 10 steps: it ends with the same weights, bit for bit.
    (tmp / "cut" / "snapshots").mkdir(parents=True)
    (tmp / "cut" / "snapshots" / "snap_e001_b000006.pt").write_bytes(
        (tmp / "whole" / "snapshots" / "snap_e001_b000006.pt").read_bytes()
    )
    resumed = run_script(
        [
            SCRIPTS / "train_single.py",
            *imdb_run["args"],
            "--resume",
            "auto",
            "--output",
            tmp / "cut",
            "--checkpoint",
            tmp / "resumed.pt",
        ],
        timeout=240,
    )
    assert resumed.returncode == 0 and "resumed from" in resumed.stdout, resumed.stderr[-2000:]
    a = inference.read_checkpoint(imdb_run["checkpoint"])["state_dict"]
    b = inference.read_checkpoint(tmp / "resumed.pt")["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
@needs_imdb
def test_the_server_answers_an_imdb_checkpoint_with_negative_and_positive(imdb_run):
    raw = inference.read_checkpoint(imdb_run["checkpoint"])
    assert raw["model_type"] == "distrinews_custom" and raw["label_names"] == ["negative", "positive"]
    assert raw["truncation"] == "head_tail" and "distrinews_hash_tokenizer.json" in raw["tokenizer_files"]
    loaded = inference.load_checkpoint(imdb_run["checkpoint"])
    texts = ["A wonderful, moving film with a brilliant cast.", "Dull, predictable and far too long. Avoid it."]
    probs = inference.predict_proba(loaded, texts)
    app = create_app(
        ServingSettings(
            checkpoint=imdb_run["checkpoint"], device="cpu", max_batch_size=8, batch_window_ms=2, torch_threads=0
        )
    )
    with TestClient(app) as client:
        health = client.get("/health").json()
        assert health["labels"] == ["negative", "positive"] and health["checkpoint"]["model"] == "custom"
        one = client.post("/predict", json={"text": texts[0]}).json()
        batch = client.post("/predict/batch", json={"texts": texts}).json()
    assert one["label"] in ("negative", "positive") and set(one["all_probabilities"]) == {"negative", "positive"}
    for answer, p in zip(batch["results"], probs.tolist()):
        assert answer["label"] == ["negative", "positive"][max(range(2), key=p.__getitem__)]
        assert list(answer["all_probabilities"].values()) == pytest.approx(p, abs=1e-5)


@pytest.mark.slow
def test_ddp_run_of_the_custom_model_saves_a_servable_checkpoint(tmp_path):
    ck = tmp_path / "m.pt"
    res = torchrun(
        SCRIPTS / "train_ddp.py",
        2,
        [
            *SMALL_CUSTOM,
            "--data",
            "embedded",
            "--num_samples",
            "160",
            "--eval_samples",
            "64",
            "--epochs",
            "1",
            "--batch_size",
            "8",
            "--output",
            tmp_path / "run",
            "--checkpoint",
            ck,
        ],
        timeout=240,
        echo=False,
    )
    assert "parameters identical on all 2 ranks: True" in res.output
    loaded = inference.load_checkpoint(ck)
    assert loaded.label_names == ["World", "Sports", "Business", "Sci/Tech"]
    assert inference.check_predictions(loaded).shape == (2, 4)


def test_a_max_length_beyond_the_models_positions_is_refused_with_the_limit(tmp_path):
    r = run_script(
        [
            SCRIPTS / "train_single.py",
            "--config",
            "cpu_smoke",
            "--data",
            "embedded",
            "--model",
            "tiny",
            "--max_length",
            "1024",
            "--output",
            tmp_path,
            "--no-progress",
        ],
        timeout=120,
    )
    text = " ".join(r.stderr.split())
    assert (
        r.returncode == 2 and "position embeddings stop at 512 tokens" in text and "--truncation head_tail" in text
    ), text
    assert "Traceback" not in r.stderr
