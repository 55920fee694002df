"""`spec serve`'s HTTP layer: OpenAI's endpoints over one `Service`, as a thin layer like the CLI.

Starlette routes the requests and uvicorn serves them: a small, well-kept ASGI stack whose streaming responses
are cancelled when the client goes away, which is what lets a disconnect stop its generation. Requests are
checked by `openai_api`, queued on the `Service`, and the text it posts becomes JSON or server-sent events.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import socket
import time
import uuid
from typing import Any, AsyncIterator

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from spec_cli.errors import SpecError
from spec_cli.server import openai_api
from spec_cli.server.openai_api import Answer, ApiRequest, RequestError
from spec_cli.server.service import Failed, Finished, Job, Service, Started

DEFAULT_PORT = 8080
DISCONNECT_POLL_S = 0.25  # how often a request waiting for its turn checks that its client is still there


class ClientGone(Exception):
    """The client closed its connection before its answer began."""


async def _next(job: Job, request: Request) -> Started | str | Finished | Failed:
    """The job's next item; while waiting (for its turn, or for a whole answer), a client that goes away
    cancels the job."""
    while True:
        try:
            return await asyncio.wait_for(job.items.get(), DISCONNECT_POLL_S)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                job.cancel()
                raise ClientGone from None


async def _json_body(request: Request) -> object:
    try:
        return json.loads(await request.body())
    except (ValueError, UnicodeDecodeError):
        raise RequestError("the request body is not valid JSON") from None


async def chat_completions(request: Request) -> Response:
    return await _answer(request, openai_api.parse_chat(await _json_body(request)), "chatcmpl")


async def completions(request: Request) -> Response:
    return await _answer(request, openai_api.parse_completion(await _json_body(request)), "cmpl")


async def _answer(request: Request, api_request: ApiRequest, id_prefix: str) -> Response:
    service: Service = request.app.state.service
    service.check_model(api_request.model)
    job = service.submit(api_request)
    try:
        first = await _next(job, request)
        if isinstance(first, Failed):
            raise first.error
        assert isinstance(first, Started)
        answer = Answer(f"{id_prefix}-{uuid.uuid4().hex}", int(time.time()), service.name, api_request.endpoint)
        if api_request.stream:
            return StreamingResponse(_stream(job, answer, first), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        pieces = []
        while not isinstance(item := await _next(job, request), Finished):
            if isinstance(item, Failed):
                raise item.error
            pieces.append(item)
        stats = first.generation.stats
        return JSONResponse(answer.whole("".join(pieces), item.reason, stats))
    except BaseException:
        job.cancel()
        raise


async def _stream(job: Job, answer: Answer, started: Started) -> AsyncIterator[str]:
    """Server-sent events: a chunk of text (a round's) with the speculation so far, the finish reason, the
    usage when asked for, then `[DONE]`. Starlette cancels this when the client goes away, and so the job."""
    stats = started.generation.stats
    try:
        if answer.endpoint == "chat":
            yield _event(answer.chunk(None, None))
        while True:
            item = await job.items.get()
            if isinstance(item, str):
                yield _event(answer.chunk(item, None, stats))
            elif isinstance(item, Failed):
                yield _event(item.error.body())
                break
            elif isinstance(item, Finished):
                yield _event(answer.chunk("", item.reason, stats))
                if job.request.include_usage:
                    yield _event(answer.usage_chunk(stats))
                break
        yield "data: [DONE]\n\n"
    finally:
        job.cancel()


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def list_models(request: Request) -> Response:
    service: Service = request.app.state.service
    pair = service.pair
    entry = {"id": service.name, "object": "model", "created": int(pair.target.path.stat().st_mtime),
             "owned_by": "spec-cli", "target": pair.target.path.name,
             "draft": pair.draft.path.name if pair.draft else None, "context_length": pair.n_ctx}
    return JSONResponse({"object": "list", "data": [entry]})


async def health(request: Request) -> Response:
    service: Service = request.app.state.service
    jobs = service.jobs
    return JSONResponse({"status": "ok", "model": service.name, "generating": jobs > 0,
                         "waiting": max(0, jobs - 1)})


async def _request_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestError)
    headers = {"Retry-After": "1"} if exc.status == 503 else None
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


async def _http_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return JSONResponse(openai_api.error_body(str(exc.detail), kind), status_code=exc.status_code)


async def _client_gone(_request: Request, _exc: Exception) -> Response:
    return Response(status_code=499)  # nobody reads it: nginx's "client closed request", for the record


def create_app(service: Service, api_key: str | None = None) -> ASGIApp:
    """The ASGI app: OpenAI's endpoints, errors in OpenAI's shape, and the API key checked when one is set."""
    app = Starlette(routes=[
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
    ], exception_handlers={RequestError: _request_error, HTTPException: _http_error, ClientGone: _client_gone})
    app.state.service = service
    return _RequireKey(app, api_key) if api_key else app


class _RequireKey:
    """Every request but /health must carry `Authorization: Bearer KEY`."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app, self._expected = app, f"Bearer {key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] != "/health":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                body = openai_api.error_body("a valid API key is required: send 'Authorization: Bearer KEY'",
                                             "invalid_request_error", code="invalid_api_key")
                await JSONResponse(body, status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: any free one), bound before the models load so that a port
    in use is reported at once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not the default 0: asyncio turns Nagle's algorithm off only on connections whose socket
    # says TCP, and with it on, each response's body (each stream chunk) waits up to 40 ms for an ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise SpecError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


def http_server(app: ASGIApp) -> uvicorn.Server:
    """uvicorn without its own logging (the service logs a line per answer); a Ctrl-C waits 2 s for answers
    in progress, then cancels them."""
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                            timeout_graceful_shutdown=2)
    return uvicorn.Server(config)
