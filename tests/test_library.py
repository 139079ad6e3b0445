"""Unit tests: presets and flags, AMP choice, backend choice, checkpoints, the launcher."""

import re

import pytest
import torch

from distrinews_course.launch import LaunchError, run_python, torchrun
from distrinews_lib import checkpoint, distributed, machine
from distrinews_lib.data.texts import AG_NEWS_LABELS
from distrinews_lib.errors import UserError
from distrinews_lib.models.build import build_model
from distrinews_lib.serving import inference
from distrinews_lib.training import config, precision
from distrinews_lib.training.config import RunConfig


def test_preset_then_flags_override():
    cfg = config.parse("t", ["--config", "cpu_smoke", "--epochs", "5"])
    assert cfg.preset == "cpu_smoke" and cfg.model == "tiny" and cfg.epochs == 5 and cfg.max_length == 64


def test_auto_preset_on_cpu_is_cpu_smoke():
    assert config.parse("t", []).preset == ("cpu_smoke" if not torch.cuda.is_available() else config.auto_preset())


def test_unknown_preset_lists_choices():
    with pytest.raises(UserError, match="Choices: auto, cpu_smoke, single_gpu, kaggle_t4x2"):
        config.parse("t", ["--config", "nope"])


def test_preset_with_unknown_key_is_refused(tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text("epochs: 2\nepohcs: 3\n")
    with pytest.raises(UserError, match="unknown option.*epohcs"):
        config.parse("t", ["--config", str(p)])


def _preset(tmp_path, text):
    p = tmp_path / "p.yaml"
    p.write_text(text)
    return config.parse("t", ["--config", str(p)], ddp=True)


def test_yaml_words_reach_the_option_as_written(tmp_path):
    # YAML 1.1 would read `off` as False and `yes` as True; presets are read as text, like flags.
    cfg = _preset(tmp_path, "amp: off\nprogress: no\nno_sync: yes\nlr: 1e-3\nnum_samples: null\n")
    assert (cfg.amp, cfg.progress, cfg.no_sync, cfg.lr, cfg.num_samples) == ("off", False, True, 1e-3, None)


@pytest.mark.parametrize(
    "text, words",
    [
        ("amp: offf", "preset p .*amp: 'offf' is not one of auto, fp16, bf16, off"),
        ("batch_size: true", "batch_size expects a whole number, got 'true'"),
        ("epochs: 2.5", "epochs expects a whole number, got '2.5'"),
        ("epochs: [1, 2]", "epochs must be a single value, not a list"),
        ("epochs: {a: 1}", "epochs must be a single value, not a mapping"),
        ("epochs: null", "epochs needs a value here"),
        ("warmup_ratio: 5", "warmup_ratio must be in \\[0, 1\\)"),
        ("weight_decay: -3", "weight_decay must be 0 or a positive finite number"),
        ("keep_snapshots: 0", "keep_snapshots must be at least 1"),
        ("lr: .inf", "lr must be a positive finite number"),
        ("- just\n- a list", "must hold a mapping of option: value"),
        ("epochs: [unclosed", "is not valid YAML"),
    ],
)
def test_a_preset_value_of_the_wrong_shape_gets_one_clear_message(tmp_path, text, words):
    with pytest.raises(UserError, match=words):
        _preset(tmp_path, text)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--lr", "inf"], "--lr must be a positive finite number"),
        (["--lr", "0"], "--lr must be a positive finite number"),
        (["--amp", "False"], "--amp: 'False' is not one of"),
        (["--epochs", "two"], "--epochs expects a whole number, got 'two'"),
        (["--bogus", "1"], "unrecognized arguments: --bogus"),
    ],
)
def test_flags_take_the_same_checks(argv, words):
    with pytest.raises(UserError, match=words):
        config.parse("t", argv, ddp=True)


def test_the_config_is_typed_and_frozen():
    cfg = config.parse("t", ["--config", "cpu_smoke", "--pad_multiple", "8", "--no-fused_adam"], ddp=True)
    assert isinstance(cfg.pad_multiple, int) and cfg.fused_adam is False and cfg.ddp_timeout == 300.0
    with pytest.raises(Exception):
        cfg.epochs = 9  # a run-wide decision is made once


def test_amp_choices_on_cpu():
    cpu = torch.device("cpu")
    assert precision.resolve_amp("auto", cpu).mode == "off"
    assert precision.resolve_amp("bf16", cpu).dtype == torch.bfloat16
    with pytest.raises(UserError, match="fp16 needs a CUDA GPU"):
        precision.resolve_amp("fp16", cpu)


