"""The classification API in-process (FastAPI TestClient) and the micro-batcher on its own.

The real-uvicorn and command-line tests are in test_serving_live.py.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import torch
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distrinews_lib.checkpoint import save_checkpoint
from distrinews_lib.data.texts import AG_NEWS_LABELS
from distrinews_lib.models.build import build_model
from distrinews_lib.serving.app import create_app
from distrinews_lib.serving.batching import BatcherStopped, DeadlineExceeded, MicroBatcher, Overloaded
from distrinews_lib.serving.inference import CheckpointError, Classifier, load_checkpoint, predict_proba
from distrinews_lib.serving.schemas import MAX_BATCH_TEXTS, MAX_BODY_BYTES, MAX_TEXT_CHARS
from distrinews_lib.serving.settings import ServingSettings
from distrinews_lib.training.config import RunConfig

METADATA = {
    "data_source": "synthetic",
    "final_accuracy": 0.5,
    "world_size": 2,
    "model": "tiny",
    "created": "2024-01-01T00:00:00",
    "versions": {"torch": str(torch.__version__)},
}
# Different lengths and words, so the (random) model gives visibly different probabilities.
TEXTS = [
    "Stocks rally on Wall Street.",
    "Federer wins Wimbledon again after a long five set final against Nadal.",
    "NASA launches a probe",
    "Oil prices climb as OPEC agrees to cut production for the rest of the year, traders say.",
    "UN talks",
]


def make_checkpoint(path):
    """A tiny random DistilBERT, with weights spread wider than its init so texts get distinct answers."""
    model, tokenizer, _ = build_model(RunConfig(model="tiny", seed=0), AG_NEWS_LABELS)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return save_checkpoint(path, model, tokenizer, AG_NEWS_LABELS, METADATA, max_length=64)


@pytest.fixture(scope="module")
def ckpt_path(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("serving") / "m.pt")


@pytest.fixture(scope="module")
def loaded(ckpt_path):
    return load_checkpoint(ckpt_path)


@pytest.fixture(scope="module")
def client(ckpt_path):
    # torch_threads=0: leave the test process's torch settings alone.
    app = create_app(
        ServingSettings(checkpoint=ckpt_path, device="cpu", max_batch_size=8, batch_window_ms=2, torch_threads=0)
    )
    with TestClient(app) as c:
        yield c


def expected(loaded, texts):
    return predict_proba(loaded, texts).tolist()


def assert_matches(result, probs, tol=1e-5):
    assert list(result["all_probabilities"]) == AG_NEWS_LABELS
    got = list(result["all_probabilities"].values())
    assert got == pytest.approx(probs, abs=tol)
    assert sum(got) == pytest.approx(1.0, abs=1e-5)
    best = max(range(len(probs)), key=probs.__getitem__)
    assert result["label"] == AG_NEWS_LABELS[best]
    assert result["confidence"] == pytest.approx(probs[best], abs=tol)


# ----------------------------------------------------------------------------- endpoints


def test_importing_the_module_loads_no_model():
    from distrinews_lib.serving import app as module

    assert module.app.state.classifier is None and module.app.state.status == "loading"


def test_health_reports_model_and_metadata(client, ckpt_path):
    r = client.get("/health")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok" and body["model_loaded"] is True
    assert body["device"] == "cpu"
    assert body["labels"] == AG_NEWS_LABELS
    ck = body["checkpoint"]
    # The file name only: where the server keeps its files is none of its clients' business.
    assert ck["file"] == ckpt_path.name and "path" not in ck
    assert str(ckpt_path.parent) not in r.text
    assert (ck["data_source"], ck["final_accuracy"], ck["world_size"], ck["model"]) == ("synthetic", 0.5, 2, "tiny")
    assert ck["max_length"] == 64 and ck["versions"]["torch"] == torch.__version__
    assert body["batching"]["max_batch_size"] == 8
    assert body["limits"] == {
        "max_text_chars": MAX_TEXT_CHARS,
        "max_batch_texts": MAX_BATCH_TEXTS,
        "max_body_bytes": MAX_BODY_BYTES,
    }


def test_not_ready_gives_503(ckpt_path):
    app = create_app(ServingSettings(checkpoint=ckpt_path, torch_threads=0))
    c = TestClient(app)  # not entered: the lifespan has not run, so no model is loaded
    r = c.get("/health")
    assert r.status_code == 503 and r.json()["model_loaded"] is False and r.json()["status"] == "loading"
    for path, body in (("/predict", {"text": "hi"}), ("/predict/batch", {"texts": ["hi"]})):
        r = c.post(path, json=body)
        assert r.status_code == 503 and "not loaded" in r.json()["detail"]


def test_predict_matches_predict_proba(client, loaded):
    probs = expected(loaded, TEXTS)
    assert len({round(p[0], 6) for p in probs}) > 1, "test model should answer differently per text"
    for text, p in zip(TEXTS, probs):
        r = client.post("/predict", json={"text": text})
        assert r.status_code == 200, r.text
        assert_matches(r.json(), p)


def test_batch_matches_predict_proba_and_single_results(client, loaded):
    texts = TEXTS + TEXTS[::-1]
    r = client.post("/predict/batch", json={"texts": texts})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert len(results) == len(texts)
    for result, p in zip(results, expected(loaded, texts)):
        assert_matches(result, p)
    singles = [client.post("/predict", json={"text": t}).json() for t in texts]
    for single, batched in zip(singles, results):
        assert single["label"] == batched["label"]
        assert list(single["all_probabilities"].values()) == pytest.approx(
            list(batched["all_probabilities"].values()), abs=1e-5
        )


def test_long_allowed_text_is_truncated_like_predict_proba(client, loaded):
    text = ("word " * 2000)[:MAX_TEXT_CHARS]  # far more than max_length=64 tokens
    r = client.post("/predict", json={"text": text})
    assert r.status_code == 200
    assert_matches(r.json(), expected(loaded, [text])[0])


def test_full_batch_at_the_limit(client):
    r = client.post("/predict/batch", json={"texts": [f"headline number {i}" for i in range(MAX_BATCH_TEXTS)]})
    assert r.status_code == 200 and len(r.json()["results"]) == MAX_BATCH_TEXTS


def test_concurrent_requests_each_get_their_own_answer(client, loaded):
    from concurrent.futures import ThreadPoolExecutor

    texts = [TEXTS[i % len(TEXTS)] + " " + "x " * (i % 7) for i in range(40)]
    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda t: client.post("/predict", json={"text": t}), texts))
    for r, p in zip(responses, expected(loaded, texts)):
        assert r.status_code == 200
        assert_matches(r.json(), p)


def test_head_health_answers_like_get_without_a_body(client):
    r = client.head("/health")
    assert r.status_code == 200 and r.content == b""
    assert r.headers["content-type"] == "application/json"


def test_docs_page_works_offline(client):
    import re

    page = client.get("/docs")
    assert page.status_code == 200 and "SwaggerUIBundle" in page.text
    # Everything the page loads comes from this server: nothing from a CDN.
    urls = re.findall(r'(?:src|href)="([^"]+)"', page.text) + re.findall(r"url: '([^']+)'", page.text)
    assert urls and not [u for u in urls if "://" in u or u.startswith("//")], urls
    assert '"validatorUrl": null' in page.text  # no badge that would send the schema to validator.swagger.io
    for url in urls:
        r = client.get(url)
        assert r.status_code == 200, url
    assert "SwaggerUIBundle" in client.get("/docs/assets/swagger-ui-bundle.js").text
    assert ".swagger-ui" in client.get("/docs/assets/swagger-ui.css").text
    # The licence travels with the vendored files.
    assert "Apache License" in client.get("/docs/assets/LICENSE").text


def test_schema_pattern_and_server_agree_on_blank_texts(client):
    """The OpenAPI `pattern` of a text and the server's own check must refuse exactly the same texts."""
    import re

    pattern = client.get("/openapi.json").json()["components"]["schemas"]["PredictRequest"]["properties"]["text"][
        "pattern"
    ]
    candidates = [chr(c) for c in range(0x3001) if chr(c).isspace()] + [
        "\u200b",
        "\ufeff",
        "\x00",
        "\x1b",
        "a",
        "é",
        "\U0001f600",
    ]
    texts = [c * 3 for c in candidates]
    r = client.post("/predict/batch", json={"texts": texts[:MAX_BATCH_TEXTS]})
    refused = {e["field"] for e in r.json().get("errors", [])} if r.status_code == 422 else set()
    for i, text in enumerate(texts[:MAX_BATCH_TEXTS]):
        schema_valid = re.search(pattern, text) is not None
        assert schema_valid == (f"texts[{i}]" not in refused), (repr(text), schema_valid)
    assert refused and len(refused) < len(texts), "both kinds must be present"


