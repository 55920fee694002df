"""What one client may hold of the server: how long its request's headers and body may take to arrive, how large
the body may be, and how many connections may be open at once.

uvicorn closes an idle keep-alive connection, but a connection that sends nothing, or half a header, and then
stalls, it keeps open for ever; and its own cap (`limit_concurrency`) and its answer to bytes that are not HTTP
are plain text. `GuardedH11Protocol` is its HTTP/1.1 protocol with a deadline for every request's headers, a
cap on open connections, and both answers in OpenAI's error shape.

Past the cap, a new connection takes the place of the one that has waited longest without a request (idle
connections must not lock out a client that sends one); only when every other connection has a request in
progress is the new one's request answered 503, after its body is read: closing a connection with unread
data makes the kernel reset it, and the client would lose the answer. The body's limits are the app's to apply
(`server.app`), as it reads the body.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import h11
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from spec_cli.api.errors import error_body

MIB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """`body_bytes`: the largest request body (larger: 413); `header_timeout_s`: how long a request's headers may
    take to arrive once its connection is open or its previous answer sent (then the connection is closed);
    `body_timeout_s`: how long its body may take after them (then 408); `connections`: the most connections
    open at once (one more closes the longest idle one, or is answered 503 when none is idle)."""

    body_bytes: int = 4 * MIB
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    connections: int = 64


class GuardedH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, with a deadline for each request's headers, a cap on open connections, and its
    400 for bytes that are not HTTP in OpenAI's shape."""

    def __init__(self, *args: Any, limits: Limits, log: Callable[[str], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._limits, self._log = limits, log
        self._header_deadline: asyncio.TimerHandle | None = None
        self._idle_since: float | None = None  # when it began waiting for a request's headers

    @classmethod
    def with_limits(cls, limits: Limits, log: Callable[[str], None] = lambda _line: None) -> partial[GuardedH11Protocol]:
        """The protocol factory uvicorn's `http` setting takes; `log` gets a line for each request it refuses."""
        return partial(cls, limits=limits, log=log)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self._limits.connections and not self._close_longest_idle():
            self.app = _busy(self._limits, self._log)  # its request is read, answered 503, and the connection closed
        self._await_headers()

    def _close_longest_idle(self) -> bool:
        """Close the other connection that has waited longest for a request's headers; False when none waits."""
        idle = [c for c in self.connections
                if c is not self and isinstance(c, GuardedH11Protocol) and c._idle_since is not None]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c._idle_since or 0.0)
        oldest._stop_waiting()
        oldest.transport.close()
        self.connections.discard(oldest)
        return True

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:  # a request's headers are in
            self._stop_waiting()

    def on_response_complete(self) -> None:
        self._await_headers()  # before the next request's events, which a pipelining client has already sent
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_waiting()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes that are not HTTP/1.1 (or headers past h11's size limit), in OpenAI's shape."""
        self._log(f"a request that is not HTTP/1.1: 400, {msg}")
        body = json.dumps(error_body(msg, "invalid_request_error")).encode()
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=body),
                      h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()

    def _await_headers(self) -> None:
        self._stop_waiting()
        self._header_deadline = self.loop.call_later(self._limits.header_timeout_s, self._headers_late)
        self._idle_since = self.loop.time()

    def _stop_waiting(self) -> None:
        self._idle_since = None
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_late(self) -> None:
        self._header_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def _busy(limits: Limits, log: Callable[[str], None]) -> ASGIApp:
    """The app a connection past the cap gets when no other is idle: 503 in OpenAI's error shape, then close."""
    message = f"the server has {limits.connections} connections open, its most; try again shortly"
    body = error_body(message, "server_error", code="server_busy")

    async def refuse(scope: Scope, receive: Receive, send: Send) -> None:
        async def read_body() -> None:
            while (message := await receive())["type"] == "http.request" and message.get("more_body"):
                pass

        # The body is read first (within its deadline), so that the close does not reset the answer away.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(read_body(), limits.body_timeout_s)
        log(f"{scope.get('method', '?')} {scope.get('path', '?')}: 503, server_busy: {message}")
        await JSONResponse(body, status_code=503, headers={"Retry-After": "1", "Connection": "close"})(
            scope, receive, send)

    return refuse