# /proc/cpuinfo's flags of the two kinds of CPU this course runs on: the AMD EPYC of CI (no bf16 in hardware: an
# epoch of --amp bf16 measured 4.7x slower than fp32) and a Sapphire Rapids Xeon (AVX-512 BF16 and AMX).
EPYC_FLAGS = "fpu vme sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma bmi2 avx512f avx512dq avx512bw avx512vl sha_ni"
XEON_FLAGS = EPYC_FLAGS + " avx512_bf16 amx_bf16 amx_tile amx_int8 avx512_fp16"


@pytest.mark.parametrize(
    "flags, native",
    [(EPYC_FLAGS, False), (XEON_FLAGS, True), ("Features : fp asimd bf16", True), ("Features : fp asimd", False)],
)
def test_cpu_bf16_is_read_from_the_flags(flags, native):
    text = f"processor : 0\nflags : {flags}\n" if ":" not in flags else f"processor : 0\n{flags}\n"
    assert machine.cpu_native_bf16(machine.cpu_flags(text)) is native
    assert machine.cpu_flags("processor : 0\n") is None and machine.cpu_native_bf16(None) in (True, False, None)


@pytest.mark.parametrize("flags", [EPYC_FLAGS, XEON_FLAGS])
def test_amp_auto_never_picks_bf16_on_a_cpu(monkeypatch, flags):
    monkeypatch.setattr(machine, "cpu_flags", lambda cpuinfo=None: set(flags.split()))
    assert precision.resolve_amp("auto", torch.device("cpu")).mode == "off"


def test_bf16_asked_for_on_a_cpu_without_it_warns_once_and_runs(monkeypatch, capsys):
    monkeypatch.setattr(machine, "cpu_flags", lambda cpuinfo=None: set(EPYC_FLAGS.split()))
    monkeypatch.setenv("RANK", "0")
    amp = precision.resolve_amp("bf16", torch.device("cpu"))
    assert amp.mode == "bf16" and amp.dtype == torch.bfloat16 and "EMULATED" in amp.reason  # the run goes on
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: --amp bf16") and "no bf16 in hardware" in lines[0]
    slowdown = float(re.search(r"ran ([\d.]+)x slower", lines[0])[1])  # the probe's own measurement, printed
    assert slowdown > 0
    monkeypatch.setenv("RANK", "1")  # the other ranks say nothing
    precision.resolve_amp("bf16", torch.device("cpu"))
    assert capsys.readouterr().err == ""


def test_bf16_on_a_cpu_with_it_says_nothing(monkeypatch, capsys):
    monkeypatch.setattr(machine, "cpu_flags", lambda cpuinfo=None: set(XEON_FLAGS.split()))
    amp = precision.resolve_amp("bf16", torch.device("cpu"))
    assert amp.mode == "bf16" and "EMULATED" not in amp.reason and capsys.readouterr().err == ""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_amp_auto_on_gpu_picks_bf16_or_fp16_with_scaler():
    amp = precision.resolve_amp("auto", torch.device("cuda", 0))
    assert (amp.mode, amp.use_scaler) in (("bf16", False), ("fp16", True))


@pytest.mark.parametrize(
    "capability, name, mode, scaler",
    [
        ((7, 5), "Tesla T4", "fp16", True),  # is_bf16_supported() says True here (emulation): not a reason for bf16
        ((7, 0), "Tesla V100-SXM2-16GB", "fp16", True),
        ((8, 0), "NVIDIA A100-SXM4-40GB", "bf16", False),
        ((9, 0), "NVIDIA H100 80GB HBM3", "bf16", False),
    ],
)
def test_amp_auto_gates_bf16_on_compute_capability(monkeypatch, capability, name, mode, scaler):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    amp = precision.resolve_amp("auto", torch.device("cuda", 0))
    assert (amp.mode, amp.use_scaler) == (mode, scaler) and name in amp.reason
    if mode == "fp16":
        with pytest.raises(UserError, match="no bf16 in hardware.*--amp fp16"):
            precision.resolve_amp("bf16", torch.device("cuda", 0))


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
    model, tok, _ = build_model(RunConfig(model="tiny", seed=0), AG_NEWS_LABELS)
    path = tmp_path / "m.pt"
    checkpoint.save_checkpoint(path, model, tok, AG_NEWS_LABELS, {"final_accuracy": 0.5}, 32)
    before = path.read_bytes()
    loaded = inference.load_checkpoint(path)
    assert not loaded.model.training and loaded.label_names == AG_NEWS_LABELS and loaded.max_length == 32
    p = inference.predict_proba(loaded, ["stocks rally", "team wins"])
    assert torch.allclose(p.sum(-1), torch.ones(2))

    # A crash in the middle of torch.save leaves the previous checkpoint untouched.
    real_save = torch.save

    def crash(obj, f, *a, **k):
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError):
        checkpoint.save_checkpoint(path, model, tok, AG_NEWS_LABELS, {"final_accuracy": 0.9}, 32)
    monkeypatch.setattr(torch, "save", real_save)
    assert path.read_bytes() == before
    assert not list(tmp_path.glob("*.tmp"))
    assert inference.load_checkpoint(path).metadata["final_accuracy"] == 0.5


