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
from dataclasses import replace
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Protocol, Sequence

import uvicorn
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from spec_cli.errors import SpecError
from spec_cli.api import anthropic_api, openai_api, responses_api
from spec_cli.server.connections import MIB, GuardedH11Protocol, Limits
from spec_cli.api.errors import RequestError, error_body
from spec_cli.api.openai_api import Answer, ApiRequest
from spec_cli.server import native
from spec_cli.server.jobs import Failed, Finished, Job, Left, Started
from spec_cli.server.service import Service
from spec_cli.api.tool_calls import AnswerSplitter
from spec_cli.decoding.stats import Stats

DEFAULT_PORT = 8080


class ClientGone(Exception):
    """The client closed its connection before its answer was sent."""


@asynccontextmanager
async def _watching(request: Request, job: Job) -> AsyncIterator[None]:
    """While a job waits for its turn or makes a whole answer, a client that closes its connection cancels it at
    once: the worker stops at its next token, and the request's task at the job's next item (`Left`). A stream
    needs no watch of its own: Starlette cancels it when the client goes away."""

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        job.leave()

    watcher = asyncio.create_task(watch())
    try:
        yield
    finally:
        watcher.cancel()


async def _next(job: Job) -> Started | str | Finished | Failed:
    item = await job.items.get()
    if isinstance(item, Left):
        raise ClientGone
    return item


async def _json_body(request: Request) -> object:
    """The body as JSON, read within the server's limits: 413 past its size (at once when Content-Length says
    so), 408 when it does not arrive in time; a client that leaves halfway is gone, not wrong."""
    limits: Limits = request.app.state.limits
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limits.body_bytes:
        raise _too_large(limits)
    try:
        body = await asyncio.wait_for(_read(request, limits), limits.body_timeout_s)
    except asyncio.TimeoutError:
        raise RequestError(f"the request body did not arrive within {limits.body_timeout_s:g} s",
                           code="request_timeout", status=408) from None
    except ClientDisconnect:
        raise ClientGone from None
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise RequestError("the request body is not valid JSON") from None
    except RecursionError:
        raise RequestError("the request body nests its JSON too deeply") from None


async def _read(request: Request, limits: Limits) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limits.body_bytes:
            raise _too_large(limits)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limits: Limits) -> RequestError:
    return RequestError(f"the request body is larger than this server takes ({limits.body_bytes / MIB:g} MiB)",
                        code="request_too_large", status=413)


async def chat_completions(request: Request) -> Response:
    return await _answer(request, openai_api.parse_chat(await _json_body(request)), "chatcmpl")


async def completions(request: Request) -> Response:
    return await _answer(request, openai_api.parse_completion(await _json_body(request)), "cmpl")


