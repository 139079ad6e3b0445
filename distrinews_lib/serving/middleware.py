"""Plain ASGI middlewares for what FastAPI's handlers come too late for, one job each.

create_app stacks them, outermost first: StartupFailureMessage, HeaderLimits, ClientGoneLogging,
BodySizeLimit.  Each passes on what is not its business (other scope types) untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ..errors import UserError
from .batching import ThrottledLog
from .handlers import error_response
from .schemas import MAX_BATCH_TEXTS, MAX_BODY_BYTES, MAX_TEXT_CHARS

throttled = ThrottledLog(logging.getLogger("distrinews.serving"))


class StartupFailureMessage:
    """A model that cannot be loaded at startup makes uvicorn log the whole traceback; a UserError (missing or
    corrupt checkpoint, bad device or setting) is reported as its one-paragraph message instead."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "lifespan":
            return await self.app(scope, receive, send)
        held = []

        async def hold_failure(message):
            # Starlette sends "startup.failed" with the traceback text, then re-raises: keep the message until
            # we know whether the error is a UserError with a better text.
            if message["type"] == "lifespan.startup.failed":
                held.append(message)
                return
            await send(message)

        try:
            await self.app(scope, receive, hold_failure)
        except UserError as err:
            text = "DistriNews server cannot start: " + " ".join(str(err).split())
            await send({"type": "lifespan.startup.failed", "message": text})
            raise
        except BaseException:
            for message in held:
                await send(message)
            raise
        for message in held:
            await send(message)


class HeaderLimits:
    """431 for a request over the header limits of the settings resolved at startup: a backstop for plain
    uvicorn (protocol.HttpProtocol refuses such requests earlier, while they are still being received)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        settings = scope["app"].state.settings if scope["type"] == "http" else None
        if settings is not None:  # None: not started, so there are no limits yet (and no model to protect)
            headers = scope.get("headers") or []
            size = sum(len(k) + len(v) + 4 for k, v in headers) + len(scope.get("raw_path") or b"")
            if len(headers) > settings.max_headers or size > settings.max_header_bytes:
                throttled("431", logging.WARNING, "refused a request over the header limits (431)")
                response = error_response(
                    431,
                    f"the request has more than {settings.max_headers} header lines or "
                    f"{settings.max_header_bytes:,} bytes of request line and headers",
                )
                return await response(scope, receive, send)
        return await self.app(scope, receive, send)


class ResponseWriteFailed(Exception):
    """Writing the response failed: the client's connection is already closed."""


class ClientGoneLogging:
    """A response that cannot be written because the client has gone is one log line, not two tracebacks
    (uvicorn with uvloop raises when writing to a socket it has just closed)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_or_raise(message):
            try:
                await send(message)
            except Exception as err:
                raise ResponseWriteFailed(f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:100]}") from None

        try:
            return await self.app(scope, receive, send_or_raise)
        except ResponseWriteFailed as failed:
            throttled(
                "gone",
                logging.INFO,
                "client %s went away before its response to %s %s was sent (%s)",
                "%s:%s" % tuple(scope.get("client") or ("?", "?")),
                scope.get("method"),
                scope.get("path"),
                failed,
            )
            # Let the server see the closed connection before this request ends, so it does not also report a
            # response that was never completed.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(receive(), 1.0)


class BodySizeLimit:
    """413 for a body over MAX_BODY_BYTES, before anything parses it; a chunked upload (no Content-Length) is
    read here up to the limit, then replayed to the app."""

    def __init__(self, app, max_body_bytes: int = MAX_BODY_BYTES):
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None:
            try:
                too_big = int(length) > self.max_body_bytes
            except ValueError:
                too_big = False  # the HTTP server itself rejects a malformed Content-Length
            if too_big:
                return await self._too_large(scope, receive, send)
            return await self.app(scope, receive, send)
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return await self.app(scope, _replay([message]), send)
            chunks.append(message)
            size += len(message.get("body", b""))
            more = message.get("more_body", False)
            if size > self.max_body_bytes:
                return await self._too_large(scope, receive, send)
        return await self.app(scope, _replay(chunks, receive), send)

    async def _too_large(self, scope, receive, send):
        response = error_response(
            413,
            f"the request body is larger than the limit of {self.max_body_bytes:,} bytes "
            f"(at most {MAX_BATCH_TEXTS} texts of {MAX_TEXT_CHARS:,} characters)",
        )
        await response(scope, receive, send)


def _replay(messages, receive=None):
    pending = list(messages)

    async def replay():
        if pending:
            return pending.pop(0)
        if receive is None:
            return {"type": "http.disconnect"}
        return await receive()

    return replay