# ----------------------------------------------------------------------------- bad input

JSON = {"content-type": "application/json"}
BAD_INPUTS = [
    # (path, raw body, status, words the message must contain)
    ("/predict", b'{"text": ""}', 422, ["text", "empty"]),
    ("/predict", b'{"text": "   \\n\\t  "}', 422, ["text", "whitespace"]),
    ("/predict", b'{"text": 42}', 422, ["text", "string"]),
    ("/predict", b'{"text": null}', 422, ["text", "string"]),
    ("/predict", b'{"text": ["a", "b"]}', 422, ["text", "string"]),
    ("/predict", b"{}", 422, ["text", "required"]),
    ("/predict", b'{"txt": "typo"}', 422, ["text", "required"]),
    ("/predict", b'{"text": "unterminated"', 400, ["not valid JSON"]),
    ("/predict", b"this is not json", 400, ["not valid JSON"]),
    ("/predict", b'{"text": "caf\xe9 in latin-1"}', 400, ["UTF-8"]),
    ("/predict", b"[" * 100_000, 400, ["JSON"]),
    ("/predict", b"", 422, ["body", "missing"]),
    ("/predict", b'["a list"]', 422, ["JSON object"]),
    ("/predict", b'"just a string"', 422, ["JSON object"]),
    ("/predict", b'{"text": "\\ud800 lone surrogate"}', 422, ["text", "Unicode"]),
    ("/predict", json.dumps({"text": "a" * (MAX_TEXT_CHARS + 1)}).encode(), 422, ["text", "10,000"]),
    ("/predict/batch", b'{"texts": []}', 422, ["texts", "at least one"]),
    ("/predict/batch", json.dumps({"texts": ["a"] * (MAX_BATCH_TEXTS + 1)}).encode(), 422, ["texts", "64"]),
    ("/predict/batch", b'{"texts": ["fine", ""]}', 422, ["texts[1]", "empty"]),
    ("/predict/batch", b'{"texts": ["fine", "  "]}', 422, ["texts[1]", "whitespace"]),
    ("/predict/batch", b'{"texts": ["fine", 3]}', 422, ["texts[1]", "string"]),
    ("/predict/batch", b'{"texts": "not a list"}', 422, ["texts", "list"]),
    ("/predict/batch", json.dumps({"texts": ["ok", "b" * (MAX_TEXT_CHARS + 1)]}).encode(), 422, ["texts[1]", "10,000"]),
    ("/predict/batch", b'{"text": "singular"}', 422, ["texts", "required"]),
    ("/predict/batch", b'{"texts": ["a"]', 400, ["not valid JSON"]),
]


