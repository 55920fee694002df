"""The careful client's cases against `spec serve --parallel 2`, each the exact request: every one is answered
valid or refused by name, never "200 stop and invalid", and no request can fail or stall another."""

from __future__ import annotations

import json
import threading
from typing import Iterator

import jsonschema
import pytest

from spec_cli import Pair
from spec_cli.server import service

from support.serving import HELLO, Running, running

TIGHT = 120  # max_tokens for an answer the schema lets end early


@pytest.fixture(scope="module")
def live(chat_pair: Pair) -> Iterator[Running]:
    with running(chat_pair, parallel=2) as serving:
        yield serving


def ask(live: Running, schema: dict, strict: bool = True, max_tokens: int = TIGHT) -> dict:
    return live.post("/v1/chat/completions", {
        "messages": HELLO, "temperature": 0, "max_tokens": max_tokens,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": strict}}
    }).json()


def assert_valid_or_cut(answer: dict, schema: dict) -> None:
    """An answer that stopped by itself is strict JSON its schema accepts (no raw control characters either)."""
    choice = answer["choices"][0]
    if choice["finish_reason"] == "stop":
        jsonschema.validate(json.loads(choice["message"]["content"], strict=True), schema)
    else:
        assert choice["finish_reason"] == "length"


ENFORCED = {
    "minimum 60 / maximum 90": {"type": "object", "properties": {"age": {"type": "integer", "minimum": 60,
                                                                         "maximum": 90}}, "required": ["age"]},
    "required without properties": {"type": "object", "required": ["name"]},
    "multipleOf 7": {"type": "integer", "multipleOf": 7},
    "exclusiveMinimum 1000": {"type": "number", "exclusiveMinimum": 1000},
    "enum C:\\temp": {"enum": ["C:\\temp"]},
    "const a\\nb": {"const": "a\nb"},
    "a property name with a quote": {"type": "object", "properties": {"a\"b": {"enum": [1]}}, "required": ["a\"b"],
                                     "additionalProperties": False},
    "emoji in enums and consts": {"type": "object", "properties": {"e": {"enum": ["😀 ok"]}, "c": {"const": "🚀"}},
                                  "required": ["e", "c"], "additionalProperties": False},
    "plain strings": {"type": "object", "properties": {"s": {"type": "string", "maxLength": 12}}, "required": ["s"],
                      "additionalProperties": False},
    "Pydantic's recursive model ($ref at the root)": {
        "$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {
            "v": {"type": "integer", "maximum": 9, "minimum": 0},
            "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}, "required": ["v", "next"]}}},
    "items true (was 'bool' object has no attribute 'get')": {"type": "array", "items": True, "maxItems": 1},
}


@pytest.mark.parametrize("name", ENFORCED)
def test_a_keyword_the_converter_ignored_is_enforced(live: Running, name: str) -> None:
    answer = ask(live, ENFORCED[name])
    assert "error" not in answer, answer
    assert_valid_or_cut(answer, ENFORCED[name])
    if name.startswith(("enum", "const", "emoji")):  # forced texts: they always end, exactly
        assert answer["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("schema, words", [
    ({"type": "object", "properties": {"v": {"not": {"enum": ["x"]}}}}, "uses not at /properties/v"),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uses uniqueItems at /"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "uses oneOf at /"),
    ({"type": "array", "minItems": 3, "maxItems": 1}, "minItems (3) is greater than maxItems (1)"),
    ({"type": "string", "pattern": "^[^\\s\\S]+$"}, "Regex is empty"),
    ({"type": "object", "properties": []}, "properties must be an object"),
])
def test_a_strict_schema_that_cannot_be_kept_is_a_400_naming_why(live: Running, schema: dict, words: str) -> None:
    answer = ask(live, schema)
    message = answer["error"]["message"]
    assert answer["error"]["param"] == "response_format" and words in message
    assert "attribute" not in message and "Traceback" not in message


def test_not_strict_the_answer_lists_what_was_not_enforced(live: Running) -> None:
    schema = {"type": "array", "items": {"enum": [5]}, "uniqueItems": True, "maxItems": 2}
    answer = ask(live, schema, strict=False)
    assert answer["speculation"]["unenforced"] == ["uniqueItems at /"]
    assert answer["choices"][0]["finish_reason"] in ("stop", "length")


