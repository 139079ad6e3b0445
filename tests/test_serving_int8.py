"""--quantize int8: the served precision, answers close to fp32's, and a clear refusal where int8 does not apply.

The accuracy on real data (all 7,600 AG News test texts) and the speed-up are measured by
`scripts/bench_serving.py --int8` (benchmarks/serving_int8_<machine>.json) and chapter 10.
"""

from __future__ import annotations

import pytest
import torch
from fastapi.testclient import TestClient

from distrinews_lib.checkpoint import save_checkpoint
from distrinews_lib.data.texts import AG_NEWS_LABELS
from distrinews_lib.errors import UserError
from distrinews_lib.serving.app import create_app
from distrinews_lib.serving.inference import CheckpointError, load_checkpoint, predict_proba
from distrinews_lib.serving.loading import check_for_serving, load_in_precision, ready_to_serve
from distrinews_lib.serving.quantize import MAX_DRIFT, linear_weights
from distrinews_lib.serving.settings import ServingSettings

from .test_serving import TEXTS, make_checkpoint
from .test_serving_checkpoints import tampered


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("int8") / "good.pt")


def gpt2_checkpoint(path):
    """A small GPT-2 classifier: it serves in fp32, but its layers are transformers' Conv1D, not torch.nn.Linear,
    so dynamic int8 would quantize only its one-layer head."""
    from transformers import AutoModelForSequenceClassification, GPT2Config

    from distrinews_lib.data.tokenization import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_embd=64,
        n_layer=2,
        n_head=2,
        n_positions=128,
        num_labels=len(AG_NEWS_LABELS),
        pad_token_id=tokenizer.pad_token_id,
    )
    model = AutoModelForSequenceClassification.from_config(config)
    return save_checkpoint(path, model, tokenizer, AG_NEWS_LABELS, {"model": "gpt2-small-test"}, max_length=64)


def outlier_weights(payload):
    """One large weight in every row of the transformer's Linear layers: int8's one scale per row then leaves the
    row's other weights with almost no resolution. fp32 still answers finite probabilities."""
    for name, t in payload["state_dict"].items():
        if name.endswith("weight") and t.ndim == 2 and "transformer" in name:
            t[:, 0] = 40.0


def test_int8_server_reports_its_precision_and_answers_close_to_fp32(good):
    loaded = load_checkpoint(good)
    fp32 = predict_proba(loaded, TEXTS)
    settings = ServingSettings(checkpoint=good, device="cpu", torch_threads=0, quantize="int8")
    with TestClient(create_app(settings)) as c:
        health = c.get("/health").json()
        results = c.post("/predict/batch", json={"texts": TEXTS}).json()["results"]
    assert health["precision"] == "int8", health
    q = health["quantization"]
    assert q["linear_layers"] == linear_weights(loaded.model)[0] > 0 and q["linear_share"] > 0.9
    assert 0 <= q["probe_drift"] <= MAX_DRIFT and q["engine"]
    got = torch.tensor([[r["all_probabilities"][name] for name in AG_NEWS_LABELS] for r in results])
    diff = float((got - fp32).abs().max())
    assert 0 < diff <= MAX_DRIFT, f"int8 answers differ from fp32 by {diff}: not int8, or too far from fp32"


def test_fp32_server_reports_fp32(good):
    with TestClient(create_app(ServingSettings(checkpoint=good, device="cpu", torch_threads=0))) as c:
        health = c.get("/health").json()
    assert health["precision"] == "fp32" and health["quantization"] is None


def test_int8_replaces_exactly_the_linear_layers(good):
    fp32 = load_checkpoint(good).model
    int8 = load_in_precision(good, "cpu", "int8").model
    n_linear = sum(type(m) is torch.nn.Linear for m in fp32.modules())
    quantized = [m for m in int8.modules() if isinstance(m, torch.ao.nn.quantized.dynamic.Linear)]
    assert n_linear > 0 and len(quantized) == n_linear
    assert not any(type(m) is torch.nn.Linear for m in int8.modules())
    assert sum(isinstance(m, torch.nn.Embedding) for m in int8.modules()) == 2  # words and positions stay fp32


