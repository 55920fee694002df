"""llama.cpp's rules for sharing token ids, on tiny models that differ in one respect each; a pair that breaks
one drafts through text."""

from __future__ import annotations

from pathlib import Path

from support.tiny_models import write_model

from spec_cli.llama.model import Model
from spec_cli.drafting.vocab import compare, shares_ids, translation


def load(path: Path) -> Model:
    return Model(path)


def test_models_sharing_a_vocabulary_pass_every_rule(target_path: Path, other_draft_path: Path) -> None:
    rules = compare(load(target_path), load(other_draft_path))
    assert [r.name for r in rules if not r.passed] == []
    assert {r.name for r in rules} >= {"vocabulary type", "BOS token id", "EOS token id", "vocabulary size",
                                      "token texts"}
    assert shares_ids(load(target_path), load(other_draft_path))
    assert translation(load(target_path), load(other_draft_path)) is None


def test_first_differing_token_is_named_with_both_texts(tmp_path: Path, target_path: Path) -> None:
    renamed = write_model(tmp_path / "renamed.gguf", seed=3, rename_token=290)
    failed = [r for r in compare(load(target_path), load(renamed)) if not r.passed]
    assert [r.name for r in failed] == ["token texts"]
    assert "id 290" in failed[0].detail and "_renamed" in failed[0].detail


def test_differences_below_id_5_are_ignored(tmp_path: Path, target_path: Path) -> None:
    renamed = write_model(tmp_path / "special.gguf", seed=3, rename_token=4)
    assert shares_ids(load(target_path), load(renamed))


def test_eos_mismatch_is_named_and_drafts_through_text(tmp_path: Path, target_path: Path) -> None:
    other_eos = write_model(tmp_path / "eos.gguf", seed=3, eos=1)
    failed = [r for r in compare(load(target_path), load(other_eos)) if not r.passed]
    assert [(r.name, r.detail) for r in failed] == [("EOS token id", "target 2, draft 1")]
    assert translation(load(target_path), load(other_eos)) is not None


def test_vocabulary_sizes_may_differ_by_at_most_128(tmp_path: Path, target_path: Path) -> None:
    near = write_model(tmp_path / "near.gguf", seed=3, vocab_size=320 + 128)
    far = write_model(tmp_path / "far.gguf", seed=3, vocab_size=320 + 129)
    assert shares_ids(load(target_path), load(near))
    assert [r.name for r in compare(load(target_path), load(far)) if not r.passed] == ["vocabulary size"]
