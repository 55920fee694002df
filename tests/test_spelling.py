"""Bytes to tokens and back, on real llama.cpp vocabularies: SentencePiece with and without a space prefix,
byte-level BPE; byte fallback, invalid UTF-8 and control tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.tiny_models import Tokenizer, byte_level_bpe, default_tokenizer, sentencepiece_merged_otherwise, write_model

from spec_cli.drafting.spelling import Speller, incomplete_tail, utf8_runs
from spec_cli.llama.model import Model

TOKENIZERS = {"sentencepiece": default_tokenizer, "sentencepiece-other": sentencepiece_merged_otherwise,
              "byte-level-bpe": byte_level_bpe}


@pytest.fixture(scope="module", params=list(TOKENIZERS))
def speller(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Speller:
    tokenizer: Tokenizer = TOKENIZERS[request.param]()
    path = write_model(tmp_path_factory.mktemp("spelling") / f"{request.param}.gguf", seed=1, tokenizer=tokenizer)
    return Speller(Model(path, vocab_only=True))


def test_utf8_runs_part_valid_text_from_stray_bytes() -> None:
    assert utf8_runs(b"ab\xc3\xa9c\x80\x80d\xe2\x82") == [
        (b"ab\xc3\xa9c", True), (b"\x80\x80", False), (b"d", True), (b"\xe2\x82", False)]
    assert utf8_runs("東京".encode()) == [("東京".encode(), True)]
    assert utf8_runs(b"") == []


@pytest.mark.parametrize("data, held", [(b"ab", 0), (b"a\xc3", 1), (b"a\xc3\xa9", 0), (b"\xe6\x9d", 2),
                                        (b"\xf0\x9f\x99", 3), ("🙂".encode(), 0), (b"\x80", 0)])
def test_incomplete_tail_holds_back_only_a_character_still_being_written(data: bytes, held: int) -> None:
    assert incomplete_tail(data) == held


@pytest.mark.parametrize("text", [b"the cat sat", b" the cat", b"lo world", b"caf\xc3\xa9 cr\xc3\xa8me \xf0\x9f\x99\x82",
                                  b"ab\x80\xffcd", b"x\n\n  y", b" ", b"\xc3"])
def test_spell_renders_back_to_the_same_bytes(speller: Speller, text: bytes) -> None:
    """Fragments that start mid-word or with a space, non-ASCII text through byte fallback, invalid UTF-8,
    and a half character: no space is added, nothing is lost."""
    tokens = speller.spell(text)
    assert speller.render(tokens) == text
    assert not any(speller.control[token] for token in tokens)


def test_a_space_prefix_vocabulary_spells_a_fragment_without_one(tmp_path: Path) -> None:
    model = Model(write_model(tmp_path / "prefix.gguf", seed=1), vocab_only=True)
    assert model.adds_space_prefix
    plain = model.tokenize_bytes(b"lo", add_special=False, parse_special=False)
    assert Speller(model).render(plain) == b" lo"  # what the tokenizer alone does to a fragment
    assert Speller(model).render(Speller(model).spell(b"lo")) == b"lo"


def test_control_text_becomes_the_vocabulary_s_own_control_token_where_it_has_one(tmp_path: Path) -> None:
    chatml = Speller(Model(write_model(tmp_path / "bpe.gguf", seed=1, tokenizer=byte_level_bpe()), vocab_only=True))
    plain = Speller(Model(write_model(tmp_path / "spm.gguf", seed=1), vocab_only=True))
    assert chatml.spell_control(b"<|im_start|>") == [1] and chatml.control[1]
    spelt = plain.spell_control(b"<|im_start|>")
    assert len(spelt) > 1 and plain.render(spelt) == b"<|im_start|>"
    assert chatml.pieces[1] == b"<|im_start|>"  # a control token's piece is its text, for the other model
