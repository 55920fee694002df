"""`spec serve`'s HTTP layer: OpenAI's endpoints over one `Service` (and the routes of `chat_apis` and
`native_routes`), as a thin layer like the CLI.

Starlette routes the requests and uvicorn serves them: a small, well-kept ASGI stack whose streaming responses
are cancelled when the client goes away, which is what lets a disconnect stop its generation. Requests are
checked by `openai_api`, queued on the `Service`, and the text it posts becomes JSON or server-sent events.
"""

from __future__ import annotations

import hmac
import signal
import socket
import time
import uuid
from contextlib import contextmanager
from types import FrameType
from typing import Any, AsyncIterator, Callable, Iterator, Sequence

import uvicorn
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from spec_cli.api import anthropic_api, openai_api
from spec_cli.api.errors import RequestError, error_body
from spec_cli.api.openai_api import Answer, ApiRequest
from spec_cli.api.tool_calls import AnswerSplitter
from spec_cli.errors import SpecError
from spec_cli.server import chat_apis, native_routes
from spec_cli.server.connections import GuardedH11Protocol, Limits
from spec_cli.server.exchange import (STREAM_HEADERS, ClientGone, chat_message, collected, enough, json_body, sse,
                                      started)
from spec_cli.server.jobs import Failed, Finished, Job, Left, Started
from spec_cli.server.service import Service

DEFAULT_PORT = 8080


async def chat_completions(request: Request) -> Response:
    return await _answer(request, openai_api.parse_chat(await json_body(request)), "chatcmpl")


async def completions(request: Request) -> Response:
    return await _answer(request, openai_api.parse_completion(await json_body(request)), "cmpl")


async def _answer(request: Request, api_request: ApiRequest, id_prefix: str) -> Response:
    service: Service = request.app.state.service  # any model name is served, as llama-server serving one model
    async with started(request, api_request) as (api_request, job, first):
        answer = Answer(f"{id_prefix}-{uuid.uuid4().hex}", int(time.time()), api_request.model or service.name,
                        api_request.endpoint, api_request.unenforced)
        # A chat's answer is read for a thought and tool calls; a completion's text is the answer.
        splitter = (AnswerSplitter(api_request.tools, first.thinking, service.dialect.convention)
                    if api_request.endpoint == "chat" else None)
        if api_request.stream:
            return StreamingResponse(_stream(job, answer, first, splitter), media_type="text/event-stream",
                                     headers=STREAM_HEADERS)
        deltas, item = await collected(job, splitter)
    stats = first.generation.stats
    if splitter is None:
        return JSONResponse(answer.whole("".join(d["content"] for d in deltas), item.reason, stats))
    message = chat_message([*deltas, *splitter.flush(cut=item.reason == "length")])
    return JSONResponse(answer.whole(message, openai_api.called(item.reason, splitter.calls), stats))


async def _stream(job: Job, answer: Answer, first: Started, splitter: AnswerSplitter | None) -> AsyncIterator[str]:
    """Server-sent events: a chunk of text (a round's) with the speculation so far, the finish reason, the
    usage when asked for, then `[DONE]`. A chat's text goes out as the deltas `splitter` makes of it (a tool
    call named first, then its arguments as they are written). Starlette cancels this when the client goes
    away, and so the job."""
    stats = first.generation.stats
    try:
        if answer.endpoint == "chat":
            yield sse(answer.chunk(None, None))
        while True:
            item = await job.items.get()
            if isinstance(item, str):
                for delta in splitter.feed(item) if splitter is not None else [item]:
                    yield sse(answer.chunk(delta, None, stats))
                if splitter is not None and splitter.full:
                    item = enough(job)
            if isinstance(item, Failed):
                yield sse(item.error.body())
                break
            elif isinstance(item, Finished):
                reason = item.reason
                if splitter is not None:
                    for delta in splitter.flush(cut=reason == "length"):
                        yield sse(answer.chunk(delta, None, stats))
                    reason = openai_api.called(reason, splitter.calls)
                yield sse(answer.chunk("", reason, stats))
                if job.request.include_usage:
                    yield sse(answer.usage_chunk(stats))
                break
            elif isinstance(item, Left):
                return
        yield "data: [DONE]\n\n"
    finally:
        job.cancel()


async def list_models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [_model_entry(request.app.state.service)]})


async def one_model(request: Request) -> Response:
    service: Service = request.app.state.service
    service.check_model(request.path_params["model"])
    return JSONResponse(_model_entry(service))


def _model_entry(service: Service) -> dict[str, Any]:
    pair = service.pair
    return {"id": service.name, "object": "model", "created": int(pair.target.path.stat().st_mtime),
            "owned_by": "spec-cli", "target": pair.target.path.name,
            "draft": pair.draft.path.name if pair.draft else None, "context_length": pair.n_ctx}


async def health(request: Request) -> Response:
    service: Service = request.app.state.service
    return JSONResponse({"status": "ok", "model": service.name, **service.health()})


def _refused(request: Request, status: int, reason: str) -> None:
    """One line in the server's log for a request answered with an error status: what was asked, and why not."""
    request.app.state.service.log(f"{request.method} {request.url.path}: {status}, {reason}")


