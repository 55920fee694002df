"""OpenAI's Responses API on `spec serve`, with the official `openai` client's `responses` as Codex CLI and the
Agents SDK call it: input items, instructions, function tools, text.format, streamed events in the API's order;
greedy answers are the target alone's with drafting on."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from support.serving import NAME, Running, openai_error


LOOKUP = {"type": "function", "name": "lookup", "description": "Look an animal up.",
          "parameters": {"type": "object", "properties": {"animal": {"enum": ["cat", "dog"]}, "legs": {"enum": [2, 4]}},
                         "required": ["animal", "legs"], "additionalProperties": False}}
ANIMAL = {"type": "object", "properties": {"animal": {"enum": ["cat", "dog"]}}, "required": ["animal"],
          "additionalProperties": False}


@pytest.fixture()
def client(served: Running) -> openai.OpenAI:
    return served.client()


def test_a_response_is_the_target_alones_greedy_text_as_a_message_item(served: Running,
                                                                       client: openai.OpenAI) -> None:
    response = client.responses.create(model="gpt-5", input="hello there", instructions="be brief",
                                       max_output_tokens=16, temperature=0)
    alone = served.post("/v1/chat/completions", {"messages": [{"role": "system", "content": "be brief"},
                                                              {"role": "user", "content": "hello there"}],
                                                 "max_tokens": 16, "temperature": 0, "draft_mode": "none"}).json()
    assert response.output_text == alone["choices"][0]["message"]["content"]
    assert [item.type for item in response.output] == ["message"] and response.model == "gpt-5"
    assert response.status in ("completed", "incomplete") and response.usage.output_tokens > 0


def test_a_streamed_response_sends_the_apis_events_in_order_and_the_same_text(client: openai.OpenAI) -> None:
    whole = client.responses.create(model=NAME, input="hello there", max_output_tokens=16, temperature=0)
    events = list(client.responses.create(model=NAME, input="hello there", max_output_tokens=16, temperature=0,
                                          stream=True))
    kinds = [event.type for event in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] in ("response.completed", "response.incomplete") and "response.output_text.delta" in kinds
    assert [event.sequence_number for event in events] == list(range(1, len(events) + 1))
    assert "".join(event.delta for event in events if event.type == "response.output_text.delta") \
        == whole.output_text == events[-1].response.output_text


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_function_call_is_an_item_whose_arguments_follow_its_schema(client: openai.OpenAI,
                                                                             stream: bool) -> None:
    options = dict(model=NAME, input="look up the cat", tools=[LOOKUP], max_output_tokens=300, temperature=0,
                   tool_choice={"type": "function", "name": "lookup"})
    if stream:
        events = list(client.responses.create(**options, stream=True))
        response = events[-1].response
        streamed = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    else:
        response = client.responses.create(**options)
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert call.name == "lookup"
    jsonschema.validate(json.loads(call.arguments), LOOKUP["parameters"])
    if stream:
        assert streamed == call.arguments
    follow = client.responses.create(model=NAME, max_output_tokens=8, temperature=0, tools=[LOOKUP], input=[
        {"role": "user", "content": "look up the cat"},
        {"type": "function_call", "call_id": call.call_id, "name": "lookup", "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "a cat has four legs"}])
    assert follow.status in ("completed", "incomplete")


def test_text_format_holds_the_answer_to_its_schema(client: openai.OpenAI) -> None:
    response = client.responses.create(model=NAME, input="an animal", max_output_tokens=200, temperature=0,
                                       text={"format": {"type": "json_schema", "name": "animal", "schema": ANIMAL,
                                                        "strict": True}})
    jsonschema.validate(json.loads(response.output_text), ANIMAL)


@pytest.mark.parametrize("body, param", [
    ({"model": NAME}, "input"),
    ({"model": NAME, "input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"model": NAME, "input": [{"type": "web_search_call"}]}, "input[0]"),
    ({"model": NAME, "input": "hi", "tools": [{"type": "web_search"}]}, "tools"),
])
def test_bad_input_is_a_shaped_400_naming_the_field(served: Running, body: dict, param: str) -> None:
    assert openai_error(served.post("/v1/responses", body), 400)["param"] == param
