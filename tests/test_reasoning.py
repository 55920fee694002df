"""The reasoning budget: a thought closed after N tokens by the target's own tokens of its close marker, exact
under speculation (greedy identity with rejections), on a thought the prompt opened or one the answer opens,
alone or over a grammar; and through `spec serve`, a thought then a JSON answer."""

from __future__ import annotations

import json

import pytest
from support.chat_templates import template
from support.exactness import finish

from spec_cli import Pair
from spec_cli.request import ReasoningBudget

from support.serving import HELLO, NAME, Running

PROMPT = "the cat and the dog"
OPENED = ReasoningBudget(5)


@pytest.fixture(scope="module")
def budgeted(alone: Pair) -> list[int]:
    return finish(alone.generate(PROMPT, raw=True, max_tokens=14, draft_mode="none", reasoning_budget=OPENED)).token_ids


def test_the_thought_is_closed_after_its_budget(alone: Pair, budgeted: list[int]) -> None:
    free = finish(alone.generate(PROMPT, raw=True, max_tokens=14, draft_mode="none")).token_ids
    close = alone.target.tokenize("</think>", add_special=False)
    assert budgeted[:5] == free[:5] and budgeted[5:5 + len(close)] == close


@pytest.mark.parametrize("drafter, k", [("same", 4), ("other", 3)])
def test_greedy_under_a_budget_equals_the_target_alone(request: pytest.FixtureRequest, budgeted: list[int],
                                                       drafter: str, k: int) -> None:
    pair: Pair = request.getfixturevalue(drafter)
    generation = finish(pair.generate(PROMPT, raw=True, max_tokens=14, draft_max=k, draft_mode="model",
                                      reasoning_budget=OPENED))
    assert generation.token_ids == budgeted and generation.stats.drafted > 0
    if drafter == "other":
        assert generation.stats.accepted < generation.stats.drafted


def test_a_thought_the_answer_does_not_open_is_not_bounded(alone: Pair) -> None:
    free = finish(alone.generate(PROMPT, raw=True, max_tokens=12, draft_mode="none")).token_ids
    optional = finish(alone.generate(PROMPT, raw=True, max_tokens=12, draft_mode="none",
                                     reasoning_budget=ReasoningBudget(3, open="<think>"))).token_ids
    assert optional == free


def test_a_thinking_template_thinks_then_answers_json(chat_pair: Pair) -> None:
    schema = {"type": "object", "properties": {"animal": {"enum": ["cat", "dog"]}}, "required": ["animal"]}
    serving = Running(chat_pair, template=template("hermes", thinking=True))
    try:
        answer = serving.client().chat.completions.create(
            model=NAME, messages=HELLO, temperature=0, max_tokens=40,
            response_format={"type": "json_schema", "json_schema": {"name": "pet", "schema": schema}},
            extra_body={"reasoning_budget": 6})
        message = answer.choices[0].message
        assert message.model_extra["reasoning_content"] and json.loads(message.content)["animal"] in ("cat", "dog")
        refused = serving.post("/v1/chat/completions", {"messages": HELLO, "reasoning_budget": -1})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "reasoning_budget"
    finally:
        serving.stop()