def test_corrupt_or_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(inference.CheckpointError, match="not found.*Train one first"):
        inference.load_checkpoint(tmp_path / "none.pt")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"\x00" * 100)
    with pytest.raises(inference.CheckpointError, match="could not be read"):
        inference.load_checkpoint(bad)


def test_the_checkpoint_format_names_an_older_newer_or_foreign_file(tmp_path):
    """training/checkpoint.py owns the format: read_checkpoint says what a file that is not this version's is."""
    model, tok, _ = build_model(RunConfig(model="tiny", seed=0), AG_NEWS_LABELS)
    good = checkpoint.save_checkpoint(tmp_path / "m.pt", model, tok, AG_NEWS_LABELS, {}, 32)
    payload = checkpoint.read_checkpoint(good)
    assert payload["format_version"] == checkpoint.FORMAT_VERSION and payload["task"] == "classify"

    def variant(name, change):
        p = dict(payload)
        change(p)
        torch.save(p, tmp_path / name)
        return tmp_path / name

    cases = [
        (variant("new.pt", lambda p: p.update(format_version=checkpoint.FORMAT_VERSION + 1)), "newer DistriNews"),
        (variant("old.pt", lambda p: p.pop("format_version")), "older DistriNews \\(format 1"),
        (
            variant("ddp.pt", lambda p: p.update(state_dict={"module." + k: v for k, v in p["state_dict"].items()})),
            "'module.' prefix",
        ),
        (variant("snap.pt", lambda p: p.update(snapshot_version=2)), "is a training snapshot"),
    ]
    torch.save(model.state_dict(), tmp_path / "bare.pt")
    cases.append((tmp_path / "bare.pt", "not a DistriNews checkpoint .*bare weights"))
    for path, message in cases:
        with pytest.raises(checkpoint.CheckpointError, match=message):
            checkpoint.read_checkpoint(path)
    assert inference.read_checkpoint is checkpoint.read_checkpoint  # the server only calls the format's module


def test_unknown_model_lists_choices_quickly():
    import time

    t = time.time()
    with pytest.raises(UserError, match="Choices: tiny.*minilm"):
        build_model(RunConfig(model="no-such-org/no-such-model"), AG_NEWS_LABELS)
    assert time.time() - t < 15  # offline: no 50 s of hub retries


def test_launcher_raises_on_failure_and_timeout(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import os, sys\nprint('rank', os.environ['RANK'])\nsys.exit(3 if os.environ['RANK'] == '1' else 0)\n"
    )
    with pytest.raises(LaunchError, match="torchrun of bad.py with 2 process"):
        torchrun(bad, 2, echo=False, timeout=60)
    slow = tmp_path / "slow.py"
    slow.write_text("import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    with pytest.raises(LaunchError, match="timed out after 2 s"):
        run_python(slow, timeout=2, echo=False)
    r = run_python(slow, timeout=2, echo=False, check=False)
    assert r.timed_out and "started" in r.output


@pytest.mark.parametrize(
    "text, limit, want",
    [
        (
            "Connection closed by peer [10.0.0.2]:1234. This is typically caused by a remote process crashing.",
            80,
            "Connection closed by peer [10.0.0.2]:1234. …",
        ),
        ("a b c d e f g h i j k l m n o p q r s t", 12, "a b c d e f …"),
        ("short enough", 40, "short enough"),
        ("first line\nsecond line", 40, "first line"),
    ],
)
def test_a_quoted_error_is_cut_at_a_boundary_never_mid_word(text, limit, want):
    from distrinews_lib.errors import first_line

    assert first_line(RuntimeError(text), limit) == want


def test_main_guard_names_a_collective_timeout_but_not_a_launchers_quote_of_one(capsys):
    """A rank's own timeout becomes exit 3 and one paragraph; a launcher's error that quotes its children's output
    (which may hold their timeout message) is the children's failure and keeps its text (bench_train reported a
    child's ValueError as its own collective timeout)."""
    from distrinews_course.launch import LaunchError
    from distrinews_lib.errors import COLLECTIVE_TIMEOUT_EXIT, main_guard

    @main_guard
    def own():
        raise RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 5000ms for recv operation")

    with pytest.raises(SystemExit) as exit_:
        own()
    assert exit_.value.code == COLLECTIVE_TIMEOUT_EXIT
    assert "a collective operation could not complete" in capsys.readouterr().err

    @main_guard
    def launcher():
        raise LaunchError("torchrun of x.py exited with code 1.\nValueError: too many values\n[rank 1] timeout", None)

    with pytest.raises(LaunchError, match="ValueError: too many values"):
        launcher()
