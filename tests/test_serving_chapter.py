"""Chapter 10's machinery: the live server (the real CLI process), the load test, the claims and the exercises'
checkers. Each claim fails on a wrong figure; each checker names the mistake of each wrong answer (a mutant)."""

from __future__ import annotations

import errno
import importlib.util
import os
import time
from pathlib import Path

import pytest

from distrinews_course.attempt import grade
from distrinews_course.latency_under_load import (
    BatchCost,
    LoadLevel,
    batching_pays,
    cost_per_text,
    first_step,
    latency_under_load,
    littles_law_holds,
    load_paragraph,
    load_table,
    requests_grouped,
    throughput_grows,
)
from distrinews_course.live_server import (
    ServerDidNotStart,
    answers_disagree,
    batch_sender,
    call,
    left_behind,
    running_server,
    start_server,
    stop_server,
)
from distrinews_course.serving_exercises import STATUS_REQUESTS, client_cases, status_cases

from .test_serving import make_checkpoint

ROOT = Path(__file__).resolve().parent.parent
LIMITS = {"max_text_chars": 10_000, "max_batch_texts": 64}


def _answers():
    spec = importlib.util.spec_from_file_location("answers_10", ROOT / "notebooks" / "answers" / "10_serving.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ANSWERS = _answers()


# --- exercise 1: the batching client, against the stand-in server ----------------------------------------------


def over_limit(texts, send, limit):
    return ANSWERS.classify_all(texts, send, limit + 1)


def drops_the_tail(texts, send, limit):
    labels = []
    for start in range(0, len(texts) - limit + 1, limit):  # whole chunks only
        labels += [r["label"] for r in send(texts[start : start + limit])[1]["results"]]
    return labels


def one_per_call(texts, send, limit):
    return ANSWERS.classify_all(texts, send, 1)


def skips_busy_chunks(texts, send, limit):
    labels = []
    for start in range(0, len(texts), limit):
        status, answer, _ = send(texts[start : start + limit])
        if status == 200:
            labels += [r["label"] for r in answer["results"]]
    return labels


def retries_at_once(texts, send, limit):
    labels = []
    for start in range(0, len(texts), limit):
        status, answer, _ = send(texts[start : start + limit])
        while status == 503:
            status, answer, _ = send(texts[start : start + limit])
        labels += [r["label"] for r in answer["results"]]
    return labels


def ignores_the_status(texts, send, limit):
    labels = []
    for start in range(0, len(texts), limit):
        labels += [r["label"] for r in send(texts[start : start + limit])[1]["results"]]
    return labels


def last_chunk_first(texts, send, limit):
    starts = list(range(0, len(texts), limit))
    return [label for s in reversed(starts) for label in ANSWERS.classify_all(texts[s : s + limit], send, limit)]


def labels_reversed(texts, send, limit):
    return ANSWERS.classify_all(texts, send, limit)[::-1]


def returns_results(texts, send, limit):
    out = []
    for start in range(0, len(texts), limit):
        out += send(texts[start : start + limit])[1]["results"]
    return out


def test_the_reference_client_passes_every_case():
    result = grade(ANSWERS.classify_all, client_cases(64), quiet=True)
    assert result.ok, result.failed


@pytest.mark.parametrize(
    "mutant, says",
    [
        (over_limit, "a call carried 65 texts; /predict/batch takes at most 64"),
        (drops_the_tail, "text(s) at the end were never sent"),
        (one_per_call, "130 calls for 130 texts; chunks of up to 64 need 3"),
        (skips_busy_chunks, "the chunk answered 503 was not sent again"),
        (retries_at_once, "after a 503 that asked to wait 0.05 s"),
        (ignores_the_status, "read 'results' from a 503 answer"),
        (last_chunk_first, "the texts were not sent in order"),
        (labels_reversed, "labels out of order"),
        (returns_results, "return the labels themselves"),
    ],
    ids=lambda x: getattr(x, "__name__", "says"),
)
def test_the_client_checker_names_each_mistake(mutant, says):
    result = grade(mutant, client_cases(64), quiet=True)
    assert not result.ok and says in result.failed, result.failed
    assert "\n" not in result.failed, "one line"


def test_an_untouched_client_is_not_attempted_yet():
    def classify_all(texts, send, limit):
        raise NotImplementedError

    result = grade(classify_all, client_cases(64), quiet=True)
    assert not result.attempted and result.failed is None


# --- the claims fail on wrong figures ------------------------------------------------------------------------------


def level(clients, per_s, mean_batch=1.0, errors=0, p50=5.0):
    return LoadLevel(clients, int(per_s), errors, 1.0, per_s, p50, 2 * p50, 3 * p50, mean_batch)


def test_batching_pays_only_when_a_batched_text_costs_at_most_half():
    assert batching_pays([BatchCost(1, 6.0, 5), BatchCost(64, 16.0, 5)])
    assert not batching_pays([BatchCost(1, 6.0, 5), BatchCost(64, 64 * 4.0, 5)]), "4 ms a text against 6: not 2x"
    assert not batching_pays([BatchCost(1, 6.0, 5), BatchCost(64, 64 * 6.0, 5)]), "no gain at all"


def test_throughput_grows_fails_on_a_flat_curve_or_errors():
    assert throughput_grows([level(1, 250), level(32, 1200, 20)])
    assert not throughput_grows([level(1, 250), level(32, 300, 1)]), "no batching: flat"
    assert not throughput_grows([level(1, 250), level(32, 1200, 20, errors=3)]), "errors under load"


def test_requests_grouped_fails_at_one_request_per_pass():
    assert requests_grouped([level(1, 250), level(32, 1200, 20.6)])
    assert not requests_grouped([level(1, 250), level(32, 1200, 1.0)])


def test_littles_law_fails_when_the_figures_hold_more_or_fewer_requests_than_clients():
    def at(clients, per_s, mean_ms):
        return LoadLevel(clients, int(per_s), 0, 1.0, per_s, mean_ms, mean_ms, mean_ms, 1.0, mean_ms)

    assert littles_law_holds([at(1, 550, 1.8), at(32, 2366, 13.2)]), "0.99 and 31.2 in flight: one per client"
    assert not littles_law_holds([at(1, 550, 1.8), at(32, 2366, 20.0)]), "47 in flight from 32 clients"
    assert not littles_law_holds([at(1, 550, 1.8), at(32, 2366, 6.9)]), "a latency missing half: 16 of 32"
    assert not littles_law_holds([at(1, 550, float("nan"))]), "no mean latency recorded"
    assert not littles_law_holds([])
    failed = LoadLevel(32, 2366, 5, 1.0, 2366, 13.2, 13.2, 13.2, 1.0, 13.2)
    assert not littles_law_holds([at(1, 550, 1.8), failed]), "5 requests failed: the law is not measured on them"


def test_the_load_paragraph_names_a_first_step_that_gave_nothing():
    dip = [level(1, 550, 1.0, p50=1.8), level(2, 525, 1.0, p50=3.8), level(4, 927, 2.0), level(32, 2384, 17.5)]
    said = load_paragraph(dip)
    assert "From 1 to 2 clients the answers per second did not grow (550 -> 525)" in said
    assert "still ran 1.0 request" in said and "p50 1.8 -> 3.8 ms" in said
    assert "added waiting, not answers" in said and "this run does not test" in said  # the cause: a guess only
    assert "started at 4 clients (2.0 per pass)" in said
    assert "2,384 a second, 4.3x as many" in said and "still grew 2.57x" in said


def test_the_first_step_says_nothing_when_it_grew_and_no_turns_when_it_grouped():
    assert first_step([level(1, 550), level(2, 900, 1.8), level(32, 2384, 17.5)]) == "", "grew 1.6x: nothing to say"
    grouped = first_step([level(1, 550), level(2, 540, 1.8), level(32, 2384, 17.5)])
    assert grouped.startswith("From 1 to 2 clients") and "added waiting" not in grouped, "1.8 per pass: it grouped"
    assert "hardly grew" in first_step([level(1, 550), level(2, 560, 1.0), level(32, 2384, 17.5)])
    assert "flattened" in load_paragraph([level(1, 550), level(16, 2300, 8.0), level(32, 2384, 17.5)])


def test_answers_disagree_names_the_first_difference():
    import torch

    probs = torch.tensor([[0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.7]])
    labels = ["World", "Sports", "Business", "Sci/Tech"]

    def answer(p):
        return {"label": labels[int(p.argmax())], "all_probabilities": {n: float(q) for n, q in zip(labels, p)}}

    right = [answer(p) for p in probs]
    assert answers_disagree(right, probs, labels) is None
    wrong_label = [right[0], {**right[1], "label": "World"}]
    assert "text 1: the server said World" in answers_disagree(wrong_label, probs, labels)
    moved = [right[0], answer(torch.tensor([0.1, 0.1, 0.1005, 0.6995]))]
    assert "text 1: P(Business)" in answers_disagree(moved, probs, labels)
    assert answers_disagree(right[:1], probs, labels) == "1 answers for 2 texts"


def test_the_figures_take_the_measurements():
    from distrinews_course.serving_figures import draw_rank0_to_server, plot_cost_per_text, plot_latency_under_load

    fig = plot_latency_under_load([level(1, 250), level(4, 400, 2.2), level(32, 1200, 20.6)])
    lat, thr = fig.axes
    assert lat.get_ylabel() == "latency (ms)" and thr.get_ylabel() == "answered requests / s"
    assert [t.get_text() for t in thr.texts if t.get_text()[0].isdigit()] == ["1.0", "2.2", "20.6"]
    fig = plot_cost_per_text([BatchCost(1, 6.0, 5), BatchCost(64, 16.0, 5)])
    assert "in a batch of 64: 0.25 ms" in fig.axes[0].get_title()
    fig = draw_rank0_to_server({"world_size": 4, "backend": "nccl", "final_accuracy": 0.9}, "m.pt", 8.7)
    words = " ".join(t.get_text() for t in fig.axes[0].texts) + fig._suptitle.get_text()
    assert "rank 0" in words and "rank 3" in words and "4 processes (nccl)" in words and "90.0%" in words


# --- the real server: started, asked, loaded, stopped -------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("ch10") / "m.pt")


@pytest.mark.slow
def test_a_missing_checkpoint_is_refused_with_exit_code_2(tmp_path):
    started = time.monotonic()
    with pytest.raises(ServerDidNotStart) as refused:
        start_server(tmp_path / "none.pt", log_path=tmp_path / "server.log", quiet=True)
    said = " ".join(refused.value.log.split())  # the paragraph as one line: a long tmp path moves its line breaks
    assert refused.value.exit_code == 2 and "checkpoint not found: " in said, refused.value
    assert "none.pt" in said and "Train one first" in said and "--checkpoint" in said, said  # and what to do
    assert time.monotonic() - started < 60


@pytest.mark.slow
def test_the_live_server_answers_is_measured_and_stops_clean(checkpoint, tmp_path):
    server = start_server(checkpoint, "--max-queue", "600", log_path=tmp_path / "server.log", quiet=True)
    try:
        status, health = call(server.base, "GET", "/health")
        assert status == 200 and health["queue"]["max_requests"] == 600, "the extra flag reached the server"
        status, answer, wait = batch_sender(server.base)(["Stocks rally", "Mars rover lands"])
        assert status == 200 and len(answer["results"]) == 2 and wait is None
        status, answer = call(server.base, "POST", "/predict", b'{"text": "unclosed')
        assert status == 400 and "not valid JSON" in answer["detail"]

        costs = cost_per_text(server.base, sizes=(1, 8), calls=2)
        assert [c.size for c in costs] == [1, 8] and all(c.ms_per_call > 0 for c in costs)
        levels = latency_under_load(server.port, clients=(1, 8), seconds=0.4, warmup=0.1)
        assert [x.clients for x in levels] == [1, 8] and all(x.answered > 0 and x.errors == 0 for x in levels)
        assert levels[0].mean_batch == 1.0, "one client: one request per forward pass"
        assert levels[0].p50_ms <= levels[0].p95_ms <= levels[0].p99_ms
        assert "clients" in load_table(levels).splitlines()[0]

        answers = [call(server.base, "POST", path, body) for path, body in STATUS_REQUESTS]
    finally:
        stop_server(server)
    gone = left_behind(server)
    assert gone.nothing and gone.signals_sent == ["SIGTERM"] and gone.port_answer == errno.ECONNREFUSED, str(gone)

    # exercise 2's checker, against what this real server answered
    assert grade(ANSWERS.expected_status, status_cases(STATUS_REQUESTS, answers, LIMITS), quiet=True).ok

    def optimist(path, body, limits):  # only checks that the body is JSON
        return 400 if isinstance(body, bytes) else 200

    def broken_json_is_422(path, body, limits):
        return 422 if isinstance(body, bytes) else ANSWERS.expected_status(path, body, limits)

    def no_batch_limit(path, body, limits):
        return ANSWERS.expected_status(path, body, {**limits, "max_batch_texts": 10**9})

    def blank_is_fine(path, body, limits):
        if isinstance(body, dict) and body.get("text") == "":
            return 200
        return ANSWERS.expected_status(path, body, limits)

    for mutant, says in [
        (optimist, "you said 200 for POST /predict {'text': ''}; the server answered 422"),
        (broken_json_is_422, "you said 422 for POST /predict b'not json at all'; the server answered 400"),
        (no_batch_limit, "you said 200 for POST /predict/batch {'texts': [65 texts]}; the server answered 422"),
        (blank_is_fine, "you said 200 for POST /predict {'text': ''}; the server answered 422"),
    ]:
        result = grade(mutant, status_cases(STATUS_REQUESTS, answers, LIMITS), quiet=True)
        assert not result.ok and says in result.failed, (mutant.__name__, result.failed)


@pytest.mark.slow
def test_running_server_stops_it_when_the_block_fails(checkpoint, tmp_path):
    with pytest.raises(ZeroDivisionError):
        with running_server(checkpoint, log_path=tmp_path / "server.log") as server:
            1 / 0
    assert left_behind(server).nothing


@pytest.mark.slow
def test_the_server_goes_when_the_kernel_that_started_it_dies(checkpoint, tmp_path):
    """A kernel that crashes (os._exit: no atexit, no finally) leaves no server: Linux sends it SIGTERM."""
    import subprocess
    import sys

    kernel = (
        "import os, sys\n"
        "from distrinews_course.live_server import start_server\n"
        f"server = start_server({str(checkpoint)!r}, log_path={str(tmp_path / 'server.log')!r}, quiet=True)\n"
        "print(server.proc.pid, server.port, flush=True)\n"
        "os._exit(0)\n"
    )
    out = subprocess.run([sys.executable, "-c", kernel], capture_output=True, text=True, timeout=120, cwd=ROOT)
    pid, port = map(int, out.stdout.split())
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, 9)
        pytest.fail(f"the server {pid} outlived the process that started it")


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads /proc/stat")
def test_the_load_gate_counts_other_programs_but_not_the_server():
    """A spinning process stands for a test beside the notebook. Two meters read the same window: one counts the spin
    as another program's, the other is given its pid (as the notebook gives the server's) and leaves it out. Their
    difference is the spin's own CPU, whatever else the machine runs meanwhile."""
    import subprocess
    import sys

    from distrinews_course.bench.quiet import OtherPrograms
    from distrinews_course.bench.timing import process_cpu_s

    spin = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time() + 30\nwhile time.time() < t: pass"])
    try:
        time.sleep(0.3)
        before, t0 = process_cpu_s(spin.pid), time.perf_counter()
        with OtherPrograms() as other, OtherPrograms(spin.pid) as own:
            time.sleep(1.5)
        spun = (process_cpu_s(spin.pid) - before) / (time.perf_counter() - t0)
    finally:
        spin.kill()
        spin.wait()
    assert spun > 0.2, f"the spinning process got {spun:.2f} cores: too busy a machine to tell"
    assert other.cores >= spun - 0.1, (other.cores, spun)
    assert abs((other.cores - own.cores) - spun) < 0.1, (other.cores, own.cores, spun)
    if not other.quiet:
        assert "cores busy" in other.why and f"{other.cores:.2f}" in other.why


