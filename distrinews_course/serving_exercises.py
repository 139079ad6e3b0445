"""The checkers of chapter 10's exercises: a client that batches a big job, and which requests the server refuses.

    grade(classify_all, client_cases(LIMITS["max_batch_texts"]))       # against a stand-in server (FakeBatchServer)
    grade(expected_status, status_cases(STATUS_REQUESTS, server_answers, LIMITS))   # against the live server's answers

Each failing case says in one line which mistake it found: a call over the server's limit, a chunk never sent, a 503
not retried or retried without waiting, labels out of order, one call per text.
"""

from __future__ import annotations

import time
import zlib

LABELS = ["World", "Sports", "Business", "Sci/Tech"]


class ClientMistake(Exception):
    """Raised by the stand-in server at the moment the client does what the real server would refuse."""


class _BusyAnswer(dict):
    # A 503's body holds only "detail": reading results from it is the mistake of not looking at the status.
    def __getitem__(self, key):
        if key == "results":
            raise ClientMistake(
                "read 'results' from a 503 answer: a busy server sends only 'detail'; wait its Retry-After and send "
                "that chunk again"
            )
        return super().__getitem__(key)


def fake_label(text: str) -> str:
    """The stand-in server's answer for a text: fixed per text, spread over the four labels."""
    return LABELS[zlib.crc32(text.encode()) % len(LABELS)]


class FakeBatchServer:
    """POST /predict/batch as the real server answers it, with a log of every call: at most `limit` texts a call,
    and a 503 with Retry-After for the calls numbered in `busy` (0 is the first call), once each."""

    def __init__(self, limit: int, busy=(), retry_after: float = 0.05):
        self.limit, self.busy, self.retry_after = limit, set(busy), retry_after
        self.calls: list[tuple[float, list, int]] = []  # (time, texts, status)

    def send(self, texts):
        texts, now = list(texts), time.monotonic()
        if not texts:
            raise ClientMistake("sent a call with no texts (the server answers 422: texts must hold 1 to the limit)")
        if len(texts) > self.limit:
            raise ClientMistake(
                f"a call carried {len(texts)} texts; /predict/batch takes at most {self.limit} (the server answers 422)"
            )
        last = self.calls[-1] if self.calls else None
        if last and last[2] == 503 and last[1] == texts and now - last[0] < self.retry_after:
            raise ClientMistake(
                f"sent again {now - last[0]:.3f} s after a 503 that asked to wait {self.retry_after} s (Retry-After)"
            )
        if len(self.calls) in self.busy:
            self.busy.discard(len(self.calls))
            self.calls.append((now, texts, 503))
            detail = f"the server is overloaded: its queue is full; retry after {self.retry_after} s"
            return 503, _BusyAnswer(detail=detail), self.retry_after
        self.calls.append((now, texts, 200))
        results = [{"label": fake_label(t), "confidence": 0.9} for t in texts]
        return 200, {"results": results}, None


