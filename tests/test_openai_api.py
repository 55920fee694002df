"""Checking OpenAI-shaped requests and shaping answers: every field rule, without a server or a model."""

from __future__ import annotations

import pytest

from spec_cli.decoding.stats import Stats
from spec_cli.api.errors import RequestError
from spec_cli.api.openai_api import Answer, finish_reason, parse_chat, parse_completion, structure
from spec_cli.formats.structured import grammar_structure, schema_grammar

HELLO = [{"role": "user", "content": "hi"}]


def refused(body: object, parse=parse_chat) -> RequestError:
    with pytest.raises(RequestError) as caught:
        parse(body)
    assert caught.value.status == 400
    return caught.value


def test_a_full_chat_request_maps_every_field() -> None:
    request = parse_chat({
        "model": "m", "messages": [{"role": "developer", "content": "be brief"},
                                   {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                {"type": "text", "text": "b"}]}],
        "stream": True, "stream_options": {"include_usage": True}, "max_completion_tokens": 7, "max_tokens": 99,
        "temperature": 0.5, "top_p": 0.9, "top_k": 20, "min_p": 0.1, "presence_penalty": 0.5,
        "frequency_penalty": 0.25, "repeat_penalty": 1.1, "repeat_last_n": 32, "seed": 3, "stop": "\n",
        "n": 1, "draft_max": "auto", "draft_mode": "ngram", "verify": "token", "user": "ignored",
    })
    assert request.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "ab"}]
    assert (request.model, request.stream, request.include_usage, request.max_tokens) == ("m", True, True, 7)
    assert request.sampling == {"temperature": 0.5, "top_p": 0.9, "top_k": 20, "min_p": 0.1,
                                "presence_penalty": 0.5, "frequency_penalty": 0.25, "repeat_penalty": 1.1,
                                "repeat_last_n": 32}
    assert (request.seed, request.stop, request.draft_max, request.draft_mode, request.verify) == \
        (3, ("\n",), "auto", "ngram", "token")


def test_a_minimal_request_leaves_everything_to_the_server() -> None:
    request = parse_chat({"messages": HELLO})
    assert (request.model, request.stream, request.max_tokens, request.sampling, request.seed, request.stop,
            request.draft_max, request.draft_mode, request.verify) == (None, False, None, {}, None, (), None,
                                                                        None, None)


@pytest.mark.parametrize("prompt, expected", [("text", "text"), (["text"], "text"), ([5, 6, 7], [5, 6, 7])])
def test_completion_prompts_are_text_one_text_or_token_ids(prompt: object, expected: object) -> None:
    assert parse_completion({"prompt": prompt}).prompt == expected


@pytest.mark.parametrize("body, param", [
    ({}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": ["hi"]}, "messages[0]"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages[0].content[0].image_url"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}]},
     "messages[0].content[0].image_url"),
    ({"messages": HELLO, "temperature": "hot"}, "temperature"),
    ({"messages": HELLO, "temperature": True}, "temperature"),
    ({"messages": HELLO, "top_k": 2.5}, "top_k"),
    ({"messages": HELLO, "max_tokens": 0}, "max_tokens"),
    ({"messages": HELLO, "max_tokens": "10"}, "max_tokens"),
    ({"messages": HELLO, "stream": "yes"}, "stream"),
    ({"messages": HELLO, "stop": ["a", 1]}, "stop"),
    ({"messages": HELLO, "seed": 1.5}, "seed"),
    ({"messages": HELLO, "model": 7}, "model"),
    ({"messages": HELLO, "n": 2}, "n"),
    ({"messages": HELLO, "logprobs": True}, "logprobs"),
    ({"messages": HELLO, "tools": [{"type": "function"}]}, "tools[0]"),
    ({"messages": HELLO, "response_format": {"type": "json_object", "schema": 1}, "grammar": "root ::= x"},
     "grammar"),
    ({"messages": HELLO, "response_format": "json"}, "response_format"),
    ({"messages": HELLO, "json_schema": []}, "json_schema"),
    ({"messages": HELLO, "draft_max": 65}, "draft_max"),
    ({"messages": HELLO, "draft_max": "many"}, "draft_max"),
    ({"messages": HELLO, "draft_mode": "psychic"}, "draft_mode"),
    ({"messages": HELLO, "verify": "trust"}, "verify"),
    ({"messages": HELLO, "stream_options": "usage"}, "stream_options"),
])
def test_bad_chat_fields_are_refused_naming_the_field(body: dict, param: str) -> None:
    error = refused(body)
    assert error.param == param
    assert error.body() == {"error": {"message": error.message, "type": "invalid_request_error", "param": param,
                                      "code": error.code}}


@pytest.mark.parametrize("prompt", [None, "", [], [1, -2], ["a", "b"], [True], {"text": "a"}])
def test_bad_prompts_are_refused(prompt: object) -> None:
    assert refused({} if prompt is None else {"prompt": prompt}, parse_completion).param == "prompt"


def test_a_body_that_is_not_an_object_is_refused() -> None:
    assert "JSON object" in refused([1, 2]).message


def test_finish_reasons_are_openais() -> None:
    assert [finish_reason(r, False) for r in ("stop", "length", "context")] == ["stop", "length", "length"]
    assert finish_reason("interrupted", True) == "stop"


