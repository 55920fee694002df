"""Tool-call conventions: each read off a template written in its style, its calls written, read back however
the text streams, and held by its grammar (forced and lazy) to the listed functions and their schemas."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from support.chat_templates import UNKNOWN, template
from support.grammars import accepts, assembled
from support.tiny_models import CONTROL, default_tokenizer, write_model

from spec_cli import GenerationRequest, Pair, load_pair
from spec_cli.formats.conventions import CONVENTIONS, HERMES, Convention, detect, probe_messages, probe_tools
from spec_cli.reports.models import template_facts
from spec_cli.api.tool_calls import AnswerSplitter, Tools, call_grammar
from spec_cli.formats.structured import Thought, after_thought, schema_grammar

from support.serving import NAME, Running

WEATHER = {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer"}},
    "required": ["city"]}}
TIME = {"name": "get_time", "parameters": {"type": "object", "properties": {}}}
CALLS = [("get_weather", {"city": "Paris", "unit": "celsius", "days": 3}), ("get_time", {})]
NAMES = [c.name for c in CONVENTIONS]


def convention(name: str) -> Convention:
    return next(c for c in CONVENTIONS if c.name == name)


@pytest.mark.parametrize("name", NAMES)
def test_each_convention_is_read_off_a_template_written_in_its_style(alone: Pair, name: str) -> None:
    assert detect(*renderings(alone, template(name))) == convention(name)


def test_a_template_that_writes_calls_another_way_is_not_recognised(alone: Pair) -> None:
    assert detect(*renderings(alone, UNKNOWN)) is None


def renderings(pair: Pair, text: str) -> tuple[str, str]:
    """The template's renderings of the probe conversation with its call and without."""
    return tuple(pair.target.format_chat(probe_messages(call), template=text, tools=probe_tools(),
                                         add_generation_prompt=False).text for call in (True, False))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("pieces", [1, 4, 1000])
def test_calls_written_in_a_convention_are_read_back_however_the_text_comes(name: str, pieces: int) -> None:
    conv = convention(name)
    text = ("Let me look. " if conv.trigger else "") + conv.written(CALLS)
    splitter = AnswerSplitter(Tools((WEATHER, TIME), "auto"), convention=conv)
    deltas = [d for i in range(0, len(text), pieces) for d in splitter.feed(text[i:i + pieces])]
    deltas += splitter.flush()
    assert assembled(deltas) == CALLS
    assert "".join(d.get("content", "") for d in deltas) == ("Let me look." if conv.trigger else "")
    first = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert first[0]["function"] == {"name": "get_weather", "arguments": ""}  # the name comes before arguments
    assert len(first) > 2 + (pieces == 1)  # arguments follow as they settle


@pytest.mark.parametrize("name", NAMES)
def test_a_forced_call_grammar_holds_calls_to_the_functions_and_their_schemas(alone: Pair, name: str) -> None:
    conv = convention(name)
    required = call_grammar(Tools((WEATHER, TIME), "required"), conv)
    assert accepts(alone.target, required, conv.written(CALLS))
    assert accepts(alone.target, required, conv.written(CALLS[1:]))
    assert not accepts(alone.target, required, conv.written([("get_wind", {})]))
    assert not accepts(alone.target, required, conv.written([("get_weather", {"unit": "celsius"})]))  # no city
    assert not accepts(alone.target, required, conv.written([("get_weather", {"city": "Oslo", "unit": "kelvin"})]))
    named = call_grammar(Tools((WEATHER, TIME), "get_time"), conv)
    assert accepts(alone.target, named, conv.written(CALLS[1:]))
    assert not accepts(alone.target, named, conv.written(CALLS[:1]))


@pytest.mark.parametrize("name", NAMES)
def test_a_lazy_grammar_frees_text_and_holds_calls_from_the_trigger(alone: Pair, name: str) -> None:
    conv = convention(name)
    auto = call_grammar(Tools((WEATHER, TIME), "auto"), conv)
    lead = "Sure, one moment. " if conv.trigger else ""
    assert accepts(alone.target, auto, "No call is needed: it is sunny.")
    assert accepts(alone.target, auto, lead + conv.written(CALLS))
    assert not accepts(alone.target, auto, lead + conv.written([("get_wind", {})]))
    if conv.trigger:
        assert not accepts(alone.target, auto, f"Sure. {conv.trigger}and then text")


