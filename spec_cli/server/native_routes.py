"""llama.cpp's own routes on `spec serve`, as llama-server answers them: `/completion` and `/infill` on the same
loop as OpenAI's routes, `/tokenize`, `/detokenize`, `/apply-template`, `/props`, `/slots` and `/metrics`. The
shapes are `native`'s; these read the request and answer."""

from __future__ import annotations

from dataclasses import replace
from typing import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from spec_cli.api import openai_api
from spec_cli.api.openai_api import ApiRequest
from spec_cli.server import native
from spec_cli.server.exchange import STREAM_HEADERS, collected, json_body, sse, started
from spec_cli.server.jobs import Failed, Finished, Job, Left, Started
from spec_cli.server.service import Service


async def native_completion(request: Request) -> Response:
    """llama-server's `/completion`: the completions route's generation, in llama.cpp's own shape."""
    body = native.completion_body(await json_body(request))
    return await _native_answer(request, openai_api.parse_completion(body), body.get("return_tokens") is True)


async def infill(request: Request) -> Response:
    """llama-server's `/infill`: the code between a prefix and a suffix, through the model's own FIM tokens."""
    service: Service = request.app.state.service
    body = native.completion_body(await json_body(request))
    api_request = openai_api.parse_completion({**body, "prompt": [0]})  # its fields; the prompt is made here
    target = service.pair.target_context
    prompt = native.infill_prompt(service.pair.target, body, target.n_batch, service.pair.n_ctx,
                                  api_request.max_tokens or -1)
    return await _native_answer(request, replace(api_request, prompt=prompt), body.get("return_tokens") is True)


async def _native_answer(request: Request, api_request: ApiRequest, return_tokens: bool) -> Response:
    service: Service = request.app.state.service
    name = api_request.model or service.name
    async with started(request, api_request) as (api_request, job, first):
        if api_request.stream:
            return StreamingResponse(_native_stream(job, first, name), media_type="text/event-stream",
                                     headers=STREAM_HEADERS)
        deltas, item = await collected(job, None)
    generation = first.generation
    return JSONResponse(native.completion_answer(name, "".join(d["content"] for d in deltas),
                                                 generation.token_ids if return_tokens else None, item,
                                                 generation.stats, openai_api.speculation(generation.stats)))


async def _native_stream(job: Job, first: Started, name: str) -> AsyncIterator[str]:
    """llama-server's stream of `/completion`: a piece of text an event (`stop` false), then the whole answer's
    fields with `stop` true; no `[DONE]`."""
    stats = first.generation.stats
    try:
        while True:
            item = await job.items.get()
            if isinstance(item, str):
                yield sse(native.completion_answer(name, item, None, None, stats, {}))
            elif isinstance(item, Failed):
                yield sse(item.error.body())
                return
            elif isinstance(item, Finished):
                yield sse(native.completion_answer(name, "", None, item, stats, openai_api.speculation(stats)))
                return
            elif isinstance(item, Left):
                return
    finally:
        job.cancel()


async def tokenize(request: Request) -> Response:
    return JSONResponse(native.tokenize(request.app.state.service.pair.target, await json_body(request)))


async def detokenize(request: Request) -> Response:
    return JSONResponse(native.detokenize(request.app.state.service.pair.target, await json_body(request)))


async def apply_template(request: Request) -> Response:
    return JSONResponse(native.apply_template(request.app.state.service, await json_body(request)))


async def props(request: Request) -> Response:
    return JSONResponse(native.props(request.app.state.service))


async def slots(request: Request) -> Response:
    return JSONResponse(native.slots(request.app.state.service))


async def metrics(request: Request) -> Response:
    return PlainTextResponse(request.app.state.service.metrics(), media_type="text/plain; version=0.0.4")
