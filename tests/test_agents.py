"""`spec serve` as agents and editors use it, on the demo pair with a template in each tool-call convention,
through the official `openai` client: named, required and lazy calls that parse and validate (the lazy one
after an earlier exchange the template writes in its convention), streamed calls equal to
whole ones, a second turn that answers the tool's result; and a thought before a constrained answer."""

from __future__ import annotations

import json
from typing import Iterator

import jsonschema
import pytest
from support.chat_templates import template

from spec_cli import GenerationRequest, Pair, load_pair
from spec_cli.formats.conventions import CONVENTIONS
from spec_cli.models import registry

from support.serving import NAME, Running

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
CLOCK = {"type": "function", "function": {"name": "clock", "parameters": {"type": "object", "properties": {}}}}
ASK = [{"role": "user", "content": "What is the weather in Paris, in celsius? Call get_weather."}]


@pytest.fixture(scope="module")
def demo() -> Iterator[Pair]:
    models = registry.load_registry()
    target, draft = registry.resolve(models.get(models.default))
    with load_pair(target, draft) as loaded:
        yield loaded


def validated(message: object) -> list[tuple[str, dict]]:
    calls = [(call.function.name, json.loads(call.function.arguments)) for call in message.tool_calls or []]
    for name, arguments in calls:
        jsonschema.validate(arguments, {"get_weather": WEATHER, "clock": CLOCK}[name]["function"]["parameters"])
    return calls


# One earlier exchange in the history, written by the template in its convention: what makes a call likely.
EARLIER = [{"role": "user", "content": "What is the weather in Oslo, in celsius?"},
           {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
               "name": "get_weather", "arguments": '{"city": "Oslo", "unit": "celsius"}'}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": "3 degrees"},
           {"role": "assistant", "content": "It is 3 degrees in Oslo."}]


@pytest.mark.demo
@pytest.mark.parametrize("convention", [c.name for c in CONVENTIONS])
def test_an_agent_turn_in_each_convention(demo: Pair, convention: str) -> None:
    serving = Running(demo, defaults=GenerationRequest(draft_max=4, draft_mode="model"), template=template(convention))
    try:
        assert serving.service.dialect.convention.name == convention
        client = serving.client()
        options = dict(model=NAME, messages=ASK, tools=[WEATHER, CLOCK], temperature=0, max_tokens=60)
        named = client.chat.completions.create(**options, tool_choice={"type": "function",
                                                                       "function": {"name": "get_weather"}})
        assert named.choices[0].finish_reason == "tool_calls"
        assert [name for name, _ in validated(named.choices[0].message)] == ["get_weather"]
        required = client.chat.completions.create(**options, tool_choice="required", parallel_tool_calls=False)
        chunks = list(client.chat.completions.create(**options, tool_choice="required", parallel_tool_calls=False,
                                                     stream=True))
        streamed = [call for chunk in chunks if chunk.choices for call in chunk.choices[0].delta.tool_calls or []]
        (whole,) = required.choices[0].message.tool_calls
        assert streamed[0].id and streamed[0].function.name == whole.function.name
        assert "".join(d.function.arguments for d in streamed) == whole.function.arguments
        validated(required.choices[0].message)
        auto = client.chat.completions.create(**{**options, "messages": [*EARLIER, *ASK]})  # tool_choice auto
        assert auto.choices[0].finish_reason == "tool_calls"
        assert validated(auto.choices[0].message) == [("get_weather", {"city": "Paris", "unit": "celsius"})]
        call = auto.choices[0].message.tool_calls[0]
        history = [*EARLIER, *ASK, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                   {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"}]
        second = client.chat.completions.create(model=NAME, messages=history, tools=[WEATHER, CLOCK],
                                                temperature=0, max_tokens=16)
        answer = second.choices[0]  # an answer, or another call (whole unless cut by max_tokens)
        assert answer.message.content or answer.message.tool_calls
        if answer.finish_reason == "tool_calls":
            validated(answer.message)
        assert named.model_extra["speculation"]["accepted"] > 0
    finally:
        serving.stop()