def test_json_object_with_a_schema_beside_it_follows_the_schema(live: Running) -> None:
    schema = {"type": "object", "properties": {"pick": {"enum": ["left"]}}, "required": ["pick"],
              "additionalProperties": False}
    answer = live.post("/v1/chat/completions", {"messages": HELLO, "temperature": 0, "max_tokens": TIGHT,
                                                "response_format": {"type": "json_object", "schema": schema}}).json()
    assert json.loads(answer["choices"][0]["message"]["content"]) == {"pick": "left"}


def test_json_object_strings_hold_no_raw_control_characters(live: Running) -> None:
    answer = live.post("/v1/chat/completions", {"messages": HELLO, "temperature": 1.0, "seed": 3, "max_tokens": 80,
                                                "response_format": {"type": "json_object"}}).json()
    assert_valid_or_cut(answer, {"type": "object"})


def test_a_bad_grammar_is_a_400_and_a_stream_beside_it_reaches_done(live: Running) -> None:
    """`root ::= [z-a]` once failed every stream of its step with a 500."""
    streamed: list[str] = []

    def stream() -> None:
        with live.client().chat.completions.create(model="tiny", messages=HELLO, max_tokens=40, temperature=0,
                                                   stream=True) as events:
            streamed.extend(chunk.choices[0].finish_reason or "" for chunk in events if chunk.choices)

    other = threading.Thread(target=stream)
    other.start()
    for grammar in ("root ::= [z-a]", "root ::= [z-a]+"):
        bad = live.post("/v1/chat/completions", {"messages": HELLO, "max_tokens": 4, "grammar": grammar})
        assert bad.status_code == 400 and "does not parse" in bad.json()["error"]["message"]
    other.join(60)
    assert streamed[-1] in ("stop", "length")


def test_large_enums_and_many_optional_properties_are_compiled_and_answered(live: Running) -> None:
    """A 20 000- and a 60 000-value enum (~30 s and a 52 s stall with the old converter), and 900 optional
    properties (past llguidance's default items in a parser row)."""
    for n in (20_000, 60_000):
        values = [f"v{i}" for i in range(n)]
        assert json.loads(ask(live, {"enum": values})["choices"][0]["message"]["content"]) in values
    wide = {"type": "object", "properties": {f"field_{i}": {"type": "string"} for i in range(900)}}
    assert_valid_or_cut(ask(live, wide, max_tokens=24), wide)


TOOL = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}


def test_a_forced_turn_writes_at_most_8_calls(live: Running) -> None:
    answer = live.post("/v1/chat/completions", {"messages": HELLO, "temperature": 0, "max_tokens": 400,
                                                "tools": [TOOL], "tool_choice": "required"}).json()
    assert 1 <= len(answer["choices"][0]["message"]["tool_calls"]) <= 8


def test_a_forced_call_cut_by_max_tokens_is_length_and_no_half_call(live: Running) -> None:
    answer = live.post("/v1/chat/completions", {"messages": HELLO, "temperature": 0, "max_tokens": 6,
                                                "tools": [TOOL], "tool_choice": "required"}).json()
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "length" and not choice["message"]["content"]
    assert not choice["message"].get("tool_calls")


def test_a_tool_whose_parameters_are_not_an_object_is_a_400_naming_it(live: Running) -> None:
    tool = {"type": "function", "function": {"name": "echo", "parameters": {"type": "string"}}}
    answer = live.post("/v1/chat/completions", {"messages": HELLO, "tools": [tool], "tool_choice": "required"})
    assert answer.status_code == 400
    assert "the tool 'echo' must be an object schema" in answer.json()["error"]["message"]


def test_a_constraint_that_takes_too_long_to_compile_is_a_400_too_complex(live: Running,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "COMPILE_LIMIT_S", 1e-6)
    answer = ask(live, {"enum": [f"w{i}" for i in range(5000)]})
    assert answer["error"]["code"] == "constraint_too_complex"
    assert answer["error"]["message"].startswith("the constraint is too complex: compiling it took more than")