def _judge_client(server: FakeBatchServer, texts: list, limit: int):
    want = [fake_label(t) for t in texts]
    needed = -(-len(texts) // limit)

    def judge(got):
        if got is None:
            return "it returned None: return the list of labels, one per text"
        got = list(got)
        if got and not isinstance(got[0], str):
            return f"it returned {type(got[0]).__name__}s; return the labels themselves (strings), one per text"
        sent = [t for _, chunk, status in server.calls if status == 200 for t in chunk]
        if len(got) != len(texts):
            refused = [chunk for _, chunk, status in server.calls if status == 503]
            if refused and len(sent) < len(texts):
                return (
                    f"{len(got)} labels for {len(texts)} texts: the chunk answered 503 was not sent again "
                    f"(wait Retry-After, then resend it)"
                )
            if len(sent) < len(texts):
                return (
                    f"{len(got)} labels for {len(texts)} texts: {len(texts) - len(sent)} text(s) at the end were never "
                    "sent (the last chunk is shorter than the limit)"
                )
            return f"{len(got)} labels for {len(texts)} texts"
        if sent != list(texts):
            return "the texts were not sent in order, so the labels cannot be matched to them"
        if got != want:
            i = next(k for k, (a, b) in enumerate(zip(got, want)) if a != b)
            return f"labels out of order: text {i} ({texts[i]!r}) is {want[i]}, you returned {got[i]}"
        answered = sum(status == 200 for _, _, status in server.calls)
        if answered > needed:
            return f"{answered} calls for {len(texts)} texts; chunks of up to {limit} need {needed}"
        return None

    return judge


def client_cases(limit: int = 64):
    """(what, args, judge) for grade(classify_all, ...): each case a fresh stand-in server."""
    cases = []
    for what, n, lim, busy in [
        (f"130 texts, at most {limit} a call", 130, limit, ()),
        (f"exactly {limit} texts: one call", limit, limit, ()),
        ("12 texts, at most 5 a call (a smaller server)", 12, 5, ()),
        ("the server is busy once: 503 with Retry-After 0.05 s", 130, limit, (1,)),
        ("no texts at all", 0, limit, ()),
    ]:
        server = FakeBatchServer(lim, busy)
        texts = [f"headline {k}: markets, matches and missions" for k in range(n)]
        cases.append((what, (texts, server.send, lim), _judge_client(server, texts, lim)))
    return cases


# Requests for exercise 2 (the live server's answers to them are recorded during the lesson's run).
STATUS_REQUESTS = [
    ("/predict", {"text": "Stocks rally as oil prices fall"}),
    ("/predict", {"text": ""}),
    ("/predict", {"text": 42}),
    ("/predict", {"txt": "a misspelt field"}),
    ("/predict", b"not json at all"),
    ("/predict", ["a list, not an object"]),
    ("/predict", {"text": "x" * 10_001}),
    ("/predict/batch", {"texts": ["Federer wins", "Mars rover lands"]}),
    ("/predict/batch", {"texts": []}),
    ("/predict/batch", {"texts": ["fine", 7]}),
    ("/predict/batch", {"texts": ["news"] * 65}),
    ("/predict/batch", {"text": "one text sent to the batch endpoint"}),
]


def _shown(body) -> str:
    if isinstance(body, dict) and isinstance(body.get("texts"), list) and len(body["texts"]) > 4:
        return f"{{'texts': [{len(body['texts'])} texts]}}"
    text = repr(body)
    return text if len(text) <= 50 else text[:47] + "..."


def status_cases(requests, answers, limits: dict):
    """(what, args, judge) for grade(expected_status, ...): the learner's status for each request against the one the
    live server answered, with the server's reason when they differ."""

    def judge_one(path, body, status, answer):
        def judge(got):
            if got == status:
                return None
            said = answer.get("detail") if isinstance(answer, dict) else answer
            return f"you said {got!r} for POST {path} {_shown(body)}; the server answered {status}" + (
                f" ({said})" if status != 200 else ""
            )

        return judge

    return [
        (f"POST {path} {_shown(body)}", (path, body, limits), judge_one(path, body, status, answer))
        for (path, body), (status, answer) in zip(requests, answers)
    ]


def news_to_classify(n: int = 1000):
    """(texts, label indices, label names, where from): the first `n` texts of AG News' test split from wherever
    the course reads its data ($DISTRINEWS_DATA_DIR, else the sample embedded in distrinews_lib)."""
    from distrinews_lib.data.sources import load_dataset_splits, resolve_source

    splits = load_dataset_splits("ag_news", resolve_source("auto", "ag_news", hub=False))
    return splits.test_texts[:n], splits.test_labels[:n], list(splits.label_names), splits.detail


def judge_unbatched_fraction(predicted, fraction: float, tolerance: float = 0.15) -> bool | None:
    """Exercise 3: the learner's guess of the unbatched server's answers per second as a fraction of the batched
    one's, at the most clients: right within `tolerance`. The reason is printed after the run. None: no guess."""
    from .attempt import judge_prediction

    right = predicted is not None and abs(predicted - fraction) <= tolerance
    why = "Without batching each request is a forward pass of its own, so more clients only queue."
    return judge_prediction("the fraction", predicted, round(fraction, 2), right=right, why=why)