@pytest.mark.parametrize("value,source", [("fp16", "--quantize='fp16'"), ("int4", "--quantize='int4'")])
def test_unknown_quantize_value_is_refused_in_one_paragraph(good, value, source):
    with pytest.raises(UserError) as err:
        ServingSettings.resolve(checkpoint=good, device="cpu", quantize=value)
    message = str(err.value)
    assert source in message and "none" in message and "int8" in message and "\n" not in message


def test_unknown_quantize_value_in_the_environment_is_refused(good, monkeypatch):
    monkeypatch.setenv("DISTRINEWS_QUANTIZE", "int9")
    with pytest.raises(UserError, match="environment variable DISTRINEWS_QUANTIZE='int9' is not a precision"):
        ServingSettings.resolve(checkpoint=good, device="cpu")
    monkeypatch.setenv("DISTRINEWS_QUANTIZE", "INT8")  # the variable is read case-insensitively
    assert ServingSettings.resolve(checkpoint=good, device="cpu").quantize == "int8"


def test_int8_on_a_gpu_is_refused_before_loading(good, monkeypatch):
    # resolve_device would refuse cuda on a machine without one; pretend it accepted it.
    import distrinews_lib.serving.settings as settings_module

    monkeypatch.setattr(settings_module, "resolve_device", lambda requested: torch.device("cuda", 0))
    with pytest.raises(UserError, match="runs on the CPU only.*would run on cuda:0"):
        ServingSettings.resolve(checkpoint=good, device="cuda", quantize="int8")


def test_a_model_int8_does_not_apply_to_is_refused_at_startup(tmp_path):
    path = gpt2_checkpoint(tmp_path / "gpt2.pt")
    load_in_precision(path, "cpu")  # it serves in fp32: the refusal below is int8's
    with pytest.raises(CheckpointError) as err:
        load_in_precision(path, "cpu", "int8")
    message = " ".join(str(err.value).split())
    assert "does not apply" in message and str(path) in message and "Conv1D" in message, message
    with pytest.raises(CheckpointError, match="does not apply"):
        with TestClient(create_app(ServingSettings(checkpoint=path, device="cpu", torch_threads=0, quantize="int8"))):
            pass  # the server must not start


@pytest.fixture(scope="module")
def drifting(good, tmp_path_factory):
    """A checkpoint that int8 applies to (its Linear layers hold its weights) but whose int8 answers drift."""
    path = tampered(good, tmp_path_factory.mktemp("drift") / "outliers.pt", outlier_weights)
    probs = predict_proba(load_checkpoint(path), TEXTS)
    assert bool(torch.isfinite(probs).all())  # fp32 answers it
    return path


DRIFT = "would change checkpoint .* answers too much"


def test_loading_in_int8_leaves_the_answers_to_the_check(drifting):
    """Loading is one thing, checking the answers another: the drift shows only when the answers are checked."""
    int8 = load_in_precision(drifting, "cpu", "int8")
    assert int8.precision == "int8" and "probe_drift" not in int8.quantization
    with pytest.raises(CheckpointError, match=DRIFT):
        check_for_serving(drifting, "cpu", "int8")
    assert check_for_serving(drifting, "cpu").precision == "fp32"  # it serves in fp32: the refusal is int8's


def test_a_model_int8_would_break_is_refused_by_every_way_the_server_starts(drifting):
    settings = ServingSettings(checkpoint=drifting, device="cpu", torch_threads=0, quantize="int8")
    with pytest.raises(CheckpointError, match=DRIFT):
        with TestClient(create_app(settings)):  # the lifespan loads it
            pass  # the server must not start
    with pytest.raises(CheckpointError, match=DRIFT):
        with TestClient(create_app(settings, loaded=load_checkpoint(drifting))):  # handed fp32, asked for int8
            pass
    with pytest.raises(CheckpointError, match=DRIFT):
        ready_to_serve(load_checkpoint(drifting), "int8")


def test_an_int8_checkpoint_cannot_go_back_to_fp32(good):
    int8 = load_in_precision(good, "cpu", "int8")
    with pytest.raises(CheckpointError, match="is loaded in int8 already; load it again to serve it in fp32"):
        ready_to_serve(int8, "none")