async def _answer(request: Request, api_request: ApiRequest, id_prefix: str) -> Response:
    service: Service = request.app.state.service  # any model name is served, as llama-server serving one model
    api_request = await service.prepare(api_request)
    job = service.submit(api_request)
    try:
        async with _watching(request, job):
            first = await _next(job)
            if isinstance(first, Failed):
                raise first.error
            assert isinstance(first, Started)
            answer = Answer(f"{id_prefix}-{uuid.uuid4().hex}", int(time.time()), api_request.model or service.name,
                            api_request.endpoint, api_request.unenforced)
            # A chat's answer is read for a thought and tool calls; a completion's text is the answer.
            splitter = (AnswerSplitter(api_request.tools, first.thinking, service.dialect.convention)
                        if api_request.endpoint == "chat" else None)
            if api_request.stream:
                return StreamingResponse(_stream(job, answer, first, splitter), media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            deltas: list[dict[str, Any]] = []
            while not isinstance(item := await _next(job), Finished):
                if isinstance(item, Failed):
                    raise item.error
                deltas += splitter.feed(item) if splitter is not None else [{"content": item}]
                if splitter is not None and splitter.full:
                    item = _enough(job)
                    break
        stats = first.generation.stats
        if splitter is None:
            return JSONResponse(answer.whole("".join(d["content"] for d in deltas), item.reason, stats))
        message = _message([*deltas, *splitter.flush(cut=item.reason == "length")])
        return JSONResponse(answer.whole(message, openai_api.called(item.reason, splitter.calls), stats))
    except BaseException:
        job.cancel()
        raise


def _enough(job: Job) -> Finished:
    """The answer holds a turn's most tool calls: its generation stops, and it ends as a model's own stop would."""
    job.stop()
    return Finished("stop")


def _message(deltas: list[dict[str, Any]]) -> dict[str, Any]:
    """A chat message's fields from its deltas: content (null when the answer is only tool calls), the thought
    as reasoning_content, the tool calls."""
    def joined(name: str) -> str:
        return "".join(delta[name] for delta in deltas if name in delta)

    calls: list[dict[str, Any]] = []  # a call's first delta names it, and the next ones add to its arguments
    for call in (call for delta in deltas for call in delta.get("tool_calls", [])):
        if "id" in call:
            calls.append({"id": call["id"], "type": call["type"], "function": dict(call["function"])})
        else:
            calls[call["index"]]["function"]["arguments"] += call["function"]["arguments"]
    message: dict[str, Any] = {"content": joined("content") or (None if calls else "")}
    if joined("reasoning_content"):
        message["reasoning_content"] = joined("reasoning_content")
    if calls:
        message["tool_calls"] = calls
    return message


async def _stream(job: Job, answer: Answer, started: Started, splitter: AnswerSplitter | None) -> AsyncIterator[str]:
    """Server-sent events: a chunk of text (a round's) with the speculation so far, the finish reason, the
    usage when asked for, then `[DONE]`. A chat's text goes out as the deltas `splitter` makes of it (a tool
    call named first, then its arguments as they are written). Starlette cancels this when the client goes
    away, and so the job."""
    stats = started.generation.stats
    try:
        if answer.endpoint == "chat":
            yield _event(answer.chunk(None, None))
        while True:
            item = await job.items.get()
            if isinstance(item, str):
                for delta in splitter.feed(item) if splitter is not None else [item]:
                    yield _event(answer.chunk(delta, None, stats))
                if splitter is not None and splitter.full:
                    item = _enough(job)
            if isinstance(item, Failed):
                yield _event(item.error.body())
                break
            elif isinstance(item, Finished):
                reason = item.reason
                if splitter is not None:
                    for delta in splitter.flush(cut=reason == "length"):
                        yield _event(answer.chunk(delta, None, stats))
                    reason = openai_api.called(reason, splitter.calls)
                yield _event(answer.chunk("", reason, stats))
                if job.request.include_usage:
                    yield _event(answer.usage_chunk(stats))
                break
            elif isinstance(item, Left):
                return
        yield "data: [DONE]\n\n"
    finally:
        job.cancel()


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


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


class EventWriter(Protocol):
    """Another API's streamed events for one chat generation, from the chat route's deltas (Anthropic's Messages,
    OpenAI's Responses): what the stream opens with, each delta's events, the last ones, an error's."""

    def start(self, stats: Stats) -> list[str]: ...

    def deltas(self, deltas: list[dict[str, Any]]) -> list[str]: ...

    def finish(self, reason: str, by_stop_string: bool, stats: Stats) -> list[str]: ...

    def error(self, exc: RequestError) -> str: ...


async def messages(request: Request) -> Response:
    """Anthropic's Messages API: the chat route's generation, as a message of content blocks or its events."""
    return await _messages_answer(request, anthropic_api.parse_messages(await _json_body(request)))


async def count_tokens(request: Request) -> Response:
    """Anthropic's count_tokens: the tokens the Messages body's prompt takes under the server's template."""
    service: Service = request.app.state.service
    api_request = anthropic_api.parse_messages(await _json_body(request), counting=True)
    return JSONResponse({"input_tokens": len(service.pair.target.tokenize_prompt(service.chat_prompt(api_request)))})


async def _messages_answer(request: Request, api_request: ApiRequest) -> Response:
    answer_id, name = f"msg_{uuid.uuid4().hex}", api_request.model or request.app.state.service.name

    def whole(message: dict[str, Any], reason: str, by_stop_string: bool, stats: Stats) -> dict[str, Any]:
        return anthropic_api.message(answer_id, name, message,
                                     anthropic_api.stop_reason(reason, by_stop_string), None, stats)

    return await _split_answer(request, api_request, anthropic_api.EventWriter(answer_id, name), whole)


async def responses(request: Request) -> Response:
    """OpenAI's Responses API: the chat route's generation, as a response of output items or its events."""
    service: Service = request.app.state.service
    api_request = responses_api.parse_responses(await _json_body(request))
    writer = responses_api.ResponseWriter(api_request.model or service.name, int(time.time()))

    def whole(message: dict[str, Any], reason: str, _by_stop_string: bool, stats: Stats) -> dict[str, Any]:
        return writer.whole(message, stats, cut=reason == "length")

    return await _split_answer(request, api_request, writer, whole)


async def _split_answer(request: Request, api_request: ApiRequest, writer: EventWriter,
                        whole: Callable[[dict[str, Any], str, bool, Stats], dict[str, Any]]) -> Response:
    """A chat generation read through an `AnswerSplitter` (a thought, text, tool calls), answered in another API's
    shape: streamed by `writer`'s events, or `whole` (the chat message, the finish reason, whether a stop string
    ended it, the statistics)."""
    service: Service = request.app.state.service
    api_request = await service.prepare(api_request)
    job = service.submit(api_request)
    try:
        async with _watching(request, job):
            first = await _next(job)
            if isinstance(first, Failed):
                raise first.error
            assert isinstance(first, Started)
            splitter = AnswerSplitter(api_request.tools, first.thinking, service.dialect.convention)
            if api_request.stream:
                return StreamingResponse(_events(job, first, splitter, writer), media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            deltas: list[dict[str, Any]] = []
            while not isinstance(item := await _next(job), Finished):
                if isinstance(item, Failed):
                    raise item.error
                deltas += splitter.feed(item)
                if splitter.full:
                    item = _enough(job)
                    break
        message = _message([*deltas, *splitter.flush(cut=item.reason == "length")])
        return JSONResponse(whole(message, openai_api.called(item.reason, splitter.calls), item.by_stop_string,
                                  first.generation.stats))
    except BaseException:
        job.cancel()
        raise


async def _events(job: Job, started: Started, splitter: AnswerSplitter, writer: EventWriter) -> AsyncIterator[str]:
    """Another API's streamed events for one chat generation (`writer`'s), as the text comes."""
    stats = started.generation.stats
    try:
        for line in writer.start(stats):
            yield line
        while True:
            item = await job.items.get()
            if isinstance(item, str):
                for line in writer.deltas(splitter.feed(item)):
                    yield line
                if splitter.full:
                    item = _enough(job)
            if isinstance(item, Failed):
                yield writer.error(item.error)
                return
            if isinstance(item, Finished):
                for line in writer.deltas(splitter.flush(cut=item.reason == "length")):
                    yield line
                for line in writer.finish(openai_api.called(item.reason, splitter.calls), item.by_stop_string, stats):
                    yield line
                return
            if isinstance(item, Left):
                return
    finally:
        job.cancel()


async def native_completion(request: Request) -> Response:
    """llama-server's `/completion`: the completions route's generation, in llama.cpp's own shape."""
    body = native.completion_body(await _json_body(request))
    return await _native_answer(request, openai_api.parse_completion(body), body.get("return_tokens") is True)


async def infill(request: Request) -> Response:
    """llama-server's `/infill`: the code between a prefix and a suffix, through the model's own FIM tokens."""
    service: Service = request.app.state.service
    body = native.completion_body(await _json_body(request))
    api_request = openai_api.parse_completion({**body, "prompt": [0]})  # its fields; the prompt is made here
    target = service.pair.target_context
    prompt = native.infill_prompt(service.pair.target, body, target.n_batch, service.pair.n_ctx,
                                  api_request.max_tokens or -1)
    return await _native_answer(request, replace(api_request, prompt=prompt), body.get("return_tokens") is True)


async def _native_answer(request: Request, api_request: ApiRequest, return_tokens: bool) -> Response:
    service: Service = request.app.state.service
    api_request = await service.prepare(api_request)
    job = service.submit(api_request)
    name = api_request.model or service.name
    try:
        async with _watching(request, job):
            first = await _next(job)
            if isinstance(first, Failed):
                raise first.error
            assert isinstance(first, Started)
            if api_request.stream:
                return StreamingResponse(_native_stream(job, first, name), media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            pieces: list[str] = []
            while not isinstance(item := await _next(job), Finished):
                if isinstance(item, Failed):
                    raise item.error
                pieces.append(item)
        generation = first.generation
        return JSONResponse(native.completion_answer(name, "".join(pieces),
                                                     generation.token_ids if return_tokens else None, item,
                                                     generation.stats, openai_api.speculation(generation.stats)))
    except BaseException:
        job.cancel()
        raise


async def _native_stream(job: Job, started: Started, name: str) -> AsyncIterator[str]:
    """llama-server's stream of `/completion`: a piece of text an event (`stop` false), then the whole answer's
    fields with `stop` true; no `[DONE]`."""
    stats = started.generation.stats
    try:
        while True:
            item = await job.items.get()
            if isinstance(item, str):
                yield _event(native.completion_answer(name, item, None, None, stats, {}))
            elif isinstance(item, Failed):
                yield _event(item.error.body())
                return
            elif isinstance(item, Finished):
                yield _event(native.completion_answer(name, "", None, item, stats, openai_api.speculation(stats)))
                return
            elif isinstance(item, Left):
                return
    finally:
        job.cancel()


async def tokenize(request: Request) -> Response:
    return JSONResponse(native.tokenize(request.app.state.service.pair.target, await _json_body(request)))


async def detokenize(request: Request) -> Response:
    return JSONResponse(native.detokenize(request.app.state.service.pair.target, await _json_body(request)))


async def apply_template(request: Request) -> Response:
    return JSONResponse(native.apply_template(request.app.state.service, await _json_body(request)))


async def props(request: Request) -> Response:
    return JSONResponse(native.props(request.app.state.service))


async def slots(request: Request) -> Response:
    return JSONResponse(native.slots(request.app.state.service))


async def metrics(request: Request) -> Response:
    return PlainTextResponse(request.app.state.service.metrics(), media_type="text/plain; version=0.0.4")


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
        Route("/v1/responses", responses, methods=["POST"]),
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/completion", native_completion, methods=["POST"]),
        Route("/completions", native_completion, methods=["POST"]),
        Route("/infill", infill, methods=["POST"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/apply-template", apply_template, methods=["POST"]),
        Route("/props", props, methods=["GET"]),
        Route("/slots", slots, methods=["GET"]),
        *([Route("/metrics", metrics, methods=["GET"])] if metrics_route else []),
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