async def _request_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestError)
    _refused(request, exc.status, f"{exc.code or exc.kind}: {exc.message}")
    headers = {"Retry-After": "1"} if exc.status == 503 else {}
    if exc.status in (408, 413):  # a body left unread: the connection cannot carry another request
        headers["Connection"] = "close"
    body = anthropic_api.error(exc) if request.url.path.startswith("/v1/messages") else exc.body()
    return JSONResponse(body, status_code=exc.status, headers=headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    _refused(request, exc.status_code, str(exc.detail))
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return JSONResponse(error_body(str(exc.detail), kind), status_code=exc.status_code)


async def _client_gone(_request: Request, _exc: Exception) -> Response:
    return Response(status_code=499)  # nobody reads it: nginx's "client closed request", for the record


def create_app(service: Service, api_key: str | None = None, cors: Sequence[str] = (),
               limits: Limits = Limits(), metrics_route: bool = False) -> ASGIApp:
    """The ASGI app: OpenAI's endpoints and llama.cpp's own, errors in OpenAI's shape, the body read within
    `limits`, the API key checked when one is set, CORS answers for the browser origins `cors` names ("*": any),
    and with `metrics_route` Prometheus' `/metrics` (off by default, as llama-server's `--metrics`)."""
    app = Starlette(routes=[
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", one_model, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/responses", chat_apis.responses, methods=["POST"]),
        Route("/v1/messages", chat_apis.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", chat_apis.count_tokens, methods=["POST"]),
        Route("/completion", native_routes.native_completion, methods=["POST"]),
        Route("/completions", native_routes.native_completion, methods=["POST"]),
        Route("/infill", native_routes.infill, methods=["POST"]),
        Route("/tokenize", native_routes.tokenize, methods=["POST"]),
        Route("/detokenize", native_routes.detokenize, methods=["POST"]),
        Route("/apply-template", native_routes.apply_template, methods=["POST"]),
        Route("/props", native_routes.props, methods=["GET"]),
        Route("/slots", native_routes.slots, methods=["GET"]),
        *([Route("/metrics", native_routes.metrics, methods=["GET"])] if metrics_route else []),
    ], exception_handlers={RequestError: _request_error, HTTPException: _http_error, ClientGone: _client_gone})
    app.state.service, app.state.limits = service, limits
    guarded: ASGIApp = app if api_key is None else _RequireKey(app, api_key, service.log)
    if not cors:
        return guarded
    # Outside the key check: a browser's preflight carries no key, and a 401 needs CORS headers to be read.
    cors_app = _Cors(guarded, allow_origins=list(cors), allow_methods=["GET", "POST"],
                     allow_headers=["Authorization", "Content-Type"], max_age=600)
    cors_app.log = service.log
    return cors_app


class _Cors(CORSMiddleware):
    """Starlette's CORS answers, with a refused preflight in OpenAI's error shape like every other error, and
    logged as every refusal is."""

    log: Callable[[str], None] = staticmethod(lambda _line: None)

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code == 200:
            return response
        reason = bytes(response.body).decode()
        self.log(f"OPTIONS preflight from {request_headers.get('origin', '?')}: {response.status_code}, {reason}")
        body = error_body(reason, "invalid_request_error")
        return JSONResponse(body, status_code=response.status_code, headers={"Vary": "Origin"})


class _RequireKey:
    """Every request but /health must carry `Authorization: Bearer KEY` (the scheme in any case, RFC 7235)."""

    def __init__(self, app: ASGIApp, key: str, log: Callable[[str], None] = lambda _line: None) -> None:
        if not key:
            raise ValueError("an empty API key would let anyone in")
        self.app, self._expected, self._log = app, key.encode(), log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] != "/health" and not self._allows(scope):
            self._log(f"{scope['method']} {scope['path']}: 401, invalid_api_key: no valid API key")
            body = error_body("a valid API key is required: send 'Authorization: Bearer KEY'",
                                         "invalid_request_error", code="invalid_api_key")
            await JSONResponse(body, status_code=401)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _allows(self, scope: Scope) -> bool:
        scheme, _, given = dict(scope["headers"]).get(b"authorization", b"").strip().partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self._expected)


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


def http_server(app: ASGIApp, limits: Limits = Limits(), log: Callable[[str], None] = lambda _line: None
                ) -> uvicorn.Server:
    """uvicorn without its own logging (the service logs a line per answer, `log` one per connection refused), on
    the HTTP/1.1 protocol that keeps `limits`; a Ctrl-C waits 2 s for answers in progress, then cancels them."""
    config = uvicorn.Config(app, http=GuardedH11Protocol.with_limits(limits, log), log_level="warning",
                            access_log=False, lifespan="off", timeout_graceful_shutdown=2)
    return uvicorn.Server(config)


@contextmanager
def hang_up_stops(http: uvicorn.Server) -> Iterator[None]:
    """While `http` serves, SIGHUP (its terminal closed) stops it at once, its answers in progress with it, as a second
    Ctrl-C stops uvicorn: set on the server rather than raised where the main thread stands. uvicorn watches SIGINT and
    SIGTERM only, and a KeyboardInterrupt raised while a request's code ran (the line it logs for its answer) was taken
    for that request's error: the server went on serving. A hang-up the process was started ignoring (`nohup`) stays
    ignored."""
    if not hasattr(signal, "SIGHUP") or signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
        yield
        return

    def stop(_signum: int, _frame: FrameType | None) -> None:
        http.should_exit = http.force_exit = True

    previous = signal.signal(signal.SIGHUP, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)
