"""The API's errors: every refusal is JSON `{"detail": ..., "errors": [{"field", "message"}]}`, in words a
client can act on, and never echoes the input back (it may be huge, or not encodable as JSON)."""

from __future__ import annotations

import logging

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .schemas import MAX_BATCH_TEXTS, MAX_TEXT_CHARS, ErrorResponse

log = logging.getLogger("distrinews.serving")


def _field_name(loc) -> str:
    """('body', 'texts', 3) -> 'texts[3]'; ('body',) -> 'body'."""
    parts = [p for p in loc if p != "body"] if len(loc) > 1 else list(loc)
    name = ""
    for part in parts:
        name += f"[{part}]" if isinstance(part, int) else (f".{part}" if name else str(part))
    return name or "body"


def _message(err: dict) -> tuple[str, str]:
    """A readable (field, message) for one pydantic / FastAPI error."""
    kind, loc, ctx = err.get("type", ""), tuple(err.get("loc", ())), err.get("ctx") or {}
    field = _field_name(loc)
    if kind == "json_invalid":
        pos = loc[1] if len(loc) > 1 else "?"
        return "body", f"the request body is not valid JSON ({ctx.get('error', 'decode error')} at character {pos})"
    if field == "body":
        if kind == "missing":
            return "body", 'the request body is missing; send JSON such as {"text": "..."}'
        # Not a JSON object: a list, a string, or a body sent without Content-Type: application/json.
        return "body", (
            'the request body must be a JSON object such as {"text": "..."}, sent with Content-Type: application/json'
        )
    if kind == "missing":
        return field, "is required"
    if kind in ("string_type", "string_strict_type"):
        return field, "must be a string"
    if kind in ("list_type",):
        return field, "must be a list of strings"
    if kind == "string_unicode":
        return field, "contains invalid Unicode (a lone surrogate such as \\ud800)"
    if kind == "string_too_short":
        return field, "must not be empty"
    if kind == "string_too_long":
        return field, f"is longer than the limit of {MAX_TEXT_CHARS:,} characters"
    if kind == "too_short":
        return field, "must contain at least one text"
    if kind == "too_long":
        return field, f"has more than the limit of {MAX_BATCH_TEXTS} texts; split it into several calls"
    msg = str(err.get("msg", "is invalid"))
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if field == "texts" and msg.startswith("texts["):  # the batch validator names the position itself
        field, _, msg = msg.partition(" ")
    return field, msg


def error_response(status: int, detail: str, errors: list | None = None, headers: dict | None = None) -> JSONResponse:
    body = ErrorResponse(detail=detail, errors=errors or [])
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    # Never echo the input back: it may be huge, or hold text that cannot be encoded as JSON.
    pairs = [_message(e) for e in exc.errors()]
    errors = [{"field": f, "message": m} for f, m in pairs]
    detail = "; ".join(f"{f}: {m}" if f != "body" else m for f, m in pairs[:5]) or "invalid request"
    invalid_json = any(e.get("type") == "json_invalid" for e in exc.errors())
    return error_response(400 if invalid_json else 422, detail, errors)


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    detail = str(exc.detail)
    if exc.status_code == 400 and detail == "There was an error parsing the body":
        # FastAPI's words for a body json.loads cannot even start on: say what is usually wrong.
        detail = "the request body could not be parsed as JSON (it is not valid UTF-8, or it is nested too deeply)"
        return error_response(400, detail, [{"field": "body", "message": detail}])
    return error_response(exc.status_code, detail, headers=getattr(exc, "headers", None))


async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    # A bug on our side, not the client's: log it in full, answer with one line (still a 500, so
    # tests and monitoring see it).
    log.exception("unexpected error while serving %s %s", request.method, request.url.path)
    return error_response(500, f"internal server error ({type(exc).__name__}); see the server log")


EXCEPTION_HANDLERS = {
    RequestValidationError: validation_error,
    StarletteHTTPException: http_error,
    Exception: unexpected_error,
}
