"""A checkpoint that cannot serve correctly must not start a server: each defect, at load and at startup.

The command line's exit codes for the same checkpoints are checked in test_serving_live.py.
"""

from __future__ import annotations

import pytest
import torch
from fastapi.testclient import TestClient

from distrinews_lib import LABEL_NAMES
from distrinews_lib.checkpoint import CheckpointError, load_checkpoint, read_checkpoint
from distrinews_lib.serving.app import create_app

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


# name -> (how to make it from a good checkpoint, words the message must contain)
DEFECTS = {
    "six labels for four outputs": (set_labels(LABEL_NAMES + ["Health", "Arts"]), ["names 6 labels", "4 outputs"]),
    "three labels for four outputs": (set_labels(LABEL_NAMES[:3]), ["names 3 labels", "4 outputs"]),
    "duplicate label names": (set_labels(["World", "Sports", "World", "Sci/Tech"]), ["'World' more than once"]),
    "max_length beyond the position table": (lambda p: p.__setitem__("max_length", 600),
                                             ["max_length=600", "only 512"]),
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
        with TestClient(create_app(bad, torch_threads=0)):
            pass  # the server must not start


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
