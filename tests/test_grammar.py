"""llguidance over a llama.cpp vocabulary as `Grammar` drives it: the mask along a JSON text (escapes, numbers,
multi-byte characters, enums) on two kinds of vocabulary, states that advance and clone independently,
compiled grammars kept by hash, and grammars that cannot be used refused with one line."""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pytest
from support.tiny_models import FIRST_BYTE_TOKEN, byte_level_bpe, write_model

from spec_cli import Pair, load_pair
from spec_cli.llama.grammar import Constraints, GrammarError, check, llguidance_grammar
from spec_cli.formats.structured import schema_grammar

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"enum": ["a b", "çé"]}}},
          "required": ["name", "n", "tags"]}
TEXT = '{ "name": "the cat \\u00e9 and", "n": -12, "tags": ["a b", "çé"] }'


@pytest.fixture(scope="module")
def bpe(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    path = write_model(tmp_path_factory.mktemp("bpe") / "bpe.gguf", seed=1, tokenizer=byte_level_bpe())
    with load_pair(path, None) as pair:
        yield pair


@pytest.mark.parametrize("vocabulary", ["alone", "bpe"])
def test_the_mask_follows_a_json_text_and_refuses_what_breaks_it(request: pytest.FixtureRequest,
                                                                 vocabulary: str) -> None:
    """At every step the text's next piece is allowed and a raw control character never is (not in a string
    either: strict JSON parsers refuse it); an array cannot start the object; the end of generation only once
    it is complete. On SentencePiece with byte fallback and byte-level BPE."""
    model = request.getfixturevalue(vocabulary).target
    state = Constraints(model).start(schema_grammar(SCHEMA).grammar)
    pieces = {token: model.piece(token, special=True) for token in range(model.n_vocab)}
    control = [t for t, piece in pieces.items() if piece in (b"\x01", b"\x1f")]
    assert len(control) == 2 and not state.mask()[[t for t, piece in pieces.items() if piece == b"["]].any()
    rest = TEXT.encode()
    while rest:
        mask = state.mask()
        assert not mask[model.end_of_generation_tokens].any() and not mask[control].any()
        token = max(np.flatnonzero(mask), key=lambda t: len(pieces[t]) if rest.startswith(pieces[t]) else -1)
        assert rest.startswith(pieces[token]) and pieces[token], rest
        rest = rest[len(pieces[token]):]
        state.accept(int(token))
    assert state.mask()[model.end_of_generation_tokens].all()  # complete: the end of generation may follow


def test_clones_advance_on_their_own(alone: Pair) -> None:
    """Where the grammar spells a literal, llguidance allows its letters' own tokens, not their byte-fallback
    twins."""
    model = alone.target
    state = Constraints(model).start('root ::= "ab" | "ac"')
    a, b, c = (max(t for t in range(model.n_vocab) if model.piece(t, special=True) == ch.encode()) for ch in "abc")
    assert not state.allows(FIRST_BYTE_TOKEN + ord("a"))
    after_a = state.after(a)
    assert state.allows(a) and not state.allows(b)
    assert after_a.allows(b) and after_a.allows(c)
    after_ab = after_a.after(b)
    assert not after_ab.allows(c) and after_a.allows(c)  # the clone moved, not its origin
    assert after_ab.allows(model.vocab_info().eos)
    with pytest.raises(ValueError, match="does not allow token"):
        after_ab.accept(c)  # llguidance would fall into an error state for good


def test_compiled_grammars_are_kept_by_hash_the_least_used_dropped(alone: Pair) -> None:
    constraints = Constraints(alone.target, kept=2)
    grammars = ['root ::= "a"', 'root ::= "b"', 'root ::= "c"']
    for gbnf in grammars:
        constraints.compile(gbnf)
    assert [g in constraints for g in grammars] == [False, True, True]
    constraints.start(grammars[1])  # used: kept over "c"
    constraints.compile(grammars[0])
    assert [g in constraints for g in grammars] == [True, True, False]


@pytest.mark.parametrize("gbnf, reason", [
    ('root ::= "a', "does not parse: Unexpected end of input at line 1"),
    ("root ::= missing", "does not parse: Rule 'missing' not found"),
    ("root ::= [z-a]", "does not parse: at 3(8): invalid regex \"[z-a]\""),
])
def test_a_grammar_that_does_not_parse_is_refused_in_one_line(gbnf: str, reason: str) -> None:
    with pytest.raises(GrammarError) as caught:
        check(llguidance_grammar(gbnf))
    assert caught.value.reason.startswith(reason) and "\n" not in caught.value.reason


def test_a_grammar_that_allows_no_token_at_its_start_is_refused(alone: Pair) -> None:
    with pytest.raises(GrammarError, match="allows no token of the model's vocabulary at its start"):
        Constraints(alone.target).compile(r"start: /[^\x00-\U0010FFFF]/")
