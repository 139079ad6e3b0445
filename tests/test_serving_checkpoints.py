"""A checkpoint that cannot serve correctly must not start a server: each defect, at load and at startup.

The command line's exit codes for the same checkpoints are checked in test_serving_live.py.
"""

from __future__ import annotations

import pytest
import torch
from fastapi.testclient import TestClient

from distrinews_lib.checkpoint import save_checkpoint
from distrinews_lib.data.texts import AG_NEWS_LABELS
from distrinews_lib.serving.app import create_app
from distrinews_lib.serving.inference import CheckpointError, load_checkpoint, read_checkpoint
from distrinews_lib.serving.settings import ServingSettings

from .test_serving import make_checkpoint


def tampered(good, target, change):
    """A copy of the checkpoint `good` with `change(payload)` applied, saved as `target`."""
    payload = read_checkpoint(good)
    change(payload)
    torch.save(payload, target)
    return target


def set_labels(names):
    return lambda payload: payload.__setitem__("label_names", names)


def first_weight(value):
    def change(payload):
        name = next(k for k, t in payload["state_dict"].items() if k.endswith("weight") and t.ndim == 2)
        payload["state_dict"][name][0, 0] = value

    return change


def huge_head(payload):
    # Finite weights whose logits overflow: the probabilities come out NaN although every weight is a number.
    name = next(k for k in payload["state_dict"] if k.startswith("classifier") and k.endswith("weight"))
    payload["state_dict"][name].fill_(3e38)


def unclassifiable_checkpoint(path):
    """Loads cleanly, but its tokenizer produces ids beyond the model's 100-word embedding table: it cannot
    classify a text (the kind of checkpoint the server's warm-up exists for)."""
    from transformers import AutoModelForSequenceClassification, DistilBertConfig

    from distrinews_lib.data.tokenization import tiny_tokenizer
    from distrinews_lib.models.build import TINY_CONFIG

    config = DistilBertConfig(vocab_size=100, num_labels=len(AG_NEWS_LABELS), **TINY_CONFIG)
    model = AutoModelForSequenceClassification.from_config(config)
    return save_checkpoint(path, model, tiny_tokenizer(), AG_NEWS_LABELS, {"model": "tiny"}, max_length=64)


# name -> (how to make it from a good checkpoint, words the message must contain)
DEFECTS = {
    "six labels for four outputs": (set_labels(AG_NEWS_LABELS + ["Health", "Arts"]), ["names 6 labels", "4 outputs"]),
    "three labels for four outputs": (set_labels(AG_NEWS_LABELS[:3]), ["names 3 labels", "4 outputs"]),
    "duplicate label names": (set_labels(["World", "Sports", "World", "Sci/Tech"]), ["'World' more than once"]),
    "max_length beyond the position table": (
        lambda p: p.__setitem__("max_length", 600),
        ["max_length=600", "only 512"],
    ),
    "NaN weight": (first_weight(float("nan")), ["NaN or infinite weights", "lower --lr"]),
    "infinite weight": (first_weight(float("inf")), ["NaN or infinite weights"]),
}


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("good") / "good.pt")


@pytest.mark.parametrize("defect", list(DEFECTS))
def test_inconsistent_checkpoint_is_refused_at_load_and_at_startup(good, tmp_path, defect):
    change, words = DEFECTS[defect]
    bad = tampered(good, tmp_path / "bad.pt", change)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(bad)
    for word in words:
        assert word in str(err.value), str(err.value)
    assert str(bad) in str(err.value) and "Retrain" in str(err.value)
    with pytest.raises(CheckpointError):
        with TestClient(create_app(ServingSettings(checkpoint=bad, torch_threads=0))):
            pass  # the server must not start


def test_warm_up_refuses_answers_that_are_not_finite_probabilities(good, tmp_path):
    bad = tampered(good, tmp_path / "overflow.pt", huge_head)
    load_checkpoint(bad)  # every weight is a finite number: only running the model shows the problem
    with pytest.raises(CheckpointError, match="NaN or infinite probabilities"):
        with TestClient(create_app(ServingSettings(checkpoint=bad, torch_threads=0))):
            pass