def test_answers_carry_usage_and_speculation() -> None:
    stats = Stats(draft_max=4, draft_mode="model", prompt_tokens=10, prompt_cached=6, generated_tokens=5)
    stats.record_round(4, 3)
    whole = Answer("chatcmpl-1", 0, "m", "chat").whole("hello", "stop", stats)
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": "hello"}
    assert whole["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
                              "prompt_tokens_details": {"cached_tokens": 6}}
    assert whole["speculation"] | {"tokens_per_second": 0} == {
        "draft_mode": "model", "draft_max": 4, "drafted": 4, "accepted": 3, "acceptance": 0.75,
        "tokens_per_pass": 4.0, "tokens_per_second": 0, "batch_size": 1.0}
    text = Answer("cmpl-1", 0, "m", "completion").chunk("x", None, stats)
    assert text["object"] == "text_completion" and text["choices"][0]["text"] == "x"
    opening = Answer("chatcmpl-1", 0, "m", "chat").chunk(None, None)
    assert opening["choices"][0]["delta"] == {"role": "assistant", "content": ""} and "speculation" not in opening


@pytest.mark.parametrize("body, param, message", [
    ({"messages": [{"role": "user", "content": "\ud800"}]}, "messages[0].content",
     "messages[0].content is not valid Unicode: it holds a lone surrogate, \\ud800"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a\udfffb"}]}]}, "messages[0].content",
     "messages[0].content is not valid Unicode: it holds a lone surrogate, \\udfff"),
    ({"messages": HELLO, "stop": ["\ud83d"]}, "stop", "stop is not valid Unicode: it holds a lone surrogate, \\ud83d"),
    ({"messages": HELLO, "temperature": 10**400}, "temperature",
     "'temperature' must be a finite number, got an integer too large"),
    ({"messages": HELLO, "min_p": float("nan")}, "min_p", "'min_p' must be a finite number, got nan"),
    ({"messages": HELLO, "max_tokens": 2**63}, "max_tokens",
     "'max_tokens' is out of range: at most 9223372036854775807 in size"),
    ({"messages": HELLO, "seed": -7}, "seed", "'seed' must be a whole number >= 0, or -1 for a random seed, got -7"),
    ({"messages": HELLO, "temperature": "x" * 1000}, "temperature", f"'temperature' must be a number, got '{'x' * 38}…"),
])
def test_numbers_and_texts_no_model_could_take_are_refused_without_echoing_them(body: dict, param: str,
                                                                                 message: str) -> None:
    error = refused(body)
    assert (error.param, error.message) == (param, message)


def test_a_seed_of_minus_one_is_passed_on_for_a_random_seed() -> None:
    assert parse_chat({"messages": HELLO, "seed": -1}).fields["seed"] == -1
    assert parse_completion({"prompt": "\U0001f600 a real pair is fine"}).prompt.startswith("\U0001f600")


def test_each_way_of_asking_for_structure_becomes_the_grammar() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    by_openai = structure(parse_chat({"messages": HELLO, "response_format": {
        "type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": True}}}))
    assert by_openai.grammar == schema_grammar(schema).grammar
    lenient = schema_grammar(schema, strict=False).grammar  # llama-server's forms, and OpenAI's default
    assert structure(parse_chat({"messages": HELLO, "json_schema": schema})).grammar == lenient
    assert structure(parse_chat({"messages": HELLO, "response_format": {"type": "json_object"}})).grammar == \
        schema_grammar({"type": "object"}, strict=False).grammar
    # llama-server's json_object with a schema beside it: the schema, not any object
    assert structure(parse_chat({"messages": HELLO, "response_format": {"type": "json_object", "schema": schema}}
                                )).grammar == lenient
    assert structure(parse_chat({"messages": HELLO, "grammar": 'root ::= "a"'})).grammar == \
        grammar_structure('root ::= "a"')
    assert structure(parse_completion({"prompt": "x", "response_format": {"type": "text"}})).grammar is None


@pytest.mark.parametrize("body, message", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "u", "strict": True, "schema": {
        "type": "array", "uniqueItems": True}}}},
     "'response_format.json_schema.schema' uses uniqueItems at /, which cannot be enforced"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {
        "type": "array", "minItems": 3, "maxItems": 1}}}},
     "'response_format.json_schema.schema' cannot be used: Unsatisfiable schema: minItems (3) is greater than "
     "maxItems (1)"),
    ({"grammar": "root ::= [z-a]"}, "'grammar' does not parse: at 3(8): invalid regex \"[z-a]\""),
    ({"json_schema": {"type": "object", "required": "name"}},
     "'json_schema' cannot be used: Expected array for 'required', got \"name\""),
])
def test_a_constraint_that_cannot_be_kept_is_a_400_naming_it(body: dict, message: str) -> None:
    with pytest.raises(RequestError) as caught:
        structure(parse_chat({"messages": HELLO, **body}))
    assert caught.value.status == 400 and str(caught.value).startswith(message)


def test_a_schema_that_is_not_strict_says_what_it_leaves_unenforced() -> None:
    asked = parse_chat({"messages": HELLO, "response_format": {"type": "json_schema", "json_schema": {
        "name": "u", "schema": {"type": "array", "uniqueItems": True}}}})
    assert structure(asked).unenforced == ("uniqueItems at /",)


def test_tools_are_checked_into_what_may_be_called() -> None:
    lookup = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    tools = parse_chat({"messages": HELLO, "tools": [lookup], "tool_choice": "required",
                        "parallel_tool_calls": False}).tools
    assert (tools.names(), tools.choice, tools.parallel, tools.forced) == (["lookup"], "required", False, True)
    assert parse_chat({"messages": HELLO, "tools": [lookup]}).tools.choice == "auto"
    assert parse_chat({"messages": HELLO, "tools": [lookup], "tool_choice": "none"}).tools is None
    assert refused({"prompt": "x", "tools": [lookup]}, parse_completion).param == "tools"