def test_a_constrained_answer_may_follow_a_thought_and_a_trigger_inside_it_wakes_nothing(alone: Pair) -> None:
    answer = schema_grammar({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}).grammar
    opened, optional = after_thought(answer, Thought(True)), after_thought(answer, Thought(False))
    assert accepts(alone.target, opened, 'a <tool_call> is no call here</think>\n\n{"a": 1}')
    assert not accepts(alone.target, opened, '{"a": 1}')  # the prompt opened the thought: it closes first
    assert accepts(alone.target, optional, '{"a": 1}') and accepts(alone.target, optional, '<think>hm</think>{"a": 1}')
    lazy = after_thought(call_grammar(Tools((WEATHER, TIME), "auto"), HERMES), Thought(True), gap=False)
    assert accepts(alone.target, lazy, "<tool_call>\nthen free</think>\nNo call.")


@pytest.mark.parametrize("thinking", [True, False])
def test_the_server_reads_the_convention_and_the_thought_off_its_template(chat_pair: Pair, thinking: bool) -> None:
    serving = Running(chat_pair, template=template("qwen3-xml", thinking))
    try:
        assert serving.service.dialect.convention == convention("qwen3-xml")
        assert serving.service.dialect.thought == (Thought(True) if thinking else None)
    finally:
        serving.stop()


def test_spec_models_check_names_the_templates_convention(tmp_path: Path) -> None:
    target = write_model(tmp_path / "xml.gguf", seed=1, chat_template=template("qwen3-xml", thinking=True))
    facts = dict(template_facts(target))
    assert facts["tool calls"].startswith("qwen3-xml (as Qwen3-Coder")
    assert facts["thought"].startswith("opened by the prompt")


def with_control_markers(path: Path, markers: tuple[str, ...], chat_template: str) -> Path:
    """The tiny model over a vocabulary whose last tokens are `markers` as control tokens (as Mistral's GGUFs
    hold `[TOOL_CALLS]` and `[ARGS]`)."""
    base = default_tokenizer()
    tokens = [*base.tokens[:-len(markers)], *markers]
    types = [*base.types[:-len(markers)], *[CONTROL] * len(markers)]
    return write_model(path, seed=1, chat_template=chat_template,
                       tokenizer=replace(base, tokens=tokens, types=types))


def test_markers_that_are_control_tokens_are_forced_as_themselves_and_read(tmp_path: Path,
                                                                           other_draft_path: Path) -> None:
    markers = ("[TOOL_CALLS]", "[ARGS]")
    target = with_control_markers(tmp_path / "mistral.gguf", markers, template("mistral"))
    with load_pair(target, None) as pair:
        serving = Running(pair, defaults=GenerationRequest(draft_mode="ngram", draft_max=3))
        try:
            assert serving.service.dialect.convention == convention("mistral")
            ids = [pair.target.tokenize(marker, add_special=False) for marker in markers]
            assert all(len(found) == 1 and pair.target.is_control(found[0]) for found in ids)
            auto = call_grammar(Tools((WEATHER, TIME), "auto"), convention("mistral"), serving.service.dialect.spell)
            assert f"<[{ids[0][0]}]>" in auto and f"<[{ids[1][0]}]>" in auto
            state = pair.constraints.start(auto)  # free text, then the control token wakes the calls
            for token in pair.target.tokenize("the cat", add_special=False):
                state.accept(token)
            state.accept(ids[0][0])
            g, w = (max(t for t in range(pair.target.n_vocab) if pair.target.piece(t) == c) for c in (b"g", b"w"))
            assert state.allows(g) and not state.allows(w)  # get_time, and no other name
            answer = serving.client().chat.completions.create(
                model=NAME, messages=[{"role": "user", "content": "time?"}], temperature=0, max_tokens=40,
                tools=[{"type": "function", "function": TIME}], tool_choice="required", parallel_tool_calls=False)
        finally:
            serving.stop()
    assert answer.choices[0].finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in answer.choices[0].message.tool_calls] == [
        ("get_time", "{}")]
