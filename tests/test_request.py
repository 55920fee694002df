"""One request, checked once: every field's rule, and the same message from every face, each naming the field
as its users know it."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from spec_cli import GenerationRequest, Pair, load_pair
from spec_cli.chat import ChatSession, Settings, run_command
from spec_cli.cli.app import app
from spec_cli.errors import SpecError
from spec_cli.request import MAX_K, InvalidRequest, draft_max_from_text
from spec_cli.server.openai_api import RequestError, parse_chat

HELLO = [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize("fields, field, message", [
    ({"draft_max": MAX_K + 1}, "draft_max", "draft-max must be a number from 0 to 64 or 'auto', got 65"),
    ({"draft_max": -1}, "draft_max", "draft-max must be a number from 0 to 64 or 'auto', got -1"),
    ({"draft_max": True}, "draft_max", "draft-max must be a number from 0 to 64 or 'auto', got True"),
    ({"draft_max": 2.0}, "draft_max", "draft-max must be a number from 0 to 64 or 'auto', got 2.0"),
    ({"draft_max": "many"}, "draft_max", "draft-max must be a number from 0 to 64 or 'auto', got 'many'"),
    ({"draft_mode": "psychic"}, "draft_mode",
     "unknown draft mode 'psychic'; choose one of: model, mtp, ngram, hybrid, none"),
    ({"draft_p_min": 1.0}, "draft_p_min", "draft-p-min must be in [0, 1), got 1.0"),
    ({"verify": "trust"}, "verify", "unknown verification 'trust'; choose one of: block, token"),
    ({"max_tokens": 0}, "max_tokens", "max-tokens must be >= 1, got 0"),
])
def test_each_field_is_checked_with_one_message(fields: dict[str, object], field: str, message: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        GenerationRequest(**fields)
    assert caught.value.field == field and str(caught.value) == message


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
