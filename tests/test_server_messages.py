"""Anthropic's Messages API on `spec serve`, with the official `anthropic` client as Claude Code and other
Anthropic-API agents reach it: text, tool_use and tool_result blocks, streamed events, count_tokens, and errors in
Anthropic's shape; greedy answers are the target alone's with drafting on."""

from __future__ import annotations


import anthropic
import jsonschema
import pytest
from support.serving import NAME, Running


LOOKUP = {"name": "lookup", "description": "Look an animal up.",
          "input_schema": {"type": "object", "properties": {"animal": {"enum": ["cat", "dog"]},
                                                            "legs": {"enum": [2, 4]}},
                           "required": ["animal", "legs"], "additionalProperties": False}}
HELLO = [{"role": "user", "content": "hello there"}]


@pytest.fixture()
def client(served: Running) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0, timeout=30)


def alone_text(served: Running, messages: list[dict]) -> str:
    """What the target alone answers through the chat route (no drafting), greedy."""
    answer = served.post("/v1/chat/completions", {"messages": messages, "max_tokens": 16, "temperature": 0,
                                                  "draft_mode": "none"}).json()
    return answer["choices"][0]["message"]["content"]


def test_a_message_is_the_target_alones_greedy_text_in_content_blocks(served: Running,
                                                                      client: anthropic.Anthropic) -> None:
    message = client.messages.create(model="claude-sonnet-4", max_tokens=16, extra_body={"temperature": 0}, messages=HELLO,
                                     system="be brief")
    expected = alone_text(served, [{"role": "system", "content": "be brief"}, *HELLO])
    assert [block.type for block in message.content] == ["text"] and message.content[0].text == expected
    assert message.model == "claude-sonnet-4" and message.role == "assistant"
    assert message.stop_reason in ("end_turn", "max_tokens") and message.usage.output_tokens > 0
    counted = client.messages.count_tokens(model=NAME, messages=HELLO, system="be brief")
    assert counted.input_tokens == message.usage.input_tokens


def test_a_streamed_message_sends_the_apis_events_and_the_same_text(client: anthropic.Anthropic) -> None:
    whole = client.messages.create(model=NAME, max_tokens=16, extra_body={"temperature": 0}, messages=HELLO)
    with client.messages.stream(model=NAME, max_tokens=16, extra_body={"temperature": 0}, messages=HELLO) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "content_block_delta" in kinds
    assert final.content[0].text == whole.content[0].text and final.stop_reason == whole.stop_reason


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_tool_is_a_tool_use_block_whose_input_follows_its_schema(client: anthropic.Anthropic,
                                                                          stream: bool) -> None:
    options = dict(model=NAME, max_tokens=300, extra_body={"temperature": 0}, tools=[LOOKUP],
                   tool_choice={"type": "tool", "name": "lookup"},
                   messages=[{"role": "user", "content": "look up the cat"}])
    if stream:
        with client.messages.stream(**options) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(**options)
    (use,) = [block for block in message.content if block.type == "tool_use"]
    assert use.name == "lookup" and message.stop_reason == "tool_use"
    jsonschema.validate(use.input, LOOKUP["input_schema"])


def test_a_tool_result_goes_back_to_the_model_as_the_chat_routes_tool_message(served: Running,
                                                                             client: anthropic.Anthropic) -> None:
    turns = [{"role": "user", "content": "look up the cat"},
             {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "lookup",
                                                "input": {"animal": "cat", "legs": 4}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a cat"}]}]
    message = client.messages.create(model=NAME, max_tokens=16, extra_body={"temperature": 0}, tools=[LOOKUP], messages=turns)
    chat = served.post("/v1/chat/completions", {
        "max_tokens": 16, "temperature": 0, "draft_mode": "none",
        "tools": [{"type": "function", "function": {"name": "lookup", "description": LOOKUP["description"],
                                                    "parameters": LOOKUP["input_schema"]}}],
        "messages": [turns[0], {"role": "assistant", "content": "", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "lookup",
                                                               "arguments": '{"animal": "cat", "legs": 4}'}}]},
                     {"role": "tool", "tool_call_id": "toolu_1", "content": "a cat"}]}).json()
    assert message.usage.input_tokens == chat["usage"]["prompt_tokens"]


@pytest.mark.parametrize("body, fragment", [
    ({"model": NAME, "messages": HELLO}, "'max_tokens' is required"),
    ({"model": NAME, "max_tokens": 5, "messages": []}, "non-empty list"),
    ({"model": NAME, "max_tokens": 5, "messages": [{"role": "robot", "content": "hi"}]}, "role 'user' or"),
    ({"model": NAME, "max_tokens": 5, "messages": HELLO, "tool_choice": {"type": "sometimes"}, "tools": [LOOKUP]},
     "'tool_choice' must be"),
])
def test_bad_input_is_an_anthropic_shaped_400(served: Running, body: dict, fragment: str) -> None:
    response = served.post("/v1/messages", body)
    assert response.status_code == 400
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert fragment in error["error"]["message"]


def test_a_call_cut_short_by_max_tokens_is_a_tool_use_without_input_not_an_error(client: anthropic.Anthropic) -> None:
    message = client.messages.create(model=NAME, max_tokens=3, extra_body={"temperature": 0}, tools=[LOOKUP],
                                     tool_choice={"type": "tool", "name": "lookup"},
                                     messages=[{"role": "user", "content": "look up the cat"}])
    assert message.stop_reason == "max_tokens"
    assert all(block.input == {} for block in message.content if block.type == "tool_use")