@pytest.mark.parametrize("path,body,status,words", BAD_INPUTS, ids=[f"{p}:{b[:30]!r}" for p, b, _, _ in BAD_INPUTS])
def test_bad_input_gets_4xx_with_a_message(client, path, body, status, words):
    r = client.post(path, content=body, headers=JSON)
    assert r.status_code == status, r.text
    detail = r.json()["detail"]
    for word in words:
        assert word in detail, detail
    assert r.json()["errors"], "each problem is also listed with its field"


def test_body_without_json_content_type_is_refused(client):
    r = client.post("/predict", content=b'{"text": "hello"}', headers={"content-type": "text/plain"})
    assert 400 <= r.status_code < 500 and r.json()["detail"]


def test_absurd_body_is_refused_before_parsing(client):
    r = client.post("/predict", content=b"x" * (MAX_BODY_BYTES + 1), headers=JSON)
    assert r.status_code == 413 and "larger than the limit" in r.json()["detail"]


def test_absurd_chunked_body_is_refused(client):
    def chunks():  # no Content-Length: the server must count as it reads
        for _ in range(MAX_BODY_BYTES // (1 << 20) + 2):
            yield b"x" * (1 << 20)

    r = client.post("/predict", content=chunks(), headers=JSON)
    assert r.status_code == 413


def test_unknown_route_and_wrong_method_are_4xx(client):
    assert client.get("/nowhere").status_code == 404
    assert client.get("/predict").status_code == 405


def test_openapi_documents_models_examples_and_limits(client):
    assert client.get("/docs").status_code == 200
    spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    text = schemas["PredictRequest"]["properties"]["text"]
    assert text["maxLength"] == MAX_TEXT_CHARS and text["minLength"] == 1 and text["examples"]
    texts = schemas["BatchPredictRequest"]["properties"]["texts"]
    assert texts["maxItems"] == MAX_BATCH_TEXTS and texts["minItems"] == 1
    # Each item states the same limits as a single text, so a schema-valid request is never refused.
    assert texts["items"] == {"type": "string", "minLength": 1, "maxLength": MAX_TEXT_CHARS, "pattern": text["pattern"]}
    assert "Prediction" in schemas and "BatchPredictResponse" in schemas and "ErrorResponse" in schemas
    ok = spec["paths"]["/predict/batch"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok["$ref"].endswith("/BatchPredictResponse")
    for code in ("400", "413", "422", "503"):
        assert code in spec["paths"]["/predict"]["post"]["responses"]


# ----------------------------------------------------------------------------- fuzzing

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
texts_any = st.text(max_size=200) | st.text(alphabet=st.characters(codec="utf-8"), max_size=60)


def escaped_body(code_points):
    chars = "".join(f"\\u{c:04x}" for c in code_points)
    return ('{"text": "%s", "texts": ["%s"]}' % (chars, chars)).encode()


bodies = st.one_of(
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"text": texts_any | json_values}).map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"texts": st.lists(texts_any | json_values, max_size=MAX_BATCH_TEXTS + 3)}).map(
        lambda v: json.dumps(v).encode()
    ),
    st.binary(max_size=200),
    # JSON with escapes that decode to odd code points (lone surrogates, controls, NUL).
    st.lists(st.integers(0, 0xFFFF), min_size=1, max_size=5).map(escaped_body),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    path=st.sampled_from(["/predict", "/predict/batch"]),
    body=bodies,
    content_type=st.sampled_from(["application/json", "text/plain", None]),
)
def test_fuzzed_bodies_never_give_5xx(client, path, body, content_type):
    headers = {"content-type": content_type} if content_type else {}
    r = client.post(path, content=body, headers=headers)
    assert r.status_code < 500, (r.status_code, r.text)
    payload = r.json()
    if r.status_code == 200:
        results = payload["results"] if path == "/predict/batch" else [payload]
        for res in results:
            assert sum(res["all_probabilities"].values()) == pytest.approx(1.0, abs=1e-5)
    else:
        assert 400 <= r.status_code < 500 and payload["detail"]


