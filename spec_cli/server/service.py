"""The pair behind the API: up to `parallel` generations at once, one verify pass a step for all of them
(`decoding.scheduler`), run by one worker thread that alone touches the pair; at most `queue_size` more
requests wait, in arrival order, and past that a request is refused at once. The worker hands text to each
request's asyncio task through a queue, once a round, and checks between steps whether its client is still
there. Each slot remembers its last conversation (`PromptCache`): a request goes to the free slot holding the
longest prefix of its prompt, so a chat that resends its history costs its new tokens even when other
clients' requests come in between.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass, replace
from typing import Callable

from spec_cli.decoding.engine import Generation, TokenEvent
from spec_cli.conversation.prompt_cache import PromptCache
from spec_cli.decoding.sampling import resolve_sampling
from spec_cli.decoding.scheduler import Scheduler
from spec_cli.formats.dialect import Dialect
from spec_cli.errors import SpecError
from spec_cli.llama.grammar import GrammarError
from spec_cli.llama.prefix_store import PrefixStore
from spec_cli.llama.prompt_text import PromptText
from spec_cli.pair import Pair, Slot
from spec_cli.request import GenerationRequest, InvalidRequest, ReasoningBudget, shown
from spec_cli.api import images, openai_api
from spec_cli.api.errors import RequestError
from spec_cli.api.images import ImageUrl
from spec_cli.decoding.stats import Stats
from spec_cli.server.jobs import Failed, Finished, Job, Started
from spec_cli.server.metrics import exposition
from spec_cli.api.openai_api import PARAMS, ApiRequest
from spec_cli.api.stop_strings import StopStrings
from spec_cli.api.tool_calls import spelt_out, template_messages
from spec_cli.reports.summary import summary_line

DEFAULT_QUEUE = 16
COMPILERS = 2  # grammars compiled at once, off the event loop and the generation worker
COMPILE_LIMIT_S = 10.0  # a constraint that takes longer to compile is refused as too complex
COMPILE_NICE = 10  # the compiling threads' nice value: a tenth of a decoding thread's share where both wait
RATE_WINDOW_S = 10.0  # /health's tokens per second: over the last this many seconds


def _yield_to_generation() -> None:
    """A compiling thread gives way to llama.cpp's: on a machine whose cores all decode, a compile that competes
    with them as an equal stretches every step of every stream (Linux: a thread's own nice value)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), COMPILE_NICE)


@dataclass
class _Active:
    """A job that has a slot: its generation, the stop strings that cut its text, the text waiting to be posted,
    and its prompt (the text, None for token ids, and the tokens) for the slot's cache."""

    job: Job
    slot: Slot
    generation: Generation
    stops: StopStrings
    prompt: PromptText | None
    tokens: list[int]
    ready: str = ""


class Service:
    """The pair behind the API: `parallel` slots generating together, and a bounded line of jobs waiting."""

    def __init__(self, pair: Pair, name: str, defaults: GenerationRequest = GenerationRequest(),
                 max_tokens: int | None = None, queue_size: int = DEFAULT_QUEUE, template: str | None = None,
                 log: Callable[[str], None] = lambda _line: None, parallel: int = 1,
                 reasoning_budget: int | None = None, cache_ram: int = 0, allow_image_urls: bool = False) -> None:
        """`defaults`: what a request that does not say gets (the CLI's flags, or the pair's tuned settings);
        `max_tokens`: the longest answer for requests that set none (None: until the context is full);
        `parallel`: how many generations run at once (`Pair.slots`); `reasoning_budget`: the tokens of thought
        a chat that sets none may take (None: no bound); `cache_ram`: the bytes of host RAM that keep finished
        sequences' states for requests on other slots (`PrefixStore`; 0: none); `allow_image_urls`: fetch the
        images a chat gives as http(s) URLs (else only data: URLs are taken)."""
        self.reasoning_budget = reasoning_budget
        self.allow_image_urls = allow_image_urls
        self._store = PrefixStore(cache_ram) if cache_ram > 0 else None
        self.pair, self.name, self.defaults, self.queue_size = pair, name, defaults, queue_size
        self.max_tokens = max_tokens
        self.template, self.log = template, log
        self.dialect = Dialect(pair.target, template, log)  # how the template has its model talk
        self.parallel = parallel
        self._slots = pair.slots(parallel)
        self._caches = {id(slot): PromptCache() for slot in self._slots}
        self._free = list(self._slots)
        self._scheduler = Scheduler()
        self._active: dict[int, _Active] = {}  # by id(generation)
        self._waiting: collections.deque[Job] = collections.deque()
        self._lock = threading.Condition()
        self._jobs: set[Job] = set()  # admitted and not yet done
        self._closing = False
        self._emitted: collections.deque[tuple[float, int]] = collections.deque()  # (when, tokens) of recent steps
        self._busy = False  # the worker is starting requests or running a step
        self._phases: list[dict[str, object]] = self._idle_phases()  # each slot's, as the worker last saw them
        self._finished = Stats(draft_max=0)  # every finished generation's counts: /health's acceptance, /metrics
        self._n_tokens_max = 0  # the most tokens a sequence has held
        self._worker = threading.Thread(target=self._work, name="spec-serve", daemon=True)
        self._worker.start()
        self._compilers = concurrent.futures.ThreadPoolExecutor(COMPILERS, thread_name_prefix="spec-compile",
                                                                initializer=_yield_to_generation)
        self._compilers.submit(lambda: pair.constraints.tokenizer)  # built once, before the first schema comes

    async def prepare(self, request: ApiRequest) -> ApiRequest:
        """`request` with its constraint compiled (`openai_api.structure`, then over the target's vocabulary,
        where the compiled grammar is kept for the worker) in the bounded pool of compilers, never on the event
        loop or the generation worker: a large schema delays no other request. One that takes longer than
        `COMPILE_LIMIT_S` is refused as too complex. Images given as http(s) URLs are fetched here too, in the
        same pool (`images`), where the server allows it."""
        if any(isinstance(image, ImageUrl) for image in request.images):
            request = await self._fetched(request)
        if request.asked is None and request.tools is None:
            return request
        work = asyncio.get_running_loop().run_in_executor(self._compilers, self._compile, request)
        try:
            return await asyncio.wait_for(asyncio.shield(work), COMPILE_LIMIT_S)
        except asyncio.TimeoutError:
            raise RequestError(f"the constraint is too complex: compiling it took more than {COMPILE_LIMIT_S:g} s",
                               param=request.asked.field if request.asked else "tools",
                               code="constraint_too_complex") from None

    async def _fetched(self, request: ApiRequest) -> ApiRequest:
        urls = [image for image in request.images if isinstance(image, ImageUrl)]
        if not self.allow_image_urls:
            raise RequestError(f"{urls[0].where}: this server does not fetch image URLs; send the image as a data: "
                               "URL (data:image/png;base64,…), or start spec serve with --allow-image-urls",
                               param=urls[0].where)
        loop = asyncio.get_running_loop()
        fetched = await asyncio.gather(*(loop.run_in_executor(self._compilers, images.fetch, image)
                                         for image in urls))
        found = iter(fetched)
        return replace(request, images=tuple(next(found) if isinstance(image, ImageUrl) else image
                                             for image in request.images))

    def _compile(self, request: ApiRequest) -> ApiRequest:
        dialect = self.dialect
        request = (openai_api.structure(request, dialect.convention, dialect.thought, dialect.spell)
                   if request.endpoint == "chat" else openai_api.structure(request))
        if request.grammar is not None:
            try:
                self.pair.constraints.compile(request.grammar)
            except GrammarError as exc:
                asked = request.asked
                raise RequestError(f"{asked.name if asked else 'tools'}: {exc}",
                                   param=asked.field if asked else "tools") from None
        return request

    @property
    def jobs(self) -> int:
        """Requests admitted and not yet done: those generating and those waiting. A cancelled one (its client
        left) no longer counts: it costs the worker a step at most, and its place in the line is free."""
        with self._lock:
            return sum(not job.cancelled.is_set() for job in self._jobs)

    def health(self) -> dict[str, object]:
        """What /health reports: whether the worker is busy, each slot's phase (idle; its prompt being fed, with
        progress; its drafter catching up; generating; stopping, once its client left), the requests waiting,
        the tokens per second of the last `RATE_WINDOW_S` seconds, and the acceptance of every drafted token so
        far. The phases are the worker's own, as of its last step."""
        with self._lock:
            phases = [dict(phase) for phase in self._phases]
            waiting = sum(not job.cancelled.is_set() for job in self._waiting)
            now = time.monotonic()
            recent = sum(n for when, n in self._emitted if when >= now - RATE_WINDOW_S)
            drafted = self._finished.drafted + sum(a.generation.stats.drafted for a in self._active.values())
            accepted = self._finished.accepted + sum(a.generation.stats.accepted for a in self._active.values())
            busy = self._busy or bool(self._active)
        active = sum(phase["phase"] != "idle" for phase in phases)
        return {"busy": busy, "generating": any(phase["phase"] == "generating" for phase in phases),
                "waiting": waiting, "slots": self.parallel, "active": active, "phases": phases,
                "tokens_per_second": recent / RATE_WINDOW_S, "acceptance": accepted / drafted if drafted else None,
                **({"cache_ram": self._store.report()} if self._store is not None else {})}

    def metrics(self) -> str:
        """`/metrics`' text: the counts of every generation so far, finished and running, and the requests now."""
        with self._lock:
            totals = Stats(draft_max=0)
            for stats in (self._finished, *(a.generation.stats for a in self._active.values())):
                totals.merge(stats)
            processing = len(self._active)
            deferred = sum(not job.cancelled.is_set() for job in self._waiting)
            n_tokens_max = max([self._n_tokens_max, *(len(a.generation.token_ids) + a.generation.stats.prompt_tokens
                                                     for a in self._active.values())])
        return exposition(totals, processing, deferred, n_tokens_max)

    def _idle_phases(self) -> list[dict[str, object]]:
        return [{"slot": i, "phase": "idle"} for i in range(self.parallel)]

    def _publish(self) -> None:
        """Note each slot's phase as the worker sees it now, for /health (held: lock)."""
        phases = self._idle_phases()
        for active in self._active.values():
            slot = self._slots.index(active.slot)
            phase = self._scheduler.phase(active.generation)
            if active.job.cancelled.is_set():
                phase = {"phase": "stopping"}
            phases[slot] = {"slot": slot, **phase, "endpoint": active.job.request.endpoint}
        self._phases = phases

    def check_model(self, model: str) -> None:
        """`/v1/models/{model}` describes the one model listed; a generation answers to any name (`_answer`)."""
        if model != self.name:
            raise RequestError(f"model {shown(model)} is not listed here; this server lists {self.name!r} (and "
                               "answers generation requests under any model name)",
                               param="model", code="model_not_found", status=404, kind="not_found_error")

    def submit(self, request: ApiRequest) -> Job:
        """Queue a request, or refuse it at once when every slot is busy and `queue_size` already wait."""
        job = Job(request, asyncio.get_running_loop())
        if self.jobs >= self.parallel + self.queue_size:
            raise RequestError(f"the server is busy: {self.parallel} generating and {self.queue_size} waiting; "
                               "try again shortly", code="server_busy", status=503, kind="server_error")
        with self._lock:
            self._jobs.add(job)
            self._waiting.append(job)
            self._lock.notify()
        return job

    def close(self) -> None:
        """Stop every generation at the next step and wait for the worker: the pair may be closed after."""
        with self._lock:
            self._closing = True
            for job in self._jobs:
                job.cancel()
            self._lock.notify()
        self._worker.join()
        self._compilers.shutdown(wait=True, cancel_futures=True)  # a compile reads the model, closed after

    def _work(self) -> None:
        """The worker: start waiting jobs on free slots, run a step, hand each job its text; until closed."""
        while True:
            with self._lock:
                while not (self._closing or self._waiting or self._active):
                    self._lock.wait()
                if self._closing:
                    break
                starting = self._admit()
                self._busy = True
            for job in starting:
                self._guarded(job, self._start, job)
            self._drop_cancelled()
            with self._lock:
                self._publish()
            if self._active:
                self._step()
            with self._lock:
                self._publish()
                self._busy = False
        for active in list(self._active.values()):
            self._leave(active)

    def _admit(self) -> list[Job]:
        """Waiting jobs, in arrival order, as many as there are free slots (held: lock)."""
        starting: list[Job] = []
        while self._waiting and len(starting) < len(self._free):
            job = self._waiting.popleft()
            if job.cancelled.is_set():  # a client that left while waiting costs nothing
                self._jobs.discard(job)
                continue
            starting.append(job)
        return starting

    def _guarded(self, job: Job, work: Callable[..., None], *args: object) -> None:
        """Run `work` for `job`; a bug fails the job with a 500 and the server's log has the traceback."""
        try:
            work(*args)
        except Exception as exc:
            self._fail(job, RequestError(f"internal error ({type(exc).__name__}); the server's log has the details",
                                         status=500, kind="server_error"))
            self.log(f"internal error:\n{traceback.format_exc()}")

    def _start(self, job: Job) -> None:
        """Make the job's generation on the best free slot for its prompt and join the scheduler; a request that
        cannot start is answered now."""
        request = job.request
        try:
            prompt, tokens, slot = self._prompt(request)
            settings = self._request(request)
            generation = slot.generate(tokens, settings)
        except RequestError as exc:
            self._fail(job, exc)
            return
        except InvalidRequest as exc:
            param = "messages" if exc.field == "prompt" and request.endpoint == "chat" else exc.field
            self._fail(job, RequestError(exc.named(PARAMS), param=param, code=exc.code))
            return
        except SpecError as exc:
            self._fail(job, RequestError(str(exc)))
            return
        # A template that opens a thought starts the answer inside it (a grammar lets the thought come first).
        opened = request.endpoint == "chat" and prompt is not None and \
            prompt.text.rstrip().endswith(self.dialect.convention.think_open)
        job.post(Started(generation, thinking=opened))
        with self._lock:
            self._free.remove(slot)
            self._active[id(generation)] = _Active(job, slot, generation, StopStrings(settings.stop), prompt, tokens)
        self._scheduler.join(generation)

    def _fail(self, job: Job, error: RequestError) -> None:
        job.post(Failed(error))
        with self._lock:
            self._jobs.discard(job)

    def _step(self) -> None:
        """One scheduler step; each job gets its round's text, and those that ended leave. An error of the model
        (a lost RPC worker) ends every generation of the step."""
        try:
            emitted = self._scheduler.step()
        except SpecError as exc:
            self._fail_all(RequestError(str(exc), status=500, kind="server_error"))
            return
        except Exception as exc:
            self._fail_all(RequestError(f"internal error ({type(exc).__name__}); the server's log has the details",
                                        status=500, kind="server_error"))
            self.log(f"internal error:\n{traceback.format_exc()}")
            return
        with self._lock:
            self._emitted.append((time.monotonic(), sum(len(events) for _, events in emitted)))
            while self._emitted and self._emitted[0][0] < time.monotonic() - RATE_WINDOW_S:
                self._emitted.popleft()
        for generation, events in emitted:
            active = self._active.get(id(generation))
            if active is not None:
                self._guarded(active.job, self._hand_over, active, events)

    def _hand_over(self, active: _Active, events: list[TokenEvent]) -> None:
        """Post a round's text at once, cut at the stop strings: the event loop wakes (and a stream writes a
        chunk, and its client parses one) once a round rather than once a token, which on a small machine takes
        CPU time from the model. A job whose text is complete, or whose client left, leaves; one whose own work
        failed (its grammar asked for text no token spells) is answered with the error, alone."""
        if active.generation.error is not None:
            self._failed_alone(active, active.generation.error)
            return
        for event in events:
            active.ready += active.stops.feed(event.text)
            if active.stops.stopped:
                break
        if active.stops.stopped or active.generation.finish_reason is not None:
            active.ready += active.stops.flush()
        if active.ready and not active.job.cancelled.is_set():
            active.job.post(active.ready)
        active.ready = ""
        if active.stops.stopped or active.generation.finish_reason is not None or active.job.cancelled.is_set():
            self._leave(active)

    def _failed_alone(self, active: _Active, error: Exception) -> None:
        """Answer a job whose own work failed with its error (a 400 when its grammar is at fault), and log it."""
        endpoint = active.job.request.endpoint
        if isinstance(error, SpecError):
            answer = (RequestError(f"the generation failed: {error}") if isinstance(error, GrammarError)
                      else RequestError(f"the generation failed: {error}", status=500, kind="server_error"))
            self.log(f"{endpoint}: failed after {active.generation.stats.generated_tokens} tokens, alone: {error}")
        else:
            answer = RequestError(f"internal error ({type(error).__name__}); the server's log has the details",
                                  status=500, kind="server_error")
            self.log(f"{endpoint}: internal error, this request alone:\n"
                     f"{''.join(traceback.format_exception(error))}")
        active.job.post(Failed(answer))
        self._leave(active, answered=True)

    def _drop_cancelled(self) -> None:
        for active in list(self._active.values()):
            if active.job.cancelled.is_set():
                self._leave(active)

    def _fail_all(self, error: RequestError) -> None:
        for active in list(self._active.values()):
            active.job.post(Failed(error))
            self._leave(active, answered=True)

    def _leave(self, active: _Active, answered: bool = False) -> None:
        """The job is over: its generation leaves the scheduler (stopped if still running), its slot is free
        and remembers the conversation, and the job gets its finish reason (unless its client left)."""
        generation, job = active.generation, active.job
        self._scheduler.leave(generation)
        if self._store is not None and generation.error is None and not self._closing:
            self._store.save(active.slot.contexts())
        stats = generation.stats
        with self._lock:
            del self._active[id(generation)]
            self._free.append(active.slot)
            self._jobs.discard(job)
            self._finished.merge(stats)
            self._n_tokens_max = max(self._n_tokens_max, stats.prompt_tokens + stats.generated_tokens)
        endpoint = job.request.endpoint
        if answered:
            return
        if job.cancelled.is_set():
            if job.enough:
                self.log(f"{endpoint}: stopped after the most tool calls a turn may hold "
                         f"({stats.generated_tokens} tokens)")
            elif not self._closing:
                self.log(f"{endpoint}: the client went away after {stats.generated_tokens} tokens; generation stopped")
            return
        if active.prompt is not None and not active.stops.stopped:  # an answer cut at a stop string is not what
            # the model saw
            self._caches[id(active.slot)].remember(active.prompt.text + generation.text,
                                                   active.tokens + generation.token_ids)
        reason = openai_api.finish_reason(generation.finish_reason or "stop", active.stops.stopped)
        job.post(Finished(reason, active.stops.stopped))
        self.log(f"{endpoint}: {summary_line(stats, reason)}")

    def _request(self, request: ApiRequest) -> GenerationRequest:
        """The server's defaults under what the request sets; sampling it leaves out follows what the target's
        GGUF recommends, as in spec chat. A forced tool call is a grammar like any other (`openai_api.structure`)."""
        return replace(self.defaults, **request.fields, stop=request.stop, grammar=request.grammar,
                       sampling=resolve_sampling("model", self.pair.recommended_sampling(), request.sampling),
                       max_tokens=request.max_tokens or self.max_tokens or self.pair.n_ctx,
                       reasoning_budget=self._budget(request),
                       control_text=request.endpoint == "chat" and self.dialect.reads_markers(request.tools is not None))

    def _budget(self, request: ApiRequest) -> ReasoningBudget | None:
        """The request's reasoning budget (or the server's), where its template has a thought to close."""
        tokens = request.reasoning_budget if request.reasoning_budget is not None else self.reasoning_budget
        thought = self.dialect.thought if request.endpoint == "chat" else None
        if tokens is None or thought is None:
            return None
        return ReasoningBudget(tokens, thought.close, None if thought.opened else thought.open)

    def _prompt(self, request: ApiRequest) -> tuple[PromptText | None, list[int], Slot]:
        """The prompt (None for token ids), its tokens, and the free slot to run it on: the one whose memory
        holds the longest prefix of it, less half of what that memory would lose (a new conversation goes to an
        empty slot rather than to one whose conversation merely starts with the same template markers), its
        tokens extending that slot's last answer's where they can. A chat's messages are text: only the
        template's markers become control tokens. A completion's prompt is raw, as in llama-server: control
        tokens spelt in it are parsed."""
        model = self.pair.target
        if request.endpoint == "chat":
            prompt: PromptText | None = self.chat_prompt(request)
        else:
            prompt = PromptText(request.prompt) if isinstance(request.prompt, str) else None
        best: tuple[float, list[int], Slot] | None = None
        pieces = self.pair.see(request.images)  # type: ignore[arg-type]  # URLs were fetched by `prepare`
        for candidate in list(self._free):
            tokens = (list(request.prompt) if prompt is None
                      else self._caches[id(candidate)].tokens_for(model, prompt, pieces))
            score = candidate.fits(tokens)
            if best is None or score > best[0]:
                best = (score, tokens, candidate)
        assert best is not None
        if self._store is not None:
            self._store.load(best[2].contexts(), best[1])
        return prompt, best[1], best[2]

    def chat_prompt(self, request: ApiRequest) -> PromptText:
        """The chat's prompt; with tools (or calls in the history), the template's own way of showing them when
        it has one, else the tools described in the system message (`tool_calls.spelt_out`)."""
        model, messages, tools = self.pair.target, request.messages, request.tools
        if tools is None and not any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
            return model.format_chat(messages, template=self.template)
        if self.dialect.takes_tools:
            return model.format_chat(template_messages(messages), template=self.template,
                                     tools=tools.as_template_takes_them() if tools is not None else None)
        return model.format_chat(spelt_out(messages, tools), template=self.template)
