"""llama.cpp's grammar sampler as `Grammar` drives it: states that advance and clone independently, and the
whole-vocabulary mask, found by first bytes and kept per state, equal to asking about every token."""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pytest
from tiny_models import FIRST_BYTE_TOKEN, byte_level_bpe, write_model

from spec_cli import Pair, load_pair
from spec_cli.llama.grammar import Grammar, GrammarError, check
from spec_cli.structured import schema_grammar

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
def test_the_mask_equals_asking_about_every_token_at_every_step(request: pytest.FixtureRequest,
                                                                vocabulary: str) -> None:
    """Along a JSON text that passes through braces, strings, escapes, numbers, multi-byte characters and
    enums, on a SentencePiece vocabulary with byte fallback and a byte-level BPE one."""
    model = request.getfixturevalue(vocabulary).target
    state = Grammar.compile(model, schema_grammar(SCHEMA))
    every = np.arange(model.n_vocab)
    rest = TEXT.encode()
    while rest:
        mask = state.clone().mask()
        np.testing.assert_array_equal(mask, state.allowed(every))
        token = max(np.flatnonzero(mask), key=lambda t: _matched(model.piece(int(t), special=True), rest))
        assert _matched(model.piece(int(token), special=True), rest), rest
        rest = rest[len(model.piece(int(token), special=True)):]
        state.accept(int(token))
    assert state.mask()[model.end_of_generation_tokens].all()  # complete: the end of generation may follow


def _matched(piece: bytes, rest: bytes) -> int:
    """How much of `rest` the piece spells (0 unless all of it is a prefix of `rest`)."""
    return len(piece) if piece and rest.startswith(piece) else 0


def test_clones_advance_on_their_own(alone: Pair) -> None:
    model = alone.target
    state = Grammar.compile(model, 'root ::= "ab" | "ac"')
    a, b, c = (FIRST_BYTE_TOKEN + ord(ch) for ch in "abc")
    after_a = state.after(a)
    assert state.allows(a) and not state.allows(b)
    assert after_a.allows(b) and after_a.allows(c)
    after_ab = after_a.after(b)
    assert not after_ab.allows(c) and after_a.allows(c)  # the clone moved, not its origin
    assert after_ab.allows(model.vocab_info().eos)
    with pytest.raises(ValueError, match="does not allow token"):
        after_ab.accept(c)  # llama.cpp would abort the process


def test_a_grammar_with_token_references_is_checked_when_a_model_parses_it(alone: Pair) -> None:
    check("root ::= <[7]>")  # needs a vocabulary: left to compile
    assert Grammar.compile(alone.target, "root ::= <[7]>").allows(7)
    with pytest.raises(GrammarError, match="does not parse: unexpected end of input"):
        check('root ::= "x')
