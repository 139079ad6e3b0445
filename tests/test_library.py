"""Unit tests: presets and flags, AMP choice, backend choice, checkpoints, the launcher."""

import os
import sys

import pytest
import torch

from distrinews_lib import LABEL_NAMES, checkpoint, cli, distributed, engine
from distrinews_lib.errors import UserError
from distrinews_lib.launch import LaunchError, run_python, torchrun
from distrinews_lib.model import build_model


def test_preset_then_flags_override():
    args = cli.parse_train_args("t", ["--config", "cpu_smoke", "--epochs", "5"])
    assert args.preset == "cpu_smoke" and args.model == "tiny" and args.epochs == 5 and args.max_length == 64


def test_auto_preset_on_cpu_is_cpu_smoke():
    assert cli.parse_train_args("t", []).preset == ("cpu_smoke" if not torch.cuda.is_available() else cli.auto_preset())


def test_unknown_preset_lists_choices():
    with pytest.raises(UserError, match="Choices: auto, cpu_smoke, single_gpu, kaggle_t4x2"):
        cli.parse_train_args("t", ["--config", "nope"])


def test_preset_with_unknown_key_is_refused(tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text("epochs: 2\nepohcs: 3\n")
    with pytest.raises(UserError, match="unknown option.*epohcs"):
        cli.parse_train_args("t", ["--config", str(p)])


def test_amp_choices_on_cpu():
    cpu = torch.device("cpu")
    assert engine.resolve_amp("auto", cpu).mode == "off"
    assert engine.resolve_amp("bf16", cpu).dtype == torch.bfloat16
    with pytest.raises(UserError, match="fp16 needs a CUDA GPU"):
        engine.resolve_amp("fp16", cpu)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_amp_auto_on_gpu_picks_bf16_or_fp16_with_scaler():
    amp = engine.resolve_amp("auto", torch.device("cuda", 0))
    assert (amp.mode, amp.use_scaler) in (("bf16", False), ("fp16", True))


def test_backend_choice(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert distributed.choose_backend("auto", 2)[0] == "gloo"
    with pytest.raises(UserError, match="nccl needs NVIDIA GPUs"):
        distributed.choose_backend("nccl", 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(UserError, match="2 processes on this node but only 1 GPU"):
        distributed.choose_backend("nccl", 2)
    backend, why = distributed.choose_backend("auto", 2)
    assert backend == "gloo" and "only 1 GPU" in why
    assert distributed.choose_backend("auto", 1)[0] == "nccl"


def test_checkpoint_roundtrip_and_atomic_write(tmp_path, monkeypatch):
    model, tok, _ = build_model("tiny", seed=0)
    path = tmp_path / "m.pt"
    checkpoint.save_checkpoint(path, model, tok, LABEL_NAMES, {"final_accuracy": 0.5}, 32)
    before = path.read_bytes()
    loaded = checkpoint.load_checkpoint(path)
    assert not loaded.model.training and loaded.label_names == LABEL_NAMES and loaded.max_length == 32
    p = checkpoint.predict_proba(loaded, ["stocks rally", "team wins"])
    assert torch.allclose(p.sum(-1), torch.ones(2))

    # A crash in the middle of torch.save leaves the previous checkpoint untouched.
    real_save = torch.save

    def crash(obj, f, *a, **k):
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError):
        checkpoint.save_checkpoint(path, model, tok, LABEL_NAMES, {"final_accuracy": 0.9}, 32)
    monkeypatch.setattr(torch, "save", real_save)
    assert path.read_bytes() == before
    assert not list(tmp_path.glob("*.tmp"))
    assert checkpoint.load_checkpoint(path).metadata["final_accuracy"] == 0.5


def test_corrupt_or_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(checkpoint.CheckpointError, match="not found.*Train one first"):
        checkpoint.load_checkpoint(tmp_path / "none.pt")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"\x00" * 100)
    with pytest.raises(checkpoint.CheckpointError, match="could not be read"):
        checkpoint.load_checkpoint(bad)


def test_unknown_model_lists_choices_quickly():
    import time

    t = time.time()
    with pytest.raises(UserError, match="Choices: tiny.*minilm"):
        build_model("no-such-org/no-such-model")
    assert time.time() - t < 15  # offline: no 50 s of hub retries


def test_launcher_raises_on_failure_and_timeout(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os, sys\nprint('rank', os.environ['RANK'])\nsys.exit(3 if os.environ['RANK'] == '1' else 0)\n")
    with pytest.raises(LaunchError, match="torchrun of bad.py with 2 process"):
        torchrun(bad, 2, echo=False, timeout=60)
    slow = tmp_path / "slow.py"
    slow.write_text("import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    with pytest.raises(LaunchError, match="timed out after 2 s"):
        run_python(slow, timeout=2, echo=False)
    r = run_python(slow, timeout=2, echo=False, check=False)
    assert r.timed_out and "started" in r.output