def _saved_run(tmp_path, *, names=("distilbert.embeddings.weight",), ws=2, run_ws=2, backend="gloo", acc=0.5):
    """A checkpoint as save_checkpoint writes it and its run's metrics.json under tmp_path/outputs/ddp."""
    import json

    import torch

    ckpt = tmp_path / "checkpoints" / "m.pt"
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    meta = {"world_size": ws, "backend": backend, "final_accuracy": 0.5, "eval_examples": 40}
    torch.save({"state_dict": {n: torch.zeros(2) for n in names}, "metadata": meta}, ckpt)
    run = tmp_path / "outputs" / "ddp"
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.json").write_text(
        json.dumps(
            {
                "ddp": {"world_size": run_ws, "backend": backend},
                "epochs": [{"val_examples": 40}],
                "aggregates": {"checkpoint": str(ckpt), "final_val_accuracy": acc},
                "finished": "2026-12-07T10:00:00+0000",
            }
        )
    )
    return ckpt, tmp_path / "outputs"


def test_the_checkpoint_claims_hold_on_a_file_and_its_own_run(tmp_path):
    from distrinews_course.served_checkpoint import checkpoint_claims

    ckpt, outputs = _saved_run(tmp_path)
    claims = checkpoint_claims(ckpt, outputs)
    assert [holds for holds, _ in claims] == [True], claims
    assert "2 gloo rank(s)" in claims[0][1]


