"""Other APIs over the chat route: Anthropic's Messages (`/v1/messages`, `/v1/messages/count_tokens`) and OpenAI's
Responses (`/v1/responses`). Each reads its body into the chat request it asks for (`api.anthropic_api`,
`api.responses_api`), and answers the chat route's generation, read through an `AnswerSplitter`, in its own shape:
whole, or as the events its `EventWriter` writes."""

from __future__ import annotations

import time
import uuid
from typing import Any, AsyncIterator, Callable, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from spec_cli.api import anthropic_api, openai_api, responses_api
from spec_cli.api.errors import RequestError
from spec_cli.api.openai_api import ApiRequest
from spec_cli.api.tool_calls import AnswerSplitter
from spec_cli.decoding.stats import Stats
from spec_cli.server.exchange import STREAM_HEADERS, chat_message, collected, enough, json_body, started
from spec_cli.server.jobs import Failed, Finished, Job, Left, Started
from spec_cli.server.service import Service


class EventWriter(Protocol):
    """Another API's streamed events for one chat generation, from the chat route's deltas (Anthropic's Messages,
    OpenAI's Responses): what the stream opens with, each delta's events, the last ones, an error's."""

    def start(self, stats: Stats) -> list[str]: ...

    def deltas(self, deltas: list[dict[str, Any]]) -> list[str]: ...

    def finish(self, reason: str, by_stop_string: bool, stats: Stats) -> list[str]: ...

    def error(self, exc: RequestError) -> str: ...


async def messages(request: Request) -> Response:
    """Anthropic's Messages API: the chat route's generation, as a message of content blocks or its events."""
    return await _messages_answer(request, anthropic_api.parse_messages(await json_body(request)))


async def count_tokens(request: Request) -> Response:
    """Anthropic's count_tokens: the tokens the Messages body's prompt takes under the server's template."""
    service: Service = request.app.state.service
    api_request = anthropic_api.parse_messages(await json_body(request), counting=True)
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
    api_request = responses_api.parse_responses(await json_body(request))
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
    async with started(request, api_request) as (api_request, job, first):
        splitter = AnswerSplitter(api_request.tools, first.thinking, service.dialect.convention)
        if api_request.stream:
            return StreamingResponse(_events(job, first, splitter, writer), media_type="text/event-stream",
                                     headers=STREAM_HEADERS)
        deltas, item = await collected(job, splitter)
    message = chat_message([*deltas, *splitter.flush(cut=item.reason == "length")])
    return JSONResponse(whole(message, openai_api.called(item.reason, splitter.calls), item.by_stop_string,
                              first.generation.stats))


async def _events(job: Job, first: Started, splitter: AnswerSplitter, writer: EventWriter) -> AsyncIterator[str]:
    """Another API's streamed events for one chat generation (`writer`'s), as the text comes."""
    stats = first.generation.stats
    try:
        for line in writer.start(stats):
            yield line
        while True:
            item = await job.items.get()
            if isinstance(item, str):
                for line in writer.deltas(splitter.feed(item)):
                    yield line
                if splitter.full:
                    item = enough(job)
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
