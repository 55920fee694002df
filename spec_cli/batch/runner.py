"""Running a batch's tasks: `parallel` at once on the pair's slots, one verify pass a step for all of them
(`decoding.scheduler`), K for each by the batch's goodput; a new task starts as soon as a slot is free.

A task goes to the free slot whose memory holds the longest prefix of its prompt, so that a shared instruction
is prefilled once per slot rather than once per prompt. Each task's own failure (a schema the grammar cannot
express, a prompt longer than the context, its grammar failing halfway) is its result; the others go on.

Several slots hold only as many tokens each as the longest task needs (its prompt and its max_tokens), within the
pair's context (`Pair.slots`): a batch of short prompts waited seconds on KV caches sized for the whole context.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Sequence

from spec_cli.batch.lines import OPENAI, Task
from spec_cli.batch.output import Result
from spec_cli.decoding.engine import Generation
from spec_cli.decoding.scheduler import Scheduler
from spec_cli.errors import SpecError
from spec_cli.llama.model import Model
from spec_cli.llama.vision import Image
from spec_cli.pair import Pair, Slot, text_tokens
from spec_cli.request import GenerationRequest, InvalidRequest
from spec_cli.api import openai_api
from spec_cli.api.errors import RequestError
from spec_cli.api.openai_api import Answer, ApiRequest
from spec_cli.api.stop_strings import StopStrings


@dataclass
class _Running:
    task: Task
    request: ApiRequest
    slot: Slot
    generation: Generation
    stops: StopStrings
    text: str = ""


class BatchRunner:
    """A pair's slots and one scheduler, running tasks with `base`'s settings under what each line sets."""

    def __init__(self, pair: Pair, parallel: int, base: GenerationRequest, form: str, name: str,
                 tasks: Sequence[Task] = ()) -> None:
        """`tasks`: those the batch will run, where they are known before it starts: the slots hold what they need."""
        self.pair, self.base, self.form, self.name = pair, base, form, name
        self._slots = pair.slots(parallel, held_tokens(tasks, pair.target, base.max_tokens) if parallel > 1 else None)
        self._scheduler = Scheduler()

    def run(self, tasks: Iterable[Task], finished: Callable[[Result], None],
            stepped: Callable[[int], None] = lambda _tokens: None) -> None:
        """Run every task, calling `finished` with each result as it comes (a task that cannot start at once)
        and `stepped` with the tokens each step emitted. An interruption (Ctrl-C) stops the generations in
        progress, whose results are not given."""
        waiting = iter(tasks)
        free, running = list(self._slots), {}
        try:
            while True:
                while free:
                    task = next(waiting, None)
                    if task is None:
                        break
                    started = self._start(task, free)
                    if isinstance(started, Result):
                        finished(started)
                    else:
                        free.remove(started.slot)
                        running[id(started.generation)] = started
                if not running:
                    return
                emitted = self._scheduler.step()
                stepped(sum(len(events) for _, events in emitted))
                for generation, events in emitted:
                    task_run = running[id(generation)]
                    for event in events:
                        task_run.text += task_run.stops.feed(event.text)
                        if task_run.stops.stopped:
                            self._scheduler.leave(generation)
                            break
                    if generation.finish_reason is not None:
                        del running[id(generation)]
                        free.append(task_run.slot)
                        finished(self._result(task_run))
        finally:
            for task_run in running.values():
                self._scheduler.leave(task_run.generation)

    def _start(self, task: Task, free: list[Slot]) -> _Running | Result:
        """The task's generation on the best free slot, joined to the scheduler; or its error."""
        if task.error is not None or task.request is None:
            return Result(task, error=task.error)
        try:
            request = openai_api.structure(task.request)
            tokens = self._tokens(request)
            slot = max(free, key=lambda s: s.fits(tokens))
            settings = self._settings(request)
            generation = slot.generate(tokens, settings)
        except RequestError as exc:
            return _failed(task, exc)
        except InvalidRequest as exc:
            return _failed(task, RequestError(exc.named(openai_api.PARAMS), param=exc.field, code=exc.code))
        except SpecError as exc:
            return _failed(task, RequestError(str(exc)))
        self._scheduler.join(generation)
        return _Running(task, request, slot, generation, StopStrings(settings.stop))

    def _tokens(self, request: ApiRequest) -> list[int]:
        images: list[Image] = list(request.images)  # type: ignore[arg-type]  # lines hold no URLs
        if isinstance(request.prompt, str) and request.endpoint != "chat":  # its images first; an empty one refused
            return self.pair.prompt_tokens(request.prompt, raw=True, images=images)
        return request_tokens(self.pair.target, request, self.pair.see(images))

    def _settings(self, request: ApiRequest) -> GenerationRequest:
        """The batch's settings under what the line sets."""
        base = self.base
        return replace(base, **request.fields, sampling=replace(base.sampling, **request.sampling),
                       stop=request.stop or base.stop, grammar=request.grammar or base.grammar,
                       max_tokens=request.max_tokens or base.max_tokens)

    def _result(self, task_run: _Running) -> Result:
        """What a finished task gives: its text, cut at a stop string, or the error its own work met."""
        generation = task_run.generation
        if generation.error is not None:
            return _failed(task_run.task, RequestError(f"the generation failed: {generation.error}"))
        task_run.text += task_run.stops.flush()
        reason = openai_api.finish_reason(generation.finish_reason, task_run.stops.stopped)
        body = None
        if self.form == OPENAI:
            prefix = "chatcmpl" if task_run.request.endpoint == "chat" else "cmpl"
            answer = Answer(f"{prefix}-{uuid.uuid4().hex}", int(time.time()), self.name, task_run.request.endpoint,
                            task_run.request.unenforced)
            body = answer.whole(task_run.text, reason, generation.stats)
        return Result(task_run.task, task_run.text, reason, tuple(generation.token_ids), generation.stats, body)


def held_tokens(tasks: Iterable[Task], target: Model, max_tokens: int) -> int | None:
    """The most tokens a generation of `tasks` holds: the longest of prompt and max_tokens (`max_tokens` for a line that
    sets none), tokenized by `target` (None: unknown, where no task is known or one holds images, whose tokens are
    known only once the images are encoded). A task that cannot start is left out: it fails at its start as it would
    have."""
    needed = 0
    for task in tasks:
        if task.error is not None or task.request is None:
            continue
        try:
            request = openai_api.structure(task.request)
            if request.images:
                return None
            needed = max(needed, len(request_tokens(target, request)) + (request.max_tokens or max_tokens))
        except (RequestError, InvalidRequest, SpecError):
            continue
    return needed or None


def request_tokens(target: Model, request: ApiRequest, pieces: Sequence[Sequence[int]] = ()) -> list[int]:
    """A line's prompt as `target` reads it: its messages through the chat template (`pieces`: the ids of their
    images, `Pair.see`), its prompt verbatim (a line's plain prompt was wrapped as a message when it was read; a prompt
    with images goes through `Pair.prompt_tokens`, which places them), or its token ids."""
    if request.endpoint == "chat":
        return target.tokenize_prompt(target.format_chat(request.messages), images=pieces)
    if isinstance(request.prompt, str):
        return text_tokens(target, request.prompt, raw=True)
    return list(request.prompt)


def _failed(task: Task, error: RequestError) -> Result:
    """The task's error, its message naming its input line."""
    error.message = f"line {task.line}: {error.message}"
    return Result(task, error=error)