def test_the_saved_names_line_shows_the_prefix_ddp_would_add(tmp_path):
    from distrinews_course.served_checkpoint import saved_names

    ckpt, _ = _saved_run(tmp_path, names=("distilbert.embeddings.weight", "classifier.bias"))
    line = saved_names(ckpt)
    assert line.startswith(
        "2 weight names, the first `distilbert.embeddings.weight`, which a DDP wrapper's state_dict would call "
        "`module.distilbert.embeddings.weight`: its DDP run handed"
    ), line
    one, _ = _saved_run(tmp_path / "one", backend=None)
    assert "no DDP wrapper to strip" in saved_names(one)


@pytest.mark.parametrize(
    "mutant, claim, says",
    [
        ({"run_ws": 4}, 0, "the file and its run disagree"),
        ({"ws": 0, "run_ws": 0}, 0, "the file and its run disagree"),
        ({"acc": 0.25}, 0, "no metrics.json"),  # another run's metrics.json named the same path
    ],
)
def test_a_wrong_checkpoint_fails_its_claim_and_says_what_to_do(tmp_path, mutant, claim, says):
    from distrinews_course.served_checkpoint import checkpoint_claims

    ckpt, outputs = _saved_run(tmp_path, **mutant)
    holds, text = checkpoint_claims(ckpt, outputs)[claim]
    assert not holds and says in text and "run chapter 02 again" in text, text


