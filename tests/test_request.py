"""One request, checked once: every field's rule, and the same message from every face, each naming the field
as its users know it."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from spec_cli import GenerationRequest, Pair, load_pair
from spec_cli.conversation.session import ChatSession, Settings, run_command
from spec_cli.cli.app import app
from spec_cli.decoding.sampling import SamplingParams
from spec_cli.errors import SpecError
from spec_cli.request import MAX_K, InvalidRequest, draft_max_from_text
from spec_cli.api.errors import RequestError
from spec_cli.api.openai_api import parse_chat

HELLO = [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize("fields, field, message", [
    ({"draft_max": MAX_K + 1}, "draft_max", "draft-max must be a number from 0 to 64 or 'auto', got 65"),
    ({"draft_max": -1}, "draft_max", "draft-max must be a number from 0 to 64 or 'auto', got -1"),
    ({"draft_max": True}, "draft_max", "draft-max must be a number from 0 to 64 or 'auto', got True"),
    ({"draft_max": 2.0}, "draft_max", "draft-max must be a number from 0 to 64 or 'auto', got 2.0"),
    ({"draft_max": "many"}, "draft_max", "draft-max must be a number from 0 to 64 or 'auto', got 'many'"),
    ({"draft_mode": "psychic"}, "draft_mode",
     "unknown draft mode 'psychic'; choose one of: model, eagle3, dflash, mtp, ngram, memory, hybrid, none"),
    ({"draft_p_min": 1.0}, "draft_p_min", "draft-p-min must be in [0, 1), got 1.0"),
    ({"verify": "trust"}, "verify", "unknown verification 'trust'; choose one of: block, token, gumbel"),
    ({"max_tokens": 0}, "max_tokens", "max-tokens must be >= 1, got 0"),
    ({"seed": -2}, "seed", "seed must be a whole number >= 0, or -1 for a random seed, got -2"),
    ({"seed": 1.5}, "seed", "seed must be a whole number >= 0, or -1 for a random seed, got 1.5"),
    ({"verify": "x" * 100}, "verify", f"unknown verification '{'x' * 38}…; choose one of: block, token, gumbel"),
    ({"draft_max": 10**500}, "draft_max", "draft-max must be a number from 0 to 64 or 'auto', got an integer too large"),
])
def test_each_field_is_checked_with_one_message(fields: dict[str, object], field: str, message: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        GenerationRequest(**fields)
    assert caught.value.field == field and str(caught.value) == message


def test_a_seed_of_minus_one_asks_for_a_random_seed_as_in_llama_cpp() -> None:
    assert GenerationRequest(seed=-1).seed is None and GenerationRequest(seed=0).seed == 0


@pytest.mark.parametrize("k", [0, 1, MAX_K, "auto"])
def test_the_limits_themselves_are_accepted(k: int | str) -> None:
    assert GenerationRequest(draft_max=k).draft_max == k
    assert GenerationRequest(draft_max=k).adaptive == (k == "auto")


def test_a_value_with_braces_is_quoted_as_given() -> None:
    with pytest.raises(InvalidRequest) as caught:
        GenerationRequest(draft_mode="{name}")
    assert caught.value.named({"draft_mode": "--draft-mode"}).startswith("unknown --draft-mode '{name}';")


@pytest.mark.parametrize("text, value", [("auto", "auto"), ("AUTO", "auto"), ("6", 6), ("-3", -3), ("lots", "lots")])
def test_k_as_typed_becomes_a_value_for_the_request_to_check(text: str, value: int | str) -> None:
    assert draft_max_from_text(text) == value


@pytest.fixture(scope="module")
def pair(target_path) -> Pair:
    with load_pair(target_path, target_path) as loaded:
        yield loaded


def test_every_face_gives_the_same_message_in_its_own_words(pair: Pair, target_path) -> None:
    """The Python API, the command line, chat's /set and the server refuse K = 65 with one rule."""
    rule = "must be a number from 0 to 64 or 'auto', got 65"
    with pytest.raises(SpecError, match=f"^draft-max {rule}$"):
        pair.generate("the cat", draft_max=65)
    result = CliRunner().invoke(app, ["run", "--target", str(target_path), "--no-draft", "-k", "65", "hi"])
    assert result.exit_code == 1 and result.stderr.strip() == f"spec: error: --draft-max {rule}"
    session = ChatSession(pair, Settings(draft_mode="model", max_tokens=4))
    with pytest.raises(SpecError, match=f"^k {rule}$"):
        run_command(session, "/set k 65")
    assert session.settings.draft_max == 4  # a refused value changes nothing
    with pytest.raises(RequestError) as caught:
        parse_chat({"messages": HELLO, "draft_max": 65})
    assert (caught.value.message, caught.value.param) == (f"'draft_max' {rule}", "draft_max")


def test_generate_takes_a_request_and_keywords_set_its_fields(pair: Pair) -> None:
    request = GenerationRequest(draft_max=3, max_tokens=6)
    by_request = list(pair.generate("the cat", request, raw=True))
    by_keywords = list(pair.generate("the cat", raw=True, draft_max=3, max_tokens=6))
    assert [e.token for e in by_request] == [e.token for e in by_keywords] and len(by_request) == 6
    overridden = pair.generate("the cat", request, raw=True, max_tokens=2)
    assert len(list(overridden)) == 2 and request.max_tokens == 6


def test_a_temperature_too_small_for_float32_is_greedy_on_every_face(pair: Pair, target_path) -> None:
    """`--temp 1e-300` once gave garbage: 1/T overflowed float32. It is greedy now, in run, chat and the API."""
    def run(*flags: str) -> str:
        result = CliRunner().invoke(app, ["run", "--target", str(target_path), "--no-draft", "--raw", "-n", "16",
                                          "--json", *flags, "the cat"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)["text"]

    assert run("--temp", "1e-300", "--top-k", "0", "--top-p", "1", "--min-p", "0") == run("--temp", "0")
    session = ChatSession(pair, Settings(draft_mode="model", max_tokens=4))
    run_command(session, "/set temp 1e-300")
    assert session.settings.sampling.greedy
    tiny = pair.generate("the cat", raw=True, max_tokens=16, sampling=SamplingParams(temperature=1e-300, top_k=0))
    assert list(tiny) and tiny.text == run("--temp", "0")


@pytest.mark.parametrize("flag, value", [("--temp", "inf"), ("--presence-penalty", "-inf")])
def test_numbers_that_are_not_finite_are_refused_in_one_line(target_path, flag: str, value: str) -> None:
    result = CliRunner().invoke(app, ["run", "--target", str(target_path), "--no-draft", flag, value, "hi"])
    assert result.exit_code == 1 and result.stderr.strip().endswith(f"must be a finite number, got {value}")


@pytest.mark.parametrize("fields, rule", [
    ({}, "block"), ({"seed": -1}, "block"),  # no seed (or a random one): the fastest exact rule
    ({"seed": 3}, "gumbel"), ({"seed": 0}, "gumbel"),  # a seed repeats its text whatever drafts it
    ({"seed": 3, "verify": "block"}, "block"), ({"verify": "token"}, "token"),  # a rule named is the rule
])
def test_a_seeded_request_verifies_by_the_rule_no_draft_can_change(fields: dict, rule: str) -> None:
    assert GenerationRequest(**fields).verify_rule == rule

