"""What every route of `spec serve` does with a request and its job: read the body within the server's limits,
start the generation while watching the client (a client that leaves cancels it), collect a whole answer, and
write server-sent events. The routes (`app`, `chat_apis`, `native_routes`) only shape what they answer."""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from starlette.requests import ClientDisconnect, Request

from spec_cli.api.errors import RequestError
from spec_cli.api.openai_api import ApiRequest
from spec_cli.api.tool_calls import AnswerSplitter
from spec_cli.server.connections import MIB, Limits
from spec_cli.server.jobs import Failed, Finished, Job, Left, Started
from spec_cli.server.service import Service

STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ClientGone(Exception):
    """The client closed its connection before its answer was sent."""


@asynccontextmanager
async def watching(request: Request, job: Job) -> AsyncIterator[None]:
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


@asynccontextmanager
async def started(request: Request, api_request: ApiRequest) -> AsyncIterator[tuple[ApiRequest, Job, Started]]:
    """A request's generation under way: its constraint compiled, its job queued and begun (an error of its own is
    raised here), its client watched while the block waits on it, and the job cancelled if the block fails."""
    service: Service = request.app.state.service
    api_request = await service.prepare(api_request)
    job = service.submit(api_request)
    try:
        async with watching(request, job):
            first = await next_item(job)
            if isinstance(first, Failed):
                raise first.error
            assert isinstance(first, Started)
            yield api_request, job, first
    except BaseException:
        job.cancel()
        raise


async def collected(job: Job, splitter: AnswerSplitter | None) -> tuple[list[dict[str, Any]], Finished]:
    """A whole answer's deltas (a completion's text as content deltas) and how it ended; a chat that holds a turn's
    most tool calls ends there."""
    deltas: list[dict[str, Any]] = []
    while not isinstance(item := await next_item(job), Finished):
        if isinstance(item, Failed):
            raise item.error
        deltas += splitter.feed(item) if splitter is not None else [{"content": item}]
        if splitter is not None and splitter.full:
            return deltas, enough(job)
    return deltas, item


async def next_item(job: Job) -> Started | str | Finished | Failed:
    item = await job.items.get()
    if isinstance(item, Left):
        raise ClientGone
    return item


async def json_body(request: Request) -> object:
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


def enough(job: Job) -> Finished:
    """The answer holds a turn's most tool calls: its generation stops, and it ends as a model's own stop would."""
    job.stop()
    return Finished("stop")


def chat_message(deltas: list[dict[str, Any]]) -> dict[str, Any]:
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


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"