@pytest.mark.parametrize(
    "kind,argv,words",
    [
        ("good", ["--quantize", "fp8"], "--quantize='fp8' is not a precision this server offers"),
        ("gpt2", ["--quantize", "int8"], "does not apply to checkpoint"),
        ("drifting", ["--quantize", "int8"], "answers too much: a class probability moved by"),
    ],
)
def test_command_line_refuses_with_exit_code_2(request, tmp_path, kind, argv, words, capsys, monkeypatch):
    import uvicorn

    from distrinews_lib.serving.__main__ import main

    def started(*args, **kwargs):
        raise AssertionError("the server started")

    monkeypatch.setattr(uvicorn.Server, "run", started)
    checkpoint = gpt2_checkpoint(tmp_path / "gpt2.pt") if kind == "gpt2" else request.getfixturevalue(kind)
    with pytest.raises(SystemExit) as stopped:
        main(["--checkpoint", str(checkpoint), "--port", "0", "--device", "cpu", *argv])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "Traceback" not in err and err.count("error:") == 1, err
    assert words in " ".join(err.split()), err


def test_load_in_precision_refuses_an_unknown_precision(good):
    with pytest.raises(CheckpointError, match="--quantize 'fp16': choose one of none, int8"):
        load_in_precision(good, "cpu", "fp16")


@pytest.mark.slow
def test_a_real_server_refuses_int8_where_it_does_not_apply(tmp_path):
    """`python -m distrinews_lib.serving --quantize int8` on a GPT-2 classifier: the process exits 2 before it
    listens, with one paragraph that names the checkpoint and the reason, and no traceback."""
    import subprocess
    import sys

    from .test_serving_live import ROOT, child_env, free_port

    path = gpt2_checkpoint(tmp_path / "gpt2.pt")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "distrinews_lib.serving",
            "--checkpoint",
            str(path),
            "--device",
            "cpu",
            "--port",
            str(free_port()),
            "--quantize",
            "int8",
        ],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    said = " ".join(r.stderr.split())
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "Uvicorn running" not in r.stderr, r.stderr
    assert f"--quantize int8 does not apply to checkpoint {path}" in said and "Conv1D" in said, said
    assert "Serve it without --quantize." in said, said


@pytest.mark.slow
def test_a_real_int8_server_reports_int8_and_answers(good, tmp_path):
    """The real process with --quantize int8: /health says int8 and how it was quantized, /predict answers as the
    int8 model loaded here does."""
    import httpx

    from .test_serving_live import free_port, start, stop, wait_ready

    port, log = free_port(), tmp_path / "server.log"
    proc = start(
        [
            "-m",
            "distrinews_lib.serving",
            "--checkpoint",
            str(good),
            "--device",
            "cpu",
            "--port",
            str(port),
            "--quantize",
            "int8",
            "--log-level",
            "warning",
        ],
        log,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(proc, url, log)
        health = httpx.get(url + "/health", timeout=10).json()
        answer = httpx.post(url + "/predict", json={"text": TEXTS[0]}, timeout=10).json()
    finally:
        stop(proc)
    assert health["precision"] == "int8" and health["quantization"]["linear_layers"] > 0, health
    here = predict_proba(load_in_precision(good, "cpu", "int8"), TEXTS[:1])[0].tolist()
    assert list(answer["all_probabilities"].values()) == pytest.approx(here, abs=1e-4), (answer, here)


def test_a_refusal_never_breaks_a_path_or_a_flag_across_lines():
    from distrinews_lib.errors import format_user_error

    path = "/tmp/pytest-of-root/pytest-68/test_a_real_server_refuses-int8-where-it-does-not-apply0/gpt2-small.pt"
    text = format_user_error(CheckpointError(f"--quantize int8 does not apply to checkpoint {path}: " + "words " * 30))
    assert path in text.replace("\n       ", " ").split() or f"{path}:" in text.split(), text
    assert all(len(line) <= 100 or " " not in line.strip() for line in text.splitlines()), text