def test_warm_up_refuses_a_checkpoint_that_cannot_classify(tmp_path):
    bad = unclassifiable_checkpoint(tmp_path / "vocab.pt")
    with pytest.raises(CheckpointError, match="loaded but could not classify a text"):
        with TestClient(create_app(ServingSettings(checkpoint=bad, torch_threads=0))):
            pass


def test_empty_checkpoint_file_gets_a_clear_message(tmp_path):
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"empty \(0 bytes\)"):
        load_checkpoint(empty)


def test_folder_given_as_checkpoint_gets_a_clear_message(tmp_path, good):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    with pytest.raises(CheckpointError, match="is a folder, not a checkpoint file"):
        load_checkpoint(folder)
    (folder / "distilbert_agnews.pt").write_bytes(good.read_bytes())
    with pytest.raises(CheckpointError, match="It holds distilbert_agnews.pt"):
        load_checkpoint(folder)


# ----------------------------------------------------------------------------- the command line


# what -> words its one paragraph must contain
REFUSALS = {
    "missing": "not found",
    "corrupt": "could not be read",
    "empty": "is empty (0 bytes)",
    "folder": "is a folder, not a checkpoint file",
    "labels": "names 6 labels",
    "nan": "NaN or infinite weights",
    "overflow": "NaN or infinite probabilities",
    "unclassifiable": "loaded but could not classify a text",
}


def make_bad_checkpoints(folder, good) -> dict:
    """One checkpoint file (or folder) per way of being unable to serve."""
    paths = {what: folder / f"{what}.pt" for what in REFUSALS}
    paths["folder"] = folder / "a_folder"
    paths["corrupt"].write_bytes(b"PK\x03\x04 this is a truncated zip, not a checkpoint")
    paths["empty"].write_bytes(b"")
    paths["folder"].mkdir()
    tampered(good, paths["labels"], set_labels(AG_NEWS_LABELS + ["Health", "Arts"]))
    tampered(good, paths["nan"], first_weight(float("nan")))
    tampered(good, paths["overflow"], huge_head)
    unclassifiable_checkpoint(paths["unclassifiable"])
    return paths


@pytest.fixture(scope="module")
def bad_checkpoints(tmp_path_factory, good):
    return make_bad_checkpoints(tmp_path_factory.mktemp("bad"), good)


@pytest.mark.parametrize("what", list(REFUSALS))
def test_command_line_refuses_a_checkpoint_that_cannot_serve_with_exit_code_2(
    bad_checkpoints, what, capsys, monkeypatch
):
    """`python -m distrinews_lib.serving` (its main, in this process) checks the checkpoint before it starts
    uvicorn: every refusal, including "loaded but cannot classify", is one paragraph and exit code 2."""
    import uvicorn

    from distrinews_lib.serving.__main__ import main

    def started(*args, **kwargs):
        raise AssertionError("the server started: the checkpoint was not refused before uvicorn")

    monkeypatch.setattr(uvicorn, "run", started)
    monkeypatch.setattr(uvicorn.Server, "run", started)
    path = bad_checkpoints[what]
    with pytest.raises(SystemExit) as stopped:
        main(["--checkpoint", str(path), "--port", "0", "--device", "cpu"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("error:") == 1 and "Traceback" not in err, err
    assert REFUSALS[what] in " ".join(err.split()) and str(path) in err, err


def test_command_line_refuses_bad_limits_with_exit_code_2(good, capsys, monkeypatch):
    from distrinews_lib.serving.__main__ import main

    for argv, words in (
        (["--max-queue", "0"], "--max-queue='0' is out of range"),
        (["--deadline", "soon"], "--deadline='soon' is not a number"),
        (["--max-queue-texts", "10"], "between 64 and"),
    ):
        with pytest.raises(SystemExit) as stopped:
            main(["--checkpoint", str(good), *argv])
        assert stopped.value.code == 2
        assert words in " ".join(capsys.readouterr().err.split())
    monkeypatch.setenv("DISTRINEWS_MAX_QUEUE", "lots")
    with pytest.raises(SystemExit):
        main(["--checkpoint", str(good)])
    assert "environment variable DISTRINEWS_MAX_QUEUE='lots' is not a whole number" in capsys.readouterr().err