# ----------------------------------------------------------------------------- startup failures


def test_missing_checkpoint_fails_startup_with_the_path(tmp_path):
    missing = tmp_path / "nope.pt"
    with pytest.raises(CheckpointError, match="not found: .*nope.pt"):
        with TestClient(create_app(ServingSettings(checkpoint=missing, torch_threads=0))):
            pass


def test_corrupt_checkpoint_fails_startup_with_the_reason(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"definitely not a checkpoint")
    with pytest.raises(CheckpointError, match="could not be read"):
        with TestClient(create_app(ServingSettings(checkpoint=bad, torch_threads=0))):
            pass


def test_checkpoint_from_environment(ckpt_path, monkeypatch):
    monkeypatch.setenv("DISTRINEWS_CHECKPOINT", str(ckpt_path))
    with TestClient(create_app(ServingSettings(torch_threads=0))) as c:
        assert c.get("/health").json()["checkpoint"]["file"] == ckpt_path.name


def test_batching_can_be_switched_off_from_the_environment(ckpt_path, monkeypatch):
    monkeypatch.setenv("DISTRINEWS_BATCHING", "off")
    with TestClient(create_app(ServingSettings(checkpoint=ckpt_path, torch_threads=0))) as c:
        assert c.get("/health").json()["batching"]["max_batch_size"] == 1
        assert c.post("/predict", json={"text": "still answers"}).status_code == 200


def test_batching_can_be_switched_off_from_the_environment_under_the_command_line_too(monkeypatch):
    from distrinews_lib.serving.__main__ import parse_args, settings_from

    monkeypatch.setenv("DISTRINEWS_BATCHING", "off")
    settings = settings_from(parse_args(["--device", "cpu"]))
    assert (settings.max_batch_size, settings.batch_window_ms) == (1, 0.0)
    assert settings_from(parse_args(["--device", "cpu", "--max-batch-size", "8"])).max_batch_size == 8  # a flag wins


