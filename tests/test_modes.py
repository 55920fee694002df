"""The registry of drafting modes: what each pair can draft with, its default, which costs each mode books, and
that a new mode is one entry (the pair, the request and the loop never name a mode)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pytest

from spec_cli import Pair, SpecError
from spec_cli.decoding.draft_length import AUTO_K_MAX, AdaptiveK, FixedK
from spec_cli.decoding.drafter import Draft, Drafter
from spec_cli.decoding.sampling import SamplingParams
from spec_cli.drafting import modes
from spec_cli.drafting.hybrid import HybridDrafter
from spec_cli.drafting.model import ModelDrafter
from spec_cli.drafting.modes import MODES, Mode
from spec_cli.drafting.ngram import NgramDrafter
from spec_cli.drafting.recall import MemoryDrafter
from spec_cli.llama.grammar import Grammar

PROMPT = "the cat and the dog"


def test_what_a_pair_can_draft_with_and_its_default(alone: Pair, other: Pair) -> None:
    assert alone.drafting_modes == ("ngram", "memory", "hybrid") and alone.default_draft_mode == "hybrid"
    assert other.drafting_modes == ("model", "ngram", "memory", "hybrid") and other.default_draft_mode == "hybrid"
    assert alone.drafting.own_models() == () and other.drafting.own_models() == ("model",)
    with pytest.raises(SpecError, match="^draft mode 'model' needs a draft model; give one, or use --draft-mode ngram$"):
        alone.drafting.check("model")
    with pytest.raises(SpecError, match="target.gguf has no MTP layers to draft with"):
        other.drafting.check("mtp")


def test_each_mode_builds_its_drafter(other: Pair) -> None:
    built = {name: other.drafting.build(name, 0.0, 4) for name in other.drafting.modes}
    assert isinstance(built["model"][0], ModelDrafter) and isinstance(built["ngram"][0], NgramDrafter)
    hybrid, cap = built["hybrid"]
    assert isinstance(built["memory"][0], MemoryDrafter)
    assert isinstance(hybrid, HybridDrafter) and list(hybrid.own) == ["model"]
    assert isinstance(hybrid.lookup, MemoryDrafter) and hybrid.lookup.memory is other.output_memory
    assert isinstance(hybrid.own["model"], ModelDrafter)
    # K is the model's; n-gram proposals cost little to make, so their own controller sets their length.
    assert hybrid.state.lengths["model"].next_k() == 4 and cap.next_k() == AUTO_K_MAX
    assert isinstance(hybrid.state.lengths["memory"], AdaptiveK)
    assert other.drafting.build("none", 0.0, 4)[0] is None
    # K controllers are kept across generations: what they learnt carries over.
    assert other.drafting.build("model", 0.0, "auto")[1] is other.drafting.build("model", 0.0, "auto")[1]


def test_the_loop_never_names_a_drafting_mode() -> None:
    """`decoding/` knows drafters by their interface only: no string in it is a mode's name, but for words that are
    something else there (the target alone's "none", the statistics' label for no drafter)."""
    import ast
    from pathlib import Path

    import spec_cli.decoding

    other_meanings = {"sampling.py: model",  # the sampling preset the model's card recommends
                      "stats.py: memory"}  # the models' memory use, in the statistics
    named = set()
    for module in Path(spec_cli.decoding.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.Constant) and node.value in set(MODES) - {"none"}:
                named.add(f"{module.name}: {node.value}")
    assert named == other_meanings


class RepeatLast(Drafter):
    """Proposes the sequence's last token K times: often wrong, which exercises rejections."""

    def propose(self, tokens: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator,
                grammar: Grammar | None = None) -> Draft:
        return Draft(tokens=[tokens[-1]] * k)


def test_a_new_mode_is_one_registry_entry(monkeypatch: pytest.MonkeyPatch, alone: Pair) -> None:
    entry = Mode("repeat", "repeat the last token", "the last token again", loads_draft=False,
                 available=lambda _s: True, missing=lambda _s: "",
                 build=lambda drafting, _p_min, k: (RepeatLast(), FixedK(k)))
    monkeypatch.setitem(MODES, "repeat", entry)
    plain = list(alone.generate(PROMPT, raw=True, max_tokens=32, draft_mode="none"))
    generation = alone.generate(PROMPT, raw=True, max_tokens=32, draft_mode="repeat", draft_max=3)
    assert [e.token for e in generation] == [e.token for e in plain]
    assert generation.stats.draft_mode == "repeat" and generation.stats.drafted > 0
    assert "repeat" in alone.drafting_modes and modes.mode("repeat") is entry
