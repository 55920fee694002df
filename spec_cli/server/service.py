"""The pair behind the API: a bounded line of jobs, served one at a time on one worker thread that alone
touches the pair, in arrival order; at most `queue_size` more wait, and past that a request is refused at
once. The worker hands text to the request's asyncio task through a queue and checks between tokens whether
the client is still there. Successive chat requests that resend the history extend the exact tokens of the
last answer (`PromptCache`), so a turn costs its new tokens.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Callable

from spec_cli.decoding.engine import Generation
from spec_cli.decoding.prompt_cache import PromptCache
from spec_cli.decoding.sampling import settle
from spec_cli.errors import SpecError
from spec_cli.llama.prompt_text import PromptText
from spec_cli.pair import Pair
from spec_cli.request import GenerationRequest, InvalidRequest, shown
from spec_cli.server import openai_api
from spec_cli.server.errors import RequestError
from spec_cli.server.openai_api import PARAMS, ApiRequest
from spec_cli.server.stop_strings import StopStrings
from spec_cli.server.tool_calls import THINK_OPEN, call_grammar, spelt_out, template_messages
from spec_cli.summary import summary_line

DEFAULT_QUEUE = 16


@dataclass(frozen=True)
class Started:
    """The generation has begun; `thinking`: the prompt opened a thought, so the answer starts inside one."""

    generation: Generation
    thinking: bool = False


@dataclass(frozen=True)
class Finished:
    reason: str


@dataclass(frozen=True)
class Failed:
    error: RequestError


@dataclass(frozen=True)
class Left:
    """The client closed its connection: posted by the face that saw it go, for the request's task to stop."""


class Job:
    """One request's generation: the worker thread posts text and its outcome; the request's task reads them."""

    def __init__(self, request: ApiRequest, loop: asyncio.AbstractEventLoop) -> None:
        self.request = request
        self.items: asyncio.Queue[Started | str | Finished | Failed | Left] = asyncio.Queue()
        self.cancelled = threading.Event()
        self._loop = loop

    def post(self, item: Started | str | Finished | Failed) -> None:
        try:
            self._loop.call_soon_threadsafe(self.items.put_nowait, item)
        except RuntimeError:  # the server's event loop has ended (a shutdown): nobody is left to read it
            self.cancel()

    def cancel(self) -> None:
        self.cancelled.set()

    def leave(self) -> None:
        """The client has gone (called on the event loop): stop the generation and the request's task."""
        self.cancel()
        self.items.put_nowait(Left())