def test_a_stand_in_is_trained_only_for_a_missing_or_one_process_checkpoint(tmp_path, monkeypatch):
    from distrinews_course import served_checkpoint as S
    from distrinews_lib.serving import inference

    assert S.needs_stand_in(tmp_path / "missing.pt")
    ckpt = tmp_path / "m.pt"
    ckpt.write_bytes(b"x")
    backend = {"value": None}
    monkeypatch.setattr(inference, "read_checkpoint", lambda path: {"metadata": {"backend": backend["value"]}})
    assert S.needs_stand_in(ckpt)  # chapter 01's one-process script records no backend
    backend["value"] = "gloo"
    assert not S.needs_stand_in(ckpt)
    from types import SimpleNamespace

    from distrinews_course import launch

    launched = []
    monkeypatch.setattr(launch, "torchrun", lambda *a, **k: launched.append(a) or SimpleNamespace(seconds=1.0))
    S.ensure_ddp_checkpoint(ckpt, 2)  # a DDP run's file: kept, nothing launched
    assert launched == []
    S.ensure_ddp_checkpoint(tmp_path / "missing.pt", 2)
    assert launched and launched[0][1] == 2 and tmp_path / "missing.pt" in launched[0][2]


def test_the_unbatched_fraction_guess_is_judged_within_its_tolerance(capsys):
    from distrinews_course.serving_exercises import judge_unbatched_fraction

    assert judge_unbatched_fraction(None, 0.22) is None
    assert judge_unbatched_fraction(0.2, 0.22) is True and judge_unbatched_fraction(0.9, 0.22) is False
    assert "only queue" in capsys.readouterr().out  # the reason comes after the run, not on the page
