"""uvicorn's httptools HTTP/1.1 protocol with the limits a public server needs against slow or abusive clients.

    python -m distrinews_lib.serving ...                                  # uses it
    uvicorn distrinews_lib.serving.app:app --http distrinews_lib.serving.protocol:HttpProtocol

On top of uvicorn's own behaviour (keep-alive timeout, `--limit-concurrency`):

* **header limits**: a request line plus headers larger than `max_header_bytes`, or with more than
  `max_headers` lines, gets 431 and the connection is closed, as soon as the limit is passed (a 16 MB
  header is never buffered whole);
* **header and body timeouts**: a client has `header_timeout` seconds to send a request's line and
  headers (counted from connecting, or from the request's first byte) and `body_timeout` seconds for
  its body; then 408 and the connection is closed (uvicorn alone waits for ever: one byte at a time
  keeps a connection open);
* **connection limit with a JSON answer**: past `limit_concurrency` connections (or requests in progress)
  a request gets the API's JSON error with status 503, `Retry-After: 1` and `Connection: close`;
* **clients that go away**: when a client closes (or half-closes) its side, every request of that
  connection still in progress is marked disconnected at once, so the app drops its work and nothing
  writes to the closed socket (uvicorn marks only the newest one, which gave two tracebacks per
  connection for a client that pipelines and then half-closes).

The limits come from the command line's settings (see configured()) or, under plain uvicorn, from the DISTRINEWS_*
environment variables listed in settings.py; uvicorn's own --limit-concurrency wins over
DISTRINEWS_LIMIT_CONCURRENCY.
"""

from __future__ import annotations

import json
import logging
from typing import Optional

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from . import settings as serving_settings
from .batching import ThrottledLog

# uvicorn's own logger, so the lines appear where uvicorn's do; at most one line per kind every 10 s.
throttled = ThrottledLog(logging.getLogger("uvicorn.error"))

_LIMIT_NAMES = ("limit_concurrency", "header_timeout", "body_timeout", "max_header_bytes", "max_headers")


def _error_body(status: int, detail: str) -> bytes:
    return json.dumps({"detail": detail, "errors": []}).encode()