class Service:
    """The pair behind the API: a bounded line of jobs, served one at a time on one thread."""

    def __init__(self, pair: Pair, name: str, defaults: GenerationRequest = GenerationRequest(),
                 max_tokens: int | None = None, queue_size: int = DEFAULT_QUEUE, template: str | None = None,
                 log: Callable[[str], None] = lambda _line: None) -> None:
        """`defaults`: what a request that does not say gets (the CLI's flags, or the pair's tuned settings);
        `max_tokens`: the longest answer for requests that set none (None: until the context is full)."""
        self.pair, self.name, self.defaults, self.queue_size = pair, name, defaults, queue_size
        self.max_tokens = max_tokens
        self.template, self.log = template, log
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spec-serve")
        self._lock = threading.Lock()
        self._jobs: set[Job] = set()  # admitted and not yet done
        self._cache = PromptCache()

    @property
    def jobs(self) -> int:
        """Requests admitted and not yet done: the one generating and those waiting. A cancelled one (its client
        left) no longer counts: it costs the worker a token at most, and its place in the line is free."""
        with self._lock:
            return sum(not job.cancelled.is_set() for job in self._jobs)

    def check_model(self, model: str | None, status: int = 400) -> None:
        if model is not None and model != self.name:
            raise RequestError(f"model {shown(model)} is not served here; this server serves {self.name!r}",
                               param="model", code="model_not_found", status=status,
                               kind="not_found_error" if status == 404 else "invalid_request_error")

    def submit(self, request: ApiRequest) -> Job:
        """Queue a request, or refuse it at once when `queue_size` are already waiting."""
        job = Job(request, asyncio.get_running_loop())
        if self.jobs > self.queue_size:
            raise RequestError(f"the server is busy: one generation runs and {self.queue_size} wait; "
                               "try again shortly", code="server_busy", status=503, kind="server_error")
        with self._lock:
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
            job.post(Failed(RequestError(f"internal error ({type(exc).__name__}); the server's log has the details",
                                         status=500, kind="server_error")))
            self.log(f"internal error:\n{traceback.format_exc()}")
        finally:
            with self._lock:
                self._jobs.discard(job)

    def _generate(self, job: Job) -> None:
        request = job.request
        try:
            prompt, tokens = self._prompt(request)
            settings = self._request(request)
            generation = self.pair.generate(tokens, settings)
        except RequestError as exc:
            job.post(Failed(exc))
            return
        except InvalidRequest as exc:
            param = "messages" if exc.field == "prompt" and request.endpoint == "chat" else exc.field
            job.post(Failed(RequestError(exc.named(PARAMS), param=param, code=exc.code)))
            return
        except SpecError as exc:
            job.post(Failed(RequestError(str(exc))))
            return
        text = prompt.text if prompt is not None else None
        # A template that opens a thought starts the answer inside it, unless a grammar decides the answer.
        opened = text is not None and text.rstrip().endswith(THINK_OPEN) and settings.grammar is None
        job.post(Started(generation, thinking=opened))
        stops = StopStrings(settings.stop)
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
        self.log(f"{request.endpoint}: {summary_line(generation.stats, reason)}")

    def _request(self, request: ApiRequest) -> GenerationRequest:
        """The server's defaults under what the request sets; sampling it leaves out follows what the target's
        GGUF recommends, as in spec chat. A forced tool call is a grammar like any other."""
        tools = request.tools
        forced = call_grammar(tools) if tools is not None and tools.forced else None
        return replace(self.defaults, **request.fields, stop=request.stop, grammar=request.grammar or forced,
                       sampling=settle("model", self.pair.recommended_sampling(), request.sampling),
                       max_tokens=request.max_tokens or self.max_tokens or self.pair.n_ctx)

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

    def _prompt(self, request: ApiRequest) -> tuple[PromptText | None, list[int]]:
        """The prompt (None for token ids) and its tokens, extending the last answer's where they can. A chat's
        messages are text: only the template's markers become control tokens. A completion's prompt is raw, as
        in llama-server: control tokens spelt in it are parsed."""
        model = self.pair.target
        if request.endpoint == "chat":
            prompt: PromptText | None = self._chat_prompt(request)
        else:
            prompt = PromptText(request.prompt) if isinstance(request.prompt, str) else None
        if prompt is None:
            return None, list(request.prompt)
        return prompt, self._cache.tokens_for(model, prompt)

    def _chat_prompt(self, request: ApiRequest) -> PromptText:
        """The chat's prompt; with tools (or calls in the history), the template's own way of showing them when
        it has one, else the tools described in the system message (`tool_calls.spelt_out`)."""
        model, messages, tools = self.pair.target, request.messages, request.tools
        if tools is None and not any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
            return model.format_chat(messages, template=self.template)
        if self._template_takes_tools:
            return model.format_chat(template_messages(messages), template=self.template,
                                     tools=tools.as_template_takes_them() if tools is not None else None)
        return model.format_chat(spelt_out(messages, tools), template=self.template)

    @functools.cached_property
    def _template_takes_tools(self) -> bool:
        """Whether the chat template shows the tools it is given (a probe tool's name appears in its prompt)."""
        probe = [{"type": "function", "function": {"name": "spec_probe_tool", "parameters": {"type": "object"}}}]
        shown_with = self.pair.target.format_chat([{"role": "user", "content": "hi"}], template=self.template,
                                                  tools=probe)
        return "spec_probe_tool" in shown_with.text
