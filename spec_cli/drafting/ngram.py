"""Prompt lookup: drafts copied from earlier in the sequence, no second model."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from spec_cli.decoding.drafter import Draft, Drafter
from spec_cli.decoding.sampling import Law, SamplingParams
from spec_cli.llama.grammar import Grammar
from spec_cli.llama.vision import up_to_image


class NgramDrafter(Drafter):
    """Prompt lookup: find the latest earlier occurrence of the sequence's last n tokens and propose what
    followed it. No second model; it shines when the output copies its input (edits, rewrites, code).

    Tries n = n_max down to n_min, longest match first. An index of n-gram → latest end position is
    extended as the sequence grows, so a round costs O(new tokens), not O(sequence).
    """

    def __init__(self, n_vocab: int, n_max: int = 4, n_min: int = 2) -> None:
        self.n_vocab = n_vocab
        self.n_max = n_max
        self.n_min = n_min
        self._tokens: list[int] = []
        self._index: dict[tuple[int, ...], int] = {}

    def prefill(self, tokens: Sequence[int]) -> list[tuple[int, float]]:
        self._tokens, self._index = [], {}
        self._extend(tokens)
        return []

    def propose(self, tokens: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator,
                grammar: Grammar | None = None) -> Draft:
        """The tokens that followed the match; a grammar is the loop's to apply (it cuts the draft)."""
        self._extend(tokens)
        proposed, match = self.lookup(k)
        draft = Draft(tokens=proposed, match=match)
        if not sampling.greedy:
            draft.q = [Law.one_hot(token, self.n_vocab) for token in draft.tokens]
        return draft

    def rewind(self, n_keep: int) -> None:
        if n_keep < len(self._tokens):
            self.prefill(self._tokens[:n_keep])

    def lookup(self, k: int) -> tuple[list[int], int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix (never an
        image's), and that suffix's length."""
        tokens = self._tokens
        for n in range(min(self.n_max, len(tokens) - 1), self.n_min - 1, -1):
            end = self._index.get(tuple(tokens[-n:]))
            if end is not None:
                return up_to_image(tokens[end + 1:end + 1 + k]), n
        return [], 0

    def _extend(self, tokens: Sequence[int]) -> None:
        """Index every n-gram that ends before the last token (so each indexed match has a continuation)."""
        start = len(self._tokens)
        self._tokens.extend(tokens[start:])
        for end in range(max(start - 1, 0), len(self._tokens) - 1):
            for n in range(self.n_min, self.n_max + 1):
                if end + 1 >= n:
                    self._index[tuple(self._tokens[end + 1 - n:end + 1])] = end