def test_bad_setting_in_the_environment_fails_startup(ckpt_path, monkeypatch):
    from distrinews_lib.errors import UserError

    monkeypatch.setenv("DISTRINEWS_MAX_BATCH_SIZE", "lots")
    with pytest.raises(UserError, match="DISTRINEWS_MAX_BATCH_SIZE"):
        with TestClient(create_app(ServingSettings(checkpoint=ckpt_path, torch_threads=0))):
            pass


# ----------------------------------------------------------------------------- the micro-batcher


def run(coro):
    return asyncio.run(coro)


def slow_echo(calls, delay=0.02):
    def predict(texts):
        calls.append(list(texts))
        time.sleep(delay)  # like a forward pass: requests keep arriving meanwhile
        return [f"result:{t}" for t in texts]

    return predict


def test_batcher_groups_concurrent_requests_and_keeps_each_answer():
    calls = []

    async def main():
        b = MicroBatcher(slow_echo(calls), max_batch_size=8, window_ms=5)
        await b.start()
        try:
            return await asyncio.gather(*(b.submit(f"t{i}") for i in range(30)))
        finally:
            await b.stop()

    results = run(main())
    assert results == [f"result:t{i}" for i in range(30)]
    assert len(calls) < 30, "concurrent requests should share forward passes"
    assert max(len(c) for c in calls) <= 8


def test_batcher_with_batch_size_one_runs_each_alone():
    calls = []

    async def main():
        b = MicroBatcher(slow_echo(calls, 0.001), max_batch_size=1, window_ms=0)
        await b.start()
        try:
            return await asyncio.gather(*(b.submit(f"t{i}") for i in range(10)))
        finally:
            await b.stop()

    assert run(main()) == [f"result:t{i}" for i in range(10)]
    assert all(len(c) == 1 for c in calls) and len(calls) == 10


def test_batcher_isolates_a_failing_text():
    def predict(texts):
        if "bad" in texts:
            raise ValueError("cannot classify 'bad'")
        return [t.upper() for t in texts]

    async def main():
        b = MicroBatcher(predict, max_batch_size=16, window_ms=5)
        await b.start()
        try:
            return await asyncio.gather(*(b.submit(t) for t in ["a", "bad", "c"]), return_exceptions=True)
        finally:
            await b.stop()

    a, bad, c = run(main())
    assert (a, c) == ("A", "C")
    assert isinstance(bad, ValueError)


def test_batcher_refuses_when_stopped_and_fails_waiting_requests():
    async def main():
        b = MicroBatcher(slow_echo([], 0.2), max_batch_size=1, window_ms=0)
        with pytest.raises(BatcherStopped):
            await b.submit("before start")
        await b.start()
        tasks = [asyncio.ensure_future(b.submit(f"t{i}")) for i in range(3)]
        await asyncio.sleep(0.05)  # the first is running, the others wait in the queue
        await b.stop()
        return await asyncio.gather(*tasks, return_exceptions=True)

    results = run(main())
    assert any(isinstance(r, BatcherStopped) for r in results)
    assert all(isinstance(r, (str, BatcherStopped)) for r in results)


# ----------------------------------------------------------------------------- the bounded queue


def test_batcher_queue_is_bounded_in_requests():
    calls = []

    async def main():
        b = MicroBatcher(slow_echo(calls, 0.2), max_batch_size=1, window_ms=0, max_queue=2)
        await b.start()
        try:
            first = asyncio.ensure_future(b.submit("running"))
            await asyncio.sleep(0.05)  # the worker has taken it: it is in the model, not in the queue
            waiting = [asyncio.ensure_future(b.submit(f"w{i}")) for i in range(2)]
            await asyncio.sleep(0)
            with pytest.raises(Overloaded) as refused:
                await b.submit("one too many")
            assert refused.value.retry_after >= 1 and "overloaded" in str(refused.value)
            assert (b.waiting_jobs, b.shed) == (2, 1)
            return await asyncio.gather(first, *waiting)
        finally:
            await b.stop()

    assert run(main()) == ["result:running", "result:w0", "result:w1"]
    assert "one too many" not in sum(calls, [])