def _refusal_app(status: int, detail: str, retry_after: Optional[int] = None):
    """A tiny ASGI app answering one JSON error and closing the connection (it never reads the body)."""
    body = _error_body(status, detail)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))

    async def app(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return app


class HttpProtocol(HttpToolsProtocol):
    """See the module docstring. `limits` None: read from the environment (DISTRINEWS_*) once."""

    limits: Optional[dict] = None
    _env_limits: Optional[dict] = None

    @classmethod
    def configured(cls, settings) -> type:
        """A subclass with the limits of resolved settings (settings.ServingSettings: the command line's)."""
        return type(cls.__name__, (cls,), {"limits": {k: getattr(settings, k) for k in _LIMIT_NAMES}})

    @classmethod
    def _resolved_limits(cls) -> dict:
        if cls.limits is not None:
            return cls.limits
        if HttpProtocol._env_limits is None:
            values = serving_settings.resolve_all("connection")
            HttpProtocol._env_limits = {k: values[k] for k in _LIMIT_NAMES}
        return HttpProtocol._env_limits

    def __init__(self, config, server_state, app_state, _loop=None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        limits = self._resolved_limits()
        # uvicorn's --limit-concurrency (config) wins; we answer the overflow ourselves (JSON, Retry-After).
        self.connection_limit = config.limit_concurrency or limits["limit_concurrency"]
        self.limit_concurrency = None
        self.header_timeout = float(limits["header_timeout"])
        self.body_timeout = float(limits["body_timeout"])
        self.max_header_bytes = int(limits["max_header_bytes"])
        self.max_headers = int(limits["max_headers"])
        self._in_head = False  # a request line + headers are being received
        self._head_bytes = 0  # bytes of the current head received so far (at least)
        self._head_seen = 0  # bytes of the current head seen by the parser's callbacks
        self._header_count = 0
        self._timer = None  # the header or body timeout of the request being received
        self._open_cycles: list = []  # requests of this connection whose response is not complete

    # ------------------------------------------------------------------ timers

    def _arm(self, seconds: float, handler) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, handler)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _header_timeout_fired(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        if self._in_head:
            throttled(
                "header-timeout",
                logging.INFO,
                "closed a connection that sent no complete request headers within %g s (408)",
                self.header_timeout,
            )
            self._write_error(408, f"the request headers were not received within {self.header_timeout:g} s")
        self.transport.close()

    def _body_timeout_fired(self) -> None:
        self._timer = None
        cycle = self.cycle
        if self.transport.is_closing():
            return
        # Armed from a request's headers until its body is complete: the body is still incomplete.
        throttled(
            "body-timeout",
            logging.INFO,
            "closed a connection whose request body was not received within %g s (408)",
            self.body_timeout,
        )
        if cycle is not None and not cycle.response_started:
            self._write_error(
                408, f"the request body was not received within {self.body_timeout:g} s", for_current_cycle=True
            )
        self._mark_disconnected()
        self.transport.close()

    def _write_error(self, status: int, detail: str, for_current_cycle: bool = False) -> None:
        if not for_current_cycle and self.cycle is not None and not self.cycle.response_complete:
            return  # an earlier request's answer is still to come: an error now would pass for it; just close
        body = _error_body(status, detail)
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [
            b"content-type: application/json\r\n",
            b"content-length: " + str(len(body)).encode() + b"\r\n",
            b"connection: close\r\n",
            b"\r\n",
            body,
        ]
        self.transport.write(b"".join(head))

    # ------------------------------------------------------------------ connection events

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        # A client that connects and sends nothing is closed after header_timeout, not kept for ever.
        self._arm(self.header_timeout, self._header_timeout_fired)

    def _mark_disconnected(self) -> None:
        for cycle in self._open_cycles:
            if not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()
        self._open_cycles.clear()

    def eof_received(self) -> None:
        # The client closed its side. As in uvicorn, the connection ends (the transport closes once this
        # returns); every request still in progress is told now, so the app drops its work and no response
        # is written to the closed socket.
        self._mark_disconnected()
        return None

    def connection_lost(self, exc) -> None:
        self._disarm()
        self._mark_disconnected()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        head_in_progress = self._in_head
        super().data_received(data)
        if not self._in_head or self.transport.is_closing():
            return
        # Still inside a request's head: if it was already in progress, all of `data` belongs to it;
        # if it started within `data`, count what the parser has handed over so far.
        self._head_bytes = self._head_bytes + len(data) if head_in_progress else self._head_seen
        if self._head_bytes > self.max_header_bytes or self._header_count > self.max_headers:
            self._refuse_head()

    def _refuse_head(self) -> None:
        self._disarm()
        what = (
            f"more than {self.max_headers} header lines"
            if self._header_count > self.max_headers
            else f"more than {self.max_header_bytes:,} bytes of request line and headers"
        )
        throttled("431", logging.WARNING, "refused a request with %s (431)", what)
        self._write_error(
            431, f"the request has {what}; the limit is {self.max_headers} headers and {self.max_header_bytes:,} bytes"
        )
        self._in_head = False
        self.transport.close()

    # ------------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_bytes = self._head_seen = self._header_count = 0
        self._arm(self.header_timeout, self._header_timeout_fired)

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._head_seen += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        self._head_seen += len(name) + len(value) + 4
        if self._header_count <= self.max_headers:  # past the limit, stop collecting (refused below)
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm()
        size = max(self._head_bytes, self._head_seen)
        refusal = None
        if self._header_count > self.max_headers or size > self.max_header_bytes:
            what = (
                f"more than {self.max_headers} header lines"
                if self._header_count > self.max_headers
                else f"more than {self.max_header_bytes:,} bytes of request line and headers"
            )
            throttled("431", logging.WARNING, "refused a request with %s (431)", what)
            refusal = _refusal_app(
                431,
                f"the request has {what}; the limit is {self.max_headers} headers and {self.max_header_bytes:,} bytes",
            )
        elif self.connection_limit is not None and (
            len(self.connections) > self.connection_limit or len(self.tasks) >= self.connection_limit
        ):
            throttled(
                "connections",
                logging.WARNING,
                "refused a request with 503: %d connections, %d requests in progress (limit %d)",
                len(self.connections),
                len(self.tasks),
                self.connection_limit,
            )
            refusal = _refusal_app(
                503, f"the server is at its limit of {self.connection_limit} connections; retry shortly", retry_after=1
            )
        if refusal is not None:
            app, self.app = self.app, refusal
            try:
                super().on_headers_complete()
            finally:
                self.app = app
        else:
            super().on_headers_complete()
        cycle = self.cycle
        if cycle is None or (self.parser.should_upgrade() and self._should_upgrade()):
            return
        self._open_cycles = [c for c in self._open_cycles if not c.response_complete] + [cycle]
        if refusal is None and not self.pipeline:  # a pipelined request's body is read when its turn comes
            self._arm(self.body_timeout, self._body_timeout_fired)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        cycle = self.cycle
        if (
            not self.transport.is_closing()
            and cycle is not None
            and cycle.more_body
            and not cycle.response_complete
            and self._timer is None
            and not self._in_head
        ):
            # A pipelined request just started and its body is still to come.
            self._arm(self.body_timeout, self._body_timeout_fired)
