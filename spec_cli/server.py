"""`spec serve`: OpenAI's HTTP API over one `Pair`, as a thin layer like the CLI.

Starlette routes the requests and uvicorn serves them: a small, well-kept ASGI stack whose streaming responses
are cancelled when the client goes away, which is what lets a disconnect stop its generation. Requests are
checked by `openai_api`, answered by `Pair.generate`, and its `TokenEvent`s become JSON or server-sent events.

One generation runs at a time, on one worker thread that alone touches the pair, in arrival order; at most
`queue_size` more wait, and past that a request is answered 503 at once. The worker hands text to the
request's asyncio task through a queue and checks between tokens whether the client is still there.
Successive chat requests that resend the history extend the exact tokens of the last answer (`PromptCache`),
so a turn costs its new tokens.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import socket
import threading
import time
import traceback
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from spec_cli import openai_api
from spec_cli.engine import Generation
from spec_cli.errors import SpecError
from spec_cli.openai_api import Answer, ApiRequest, RequestError
from spec_cli.pair import Pair
from spec_cli.prompt_cache import PromptCache
from spec_cli.sampling import settle
from spec_cli.stop_strings import StopStrings

DEFAULT_PORT = 8080
DEFAULT_QUEUE = 16
DISCONNECT_POLL_S = 0.25  # how often a request waiting for its turn checks that its client is still there


@dataclass(frozen=True)
class Defaults:
    """What a request that does not say gets: the CLI's flags, or the pair's tuned settings."""

    draft_max: int | str
    draft_mode: str
    verify: str
    max_tokens: int | None = None  # None: until the context is full


@dataclass(frozen=True)
class Started:
    generation: Generation


@dataclass(frozen=True)
class Finished:
    reason: str


@dataclass(frozen=True)
class Failed:
    error: RequestError


class Job:
    """One request's generation: the worker thread posts text and its outcome; the request's task reads them."""

    def __init__(self, request: ApiRequest, loop: asyncio.AbstractEventLoop) -> None:
        self.request = request
        self.items: asyncio.Queue[Started | str | Finished | Failed] = asyncio.Queue()
        self.cancelled = threading.Event()
        self._loop = loop

    def post(self, item: Started | str | Finished | Failed) -> None:
        try:
            self._loop.call_soon_threadsafe(self.items.put_nowait, item)
        except RuntimeError:  # the server's event loop has ended (a shutdown): nobody is left to read it
            self.cancel()

    def cancel(self) -> None:
        self.cancelled.set()


class Service:
    """The pair behind the API: a bounded line of jobs, served one at a time on one thread."""

    def __init__(self, pair: Pair, name: str, defaults: Defaults, queue_size: int = DEFAULT_QUEUE,
                 template: str | None = None, log: Callable[[str], None] = lambda _line: None) -> None:
        self.pair, self.name, self.defaults, self.queue_size = pair, name, defaults, queue_size
        self.template, self.log = template, log
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spec-serve")
        self._lock = threading.Lock()
        self._jobs: set[Job] = set()  # admitted and not yet done
        self._cache = PromptCache()

    @property
    def jobs(self) -> int:
        """Requests admitted and not yet done: the one generating and those waiting."""
        return len(self._jobs)

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.name:
            raise RequestError(f"model {model!r} is not served here; this server serves {self.name!r}",
                               param="model", code="model_not_found")

    def submit(self, request: ApiRequest) -> Job:
        """Queue a request, or refuse it at once when `queue_size` are already waiting."""
        job = Job(request, asyncio.get_running_loop())
        with self._lock:
            if len(self._jobs) > self.queue_size:
                raise RequestError(f"the server is busy: one generation runs and {self.queue_size} wait; "
                                   "try again shortly", code="server_busy", status=503, kind="server_error")
            self._jobs.add(job)
        self._worker.submit(self._serve, job)
        return job

    def close(self) -> None:
        """Stop every generation at its next token and wait for the worker: the pair may be closed after."""
        with self._lock:
            for job in self._jobs:
                job.cancel()
        self._worker.shutdown(wait=True, cancel_futures=True)

    def _serve(self, job: Job) -> None:
        try:
            if not job.cancelled.is_set():  # a client that left while waiting costs nothing
                self._generate(job)
        except Exception as exc:  # a bug: the client gets a 500, the server's log the traceback
            job.post(Failed(RequestError(f"internal error: {exc!r}", status=500, kind="server_error")))
            self.log(f"internal error:\n{traceback.format_exc()}")
        finally:
            with self._lock:
                self._jobs.discard(job)

    def _generate(self, job: Job) -> None:
        request = job.request
        try:
            text, tokens = self._prompt(request)
            generation = self.pair.generate(
                tokens, sampling=settle("model", self.pair.recommended_sampling(), request.sampling),
                seed=request.seed, draft_mode=request.draft_mode or self.defaults.draft_mode,
                verify=request.verify or self.defaults.verify,
                draft_max=self.defaults.draft_max if request.draft_max is None else request.draft_max,
                max_tokens=request.max_tokens or self.defaults.max_tokens or self.pair.n_ctx)
        except RequestError as exc:
            job.post(Failed(exc))
            return
        except SpecError as exc:
            job.post(Failed(RequestError(str(exc))))
            return
        job.post(Started(generation))
        stops = StopStrings(request.stop)
        try:
            self._hand_over(job, generation, stops)
        except SpecError as exc:
            job.post(Failed(RequestError(str(exc), status=500, kind="server_error")))
            return
        if job.cancelled.is_set():
            self.log(f"{request.endpoint}: the client went away after {generation.stats.generated_tokens} "
                     "tokens; generation stopped")
            return
        if text is not None and not stops.stopped:  # an answer cut at a stop string is not what the model saw
            self._cache.remember(text + generation.text, tokens + generation.token_ids)
        reason = openai_api.finish_reason(generation.finish_reason, stops.stopped)
        job.post(Finished(reason))
        self.log(f"{request.endpoint}: {_summary(generation, reason)}")

    @staticmethod
    def _hand_over(job: Job, generation: Generation, stops: StopStrings) -> None:
        """Post the generation's text as it comes, cut at the stop strings; stop when the client has left.

        A round's tokens come at once and end with the target's own: they are handed over together, so that
        the event loop wakes (and a stream writes a chunk, and its client parses one) once a round rather
        than once a token, which on a small machine takes CPU time from the model."""
        events = iter(generation)
        ready = ""
        try:
            for event in events:
                ready += stops.feed(event.text)
                if stops.stopped or job.cancelled.is_set():
                    break
                if not event.from_draft and ready:
                    job.post(ready)
                    ready = ""
        finally:
            events.close()
        ready += stops.flush()
        if ready and not job.cancelled.is_set():
            job.post(ready)

    def _prompt(self, request: ApiRequest) -> tuple[str | None, list[int]]:
        """The prompt's text (None for token ids) and tokens, extending the last answer's where they can."""
        model = self.pair.target
        if request.endpoint == "chat":
            text: str | None = model.format_chat(request.messages, template=self.template)
        else:
            text = request.prompt if isinstance(request.prompt, str) else None
        tokens = self._cache.tokens_for(model, text) if text is not None else list(request.prompt)
        if any(token >= model.n_vocab for token in tokens):
            raise RequestError(f"the prompt has token ids outside the vocabulary (0 to {model.n_vocab - 1})",
                               param="prompt")
        if len(tokens) >= self.pair.n_ctx:
            raise RequestError(f"the prompt is {len(tokens)} tokens but the context holds {self.pair.n_ctx}; "
                               "shorten it (or start the server with a larger --ctx)",
                               param="messages" if request.endpoint == "chat" else "prompt",
                               code="context_length_exceeded")
        return text, tokens


def _summary(generation: Generation, reason: str) -> str:
    s = generation.stats
    parts = [f"{s.prompt_tokens} prompt tokens ({s.prompt_cached} cached)", f"{s.generated_tokens} tokens",
             f"{s.tokens_per_second:.1f} tok/s"]
    if s.drafted:
        parts.append(f"acceptance {s.accepted}/{s.drafted}, {s.mean_accepted_length:.2f} tokens/pass")
    return " · ".join([*parts, f"finish {reason}"])


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


def reachable_from_outside(host: str, allow_remote: bool) -> bool:
    """Whether `host` (an IP address or localhost) lets other machines in; that needs `allow_remote`."""
    if host == "localhost":
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise SpecError(f"--host must be an IP address such as 127.0.0.1 or 0.0.0.0, got {host!r}") from None
    if not address.is_loopback and not allow_remote:
        raise SpecError(f"--host {host} lets other machines use this server; add --allow-remote if that is "
                        "what you want (and --api-key to require a key)")
    return not address.is_loopback


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
