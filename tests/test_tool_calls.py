"""Tool calls and thoughts over plain text: the forcing grammar, the history spelt out for templates that know
nothing of tools, and the splitter that reads an answer as it streams."""

from __future__ import annotations

import json

import pytest
from support.grammars import accepts, assembled

from spec_cli import Pair
from spec_cli.api.errors import RequestError
from spec_cli.api.tool_calls import (MAX_CALLS, AnswerSplitter, Tools, call_grammar, checked_parameters, parse_tools,
                                        spelt_out, template_messages)

WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
TIME = {"name": "get_time", "parameters": {"type": "object", "properties": {}}}
TOOLS = Tools((WEATHER, TIME), "auto")


def split(text: str, tools: Tools | None = TOOLS, thinking: bool = False, pieces: int = 1) -> list[dict]:
    """The deltas of `text` fed in pieces of `pieces` characters, then flushed."""
    splitter = AnswerSplitter(tools, thinking)
    deltas = [delta for i in range(0, len(text), pieces) for delta in splitter.feed(text[i:i + pieces])]
    return [*deltas, *splitter.flush()]


def joined(deltas: list[dict], name: str) -> str:
    return "".join(delta[name] for delta in deltas if name in delta)


@pytest.mark.parametrize("pieces", [1, 3, 1000])
def test_calls_thoughts_and_content_are_told_apart_however_the_text_comes(pieces: int) -> None:
    text = ('<think>\nThe user wants weather.\n</think>\n\nLet me look.\n<tool_call>\n{"name": "get_weather", '
            '"arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n'
            '</tool_call>\n')
    deltas = split(text, pieces=pieces)
    assert joined(deltas, "reasoning_content") == "\nThe user wants weather.\n"
    assert joined(deltas, "content") == "Let me look."
    assert assembled(deltas) == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    named = [call for delta in deltas for call in delta.get("tool_calls", []) if "id" in call]
    assert [c["index"] for c in named] == [0, 1]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in named)
    assert len({c["id"] for c in named}) == 2


def test_text_that_only_looks_like_a_tag_is_content() -> None:
    deltas = split('a <tool_call>{"name": "unknown", "arguments": {}}</tool_call> b <tool z', pieces=2)
    assert joined(deltas, "content") == 'a <tool_call>{"name": "unknown", "arguments": {}}</tool_call> b <tool z'
    assert not any("tool_calls" in delta for delta in deltas)


def test_without_tools_or_a_thought_the_content_is_the_text_as_written() -> None:
    assert joined(split("  two spaces, then <tool_call> is text\n", tools=None, pieces=4), "content") == \
        "  two spaces, then <tool_call> is text\n"


def test_a_thought_the_template_opened_runs_to_its_closing_tag() -> None:
    deltas = split("pondering</think>The answer.", tools=None, thinking=True, pieces=5)
    assert (joined(deltas, "reasoning_content"), joined(deltas, "content")) == ("pondering", "The answer.")
    assert joined(split("cut short", tools=None, thinking=True), "reasoning_content") == "cut short"


def test_a_call_left_open_at_the_end_is_read_if_whole() -> None:
    assert assembled(split('<tool_call>\n{"name": "get_time", "arguments": {}}')) == [("get_time", {})]


def test_a_call_cut_by_max_tokens_before_its_name_is_neither_a_call_nor_content() -> None:
    splitter = AnswerSplitter(TOOLS)
    deltas = [*splitter.feed('<tool_call>\n{"name": "'), *splitter.flush(cut=True)]
    assert deltas == [] and splitter.calls == []


