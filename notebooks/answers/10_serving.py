"""Chapter 10's reference answers (read only by its solution cells; see README.md here)."""

import json
import time


def classify_all(texts, send, limit):
    """The label of every text, in order, through /predict/batch: chunks of at most `limit` texts, and a chunk answered
    503 is sent again after the Retry-After the server asked for."""
    labels = []
    for start in range(0, len(texts), limit):
        chunk = texts[start : start + limit]
        status, answer, retry_after = send(chunk)
        while status == 503:
            time.sleep(retry_after or 1)
            status, answer, retry_after = send(chunk)
        if status != 200:
            raise RuntimeError(f"/predict/batch answered {status}: {answer}")
        labels += [result["label"] for result in answer["results"]]
    return labels


def expected_status(path, body, limits):
    """The status the server answers for a POST of `body` to `path`: 400 for a body that is not JSON, 422 for JSON
    that is not a valid request, else 200."""
    if isinstance(body, bytes):
        try:
            body = json.loads(body)
        except ValueError:
            return 400  # not JSON at all
    if not isinstance(body, dict):
        return 422  # JSON, but not an object with the right field

    def good_text(text):
        return isinstance(text, str) and text.strip() != "" and len(text) <= limits["max_text_chars"]

    if path == "/predict":
        return 200 if good_text(body.get("text")) else 422
    texts = body.get("texts")
    ok = isinstance(texts, list) and 1 <= len(texts) <= limits["max_batch_texts"] and all(map(good_text, texts))
    return 200 if ok else 422