def test_batcher_queue_is_bounded_in_texts():
    calls = []

    async def main():
        b = MicroBatcher(slow_echo(calls, 0.2), max_batch_size=8, window_ms=0, max_queue=100, max_queue_texts=64)
        await b.start()
        try:
            first = asyncio.ensure_future(b.run_now([f"a{i}" for i in range(64)]))
            await asyncio.sleep(0.05)  # in the model
            second = asyncio.ensure_future(b.run_now([f"b{i}" for i in range(64)]))  # fills the queue's 64 texts
            await asyncio.sleep(0)
            for texts in ([f"c{i}" for i in range(64)], ["one more text"]):
                with pytest.raises(Overloaded):
                    b.enqueue(texts, single=len(texts) == 1)
            assert (b.waiting_jobs, b.waiting_texts, b.shed) == (1, 64, 2)
            return await asyncio.gather(first, second)
        finally:
            await b.stop()

    first, second = run(main())
    assert first == [f"result:a{i}" for i in range(64)] and second == [f"result:b{i}" for i in range(64)]
    assert [len(c) for c in calls] == [64, 64], "a /predict/batch call is one forward pass of its own"


def test_batcher_drops_a_job_past_its_deadline_before_the_model():
    calls = []

    async def main():
        b = MicroBatcher(slow_echo(calls, 0.3), max_batch_size=1, window_ms=0, deadline_s=0.1)
        await b.start()
        try:
            return await asyncio.gather(b.submit("in time"), b.submit("too late"), return_exceptions=True), b
        finally:
            await b.stop()

    (first, second), b = run(main())
    assert first == "result:in time"  # it reached the model in time; the batcher itself does not cut it
    assert isinstance(second, DeadlineExceeded)
    assert calls == [["in time"]], "the expired request must never reach the model"
    assert (b.expired, b.texts_dropped, b.waiting_jobs) == (1, 1, 0)


def test_batcher_drops_a_cancelled_job_before_the_model_and_frees_its_place():
    calls = []

    async def main():
        b = MicroBatcher(slow_echo(calls, 0.2), max_batch_size=4, window_ms=0, max_queue=2)
        await b.start()
        try:
            first = b.enqueue(["running"], single=True)
            await asyncio.sleep(0.05)
            gone = b.enqueue(["client left"], single=True)
            kept = b.enqueue(["client stays"], single=True)
            b.cancel(gone, "abandoned")  # what the app does when the client disconnects
            assert (b.waiting_jobs, b.waiting_texts) == (1, 1), "the place is free at once"
            b.enqueue(["fits again"], single=True)
            return [await first.future, await kept.future], b
        finally:
            await b.stop()

    (first, kept), b = run(main())
    assert first == ["result:running"] and kept == ["result:client stays"]
    assert "client left" not in sum(calls, []), "abandoned work must not reach the model"
    assert b.abandoned == 1 and b.texts_dropped == 1


def test_batch_calls_never_share_a_forward_pass_with_single_texts():
    calls = []

    async def main():
        b = MicroBatcher(slow_echo(calls, 0.05), max_batch_size=32, window_ms=5)
        await b.start()
        try:
            jobs = [b.submit("s1"), b.run_now(["b1", "b2"]), b.submit("s2"), b.submit("s3"), b.run_now(["b3"])]
            return await asyncio.gather(*jobs)
        finally:
            await b.stop()

    assert run(main()) == ["result:s1", ["result:b1", "result:b2"], "result:s2", "result:s3", ["result:b3"]]
    assert ["b1", "b2"] in calls and ["b3"] in calls
    assert all(c in (["b1", "b2"], ["b3"]) or all(t.startswith("s") for t in c) for c in calls)


# ----------------------------------------------------------------------------- overload, through the app


@pytest.fixture()
def slow_model(monkeypatch):
    """The real model, made slower (as a big model on a CPU would be); returns the list of texts it ran."""
    seen = []
    original = Classifier.predict

    def predict(self, texts):
        seen.append(list(texts))
        time.sleep(0.4)
        return original(self, texts)

    monkeypatch.setattr(Classifier, "predict", predict)
    return seen


def concurrently(client, requests):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(lambda r: client.post(r[0], json=r[1]), requests))