def test_a_call_cut_after_its_name_keeps_the_arguments_written_as_openai_streams_them() -> None:
    splitter = AnswerSplitter(TOOLS)
    deltas = [*splitter.feed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'),
              *splitter.flush(cut=True)]
    calls = [call for delta in deltas for call in delta["tool_calls"]]
    assert calls[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert "".join(call["function"]["arguments"] for call in calls) == '{"city": "Pa'
    assert splitter.calls == []


def test_calls_past_a_turns_most_are_not_read() -> None:
    call = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n'
    splitter = AnswerSplitter(Tools((WEATHER, TIME), "auto", parallel=False))
    deltas = [*splitter.feed(call * 3 + "and more"), *splitter.flush()]
    assert splitter.full and len(splitter.calls) == 1 and not joined(deltas, "content")
    assert len(assembled(split(call * (MAX_CALLS + 2)))) == MAX_CALLS


@pytest.mark.parametrize("choice, parallel, names", [
    ("get_weather", True, ["get_weather"]), ("required", False, ["get_weather", "get_time"]),
])
def test_a_forced_call_grammar_admits_only_calls_of_the_chosen_functions(alone: Pair, choice: str, parallel: bool,
                                                                         names: list[str]) -> None:
    grammar = call_grammar(Tools((WEATHER, TIME), choice, parallel))
    for function in (WEATHER, TIME):
        call = json.dumps({"name": function["name"], "arguments": {"city": "Oslo"} if function is WEATHER else {}})
        assert (function["name"] in names) == accepts(alone.target, grammar, f"<tool_call>\n{call}\n</tool_call>")
    wrong = '<tool_call>\n{"name": "get_weather", "arguments": {"town": "Oslo"}}\n</tool_call>'
    assert not accepts(alone.target, grammar, wrong)


@pytest.mark.parametrize("parallel, most", [(True, MAX_CALLS), (False, 1)])
def test_a_forced_turn_holds_at_most_its_most_calls(alone: Pair, parallel: bool, most: int) -> None:
    grammar = call_grammar(Tools((WEATHER, TIME), "required", parallel))
    call = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    assert accepts(alone.target, grammar, "\n".join([call] * most))
    assert not accepts(alone.target, grammar, "\n".join([call] * (most + 1)))


def test_a_forced_call_grammar_is_not_read_as_gbnf_whatever_its_schema_says(alone: Pair) -> None:
    noted = {**TIME, "parameters": {"type": "object", "properties": {
        "at": {"type": "string", "description": "\nwhen ::= a time", "maxLength": 4}}}}
    grammar = call_grammar(Tools((noted,), "required", parallel=False))
    assert accepts(alone.target, grammar, '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')


def test_parameters_that_are_not_an_object_schema_are_refused_naming_the_tool() -> None:
    tool = {"type": "function", "function": {"name": "echo", "parameters": {"type": "string"}}}
    with pytest.raises(RequestError) as caught:
        parse_tools([tool], "required", None)
    assert caught.value.param == "tools[0].function.parameters"
    assert str(caught.value).startswith("tools[0].function.parameters of the tool 'echo' must be an object schema")


def test_a_strict_tool_with_a_keyword_that_cannot_be_enforced_is_refused_by_name() -> None:
    def tag_tool(**strict: bool) -> dict:
        return {"type": "function", "function": {"name": "tag", **strict, "parameters": {
            "type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}}}

    tools = parse_tools([tag_tool()], "required", None)
    with pytest.raises(RequestError, match=r"tools\[0\].function.parameters \(tool 'tag'\) uses uniqueItems at "
                                           r"/properties/tags, which cannot be enforced"):
        checked_parameters(tools.functions[0], "tools[0]")
    checked_parameters(parse_tools([tag_tool(strict=False)], "required", None).functions[0], "tools[0]")


def test_the_history_is_spelt_out_for_a_template_without_tools() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}]
    spelt = spelt_out(messages, TOOLS)
    assert spelt[0]["role"] == "system" and spelt[0]["content"].startswith("Be brief.\n\nYou can call these")
    assert json.dumps(WEATHER) in spelt[0]["content"] and "If no function helps" in spelt[0]["content"]
    assert spelt[2] == {"role": "assistant",
                        "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'}
    assert spelt[3] == {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"}
    assert template_messages(messages)[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
