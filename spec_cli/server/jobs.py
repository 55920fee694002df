"""What a request's asyncio task and the generation worker hand each other: the job, and the items the worker
posts to it (the generation started, text, its end or its error) or the face posts when the client leaves."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

from spec_cli.decoding.engine import Generation
from spec_cli.api.errors import RequestError
from spec_cli.api.openai_api import ApiRequest


@dataclass(frozen=True)
class Started:
    """The generation has begun; `thinking`: the prompt opened a thought, so the answer starts inside one."""

    generation: Generation
    thinking: bool = False


@dataclass(frozen=True)
class Finished:
    """The generation ended: OpenAI's finish `reason`, and whether one of the request's stop strings ended it."""

    reason: str
    by_stop_string: bool = False


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
        self.enough = False  # the face stopped it with all it wanted (a turn's most tool calls)
        self._loop = loop

    def post(self, item: Started | str | Finished | Failed) -> None:
        try:
            self._loop.call_soon_threadsafe(self.items.put_nowait, item)
        except RuntimeError:  # the server's event loop has ended (a shutdown): nobody is left to read it
            self.cancel()

    def cancel(self) -> None:
        self.cancelled.set()

    def stop(self) -> None:
        """The face has all it wants of the answer: the generation stops at its next step."""
        self.enough = True
        self.cancel()

    def leave(self) -> None:
        """The client has gone (called on the event loop): stop the generation and the request's task."""
        self.cancel()
        self.items.put_nowait(Left())