def test_full_queue_answers_503_with_retry_after(ckpt_path, loaded, slow_model):
    app = create_app(
        ServingSettings(
            checkpoint=ckpt_path, device="cpu", max_batch_size=1, torch_threads=0, max_queue=2, max_queue_texts=64
        )
    )
    requests = [("/predict", {"text": t}) for t in TEXTS] + [("/predict/batch", {"texts": TEXTS})]
    with TestClient(app) as c:
        responses = concurrently(c, requests)
        codes = sorted(r.status_code for r in responses)
        assert set(codes) == {200, 503} and codes.count(503) >= 2, codes
        for (path, body), r in zip(requests, responses):
            if r.status_code == 503:
                assert "overloaded" in r.json()["detail"] and int(r.headers["Retry-After"]) >= 1
            elif path == "/predict":
                assert_matches(r.json(), expected(loaded, [body["text"]])[0])
            else:
                for result, p in zip(r.json()["results"], expected(loaded, TEXTS)):
                    assert_matches(result, p)
        queue = c.get("/health").json()["queue"]
        assert queue["shed"] == codes.count(503) and queue["max_requests"] == 2 and queue["waiting_requests"] == 0


def test_request_past_its_deadline_gets_503_and_waiting_ones_never_reach_the_model(ckpt_path, slow_model):
    app = create_app(
        ServingSettings(checkpoint=ckpt_path, device="cpu", max_batch_size=1, torch_threads=0, deadline_s=0.15)
    )
    with TestClient(app) as c:
        slow_model.clear()
        responses = concurrently(c, [("/predict", {"text": t}) for t in TEXTS[:3]])
        for r in responses:
            assert r.status_code == 503, r.text
            assert "deadline of 0.15 s" in r.json()["detail"] and int(r.headers["Retry-After"]) >= 1
        time.sleep(0.5)  # let the one forward pass that had started finish
        assert len(slow_model) == 1, f"only the request already in the model may run, not {slow_model}"
        queue = c.get("/health").json()["queue"]
        assert queue["expired"] == 2 and queue["texts_unused"] == 1 and queue["deadline_s"] == 0.15


def test_every_setting_is_documented(capsys):
    """Each default is written once (settings.SETTINGS and OPTIONS): app.py's docstring and docs/serving.md's table are
    generated from them and say the same, and every flag and variable is in --help and docs/serving.md."""
    from pathlib import Path

    from distrinews_lib.serving import app as app_module
    from distrinews_lib.serving.__main__ import parse_args
    from distrinews_lib.serving.settings import OPTIONS, SETTINGS, settings_markdown, settings_table

    serving = (Path(__file__).resolve().parent.parent / "docs" / "serving.md").read_text()  # the operator's page
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    help_text = capsys.readouterr().out
    assert settings_markdown() in serving, "docs/serving.md's table of limits differs from settings.settings_markdown()"
    assert settings_table() in app_module.__doc__ and "{" not in app_module.__doc__
    for s in SETTINGS:
        for where, text in (("app.py's docstring", app_module.__doc__), ("the page", serving), ("--help", help_text)):
            assert s.flag in text and s.env in text, f"{s.flag} / {s.env} missing from {where}"
        row = next(line for line in app_module.__doc__.splitlines() if s.env in line)
        assert f" {s.default:g} " in row or f" {s.default} " in row, row
    for o in OPTIONS:
        assert o.env in app_module.__doc__ and (o.flag in help_text if o.flag else o.env in serving), o
    # The defaults app.py's prose quotes are filled in from the table too.
    defaults = {s.name: s.default for s in SETTINGS}
    assert (
        f"--limit-concurrency {defaults['limit_concurrency']} --timeout-keep-alive {defaults['timeout_keep_alive']}"
        in " ".join(app_module.__doc__.split())
    )


def test_header_limits_of_the_app(ckpt_path):
    """The app's own 431 (for servers whose protocol does not limit headers), with the limits it was given."""
    limits = ServingSettings(checkpoint=ckpt_path, torch_threads=0, max_headers=20, max_header_bytes=4096)
    with TestClient(create_app(limits)) as c:
        many = {f"x-h{i}": "y" for i in range(25)}
        r = c.get("/health", headers=many)
        assert r.status_code == 431 and "20 header lines" in r.json()["detail"]
        assert c.get("/health", headers={"x-big": "a" * 5000}).status_code == 431
        assert c.get("/health", headers={f"x-h{i}": "y" for i in range(10)}).status_code == 200
