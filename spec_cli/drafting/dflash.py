"""Drafting with a DFlash block-diffusion drafter (Chen et al. 2026): a few layers as wide as the target that
read its features (the inputs of some of its layers) and propose a whole block of tokens in one pass.

Its memory holds, at each position the target has decoded, the target's features there (its fc layer writes
them into the KV cache when they are injected). A round from x_0..x_n injects the positions it lacks, then
decodes [x_n, MASK × K] after them with attention over the whole block (non-causal): row i's logits are the
drafter's law for x_{n+i}, for every i at once. One pass drafts K tokens, so a round costs one drafter pass
whatever K is; llama.cpp's block is at most `dflash.block_size` tokens, so K ≤ block size − 1.

Why the rows are valid proposals at T > 0: row i's law r_i depends on the context and on how many masks
follow, never on the tokens drafted at rows before it. Drawing d_i from q_i = transform(r_i) (penalties that
count d_1..d_{i−1}, a grammar's state after them) is drawing from a proposal whose law at position i, given
the context and d_1..d_{i−1}, is q_i: the conditional law token verification (min(1, p/q)) and block
verification need of each position. So the output keeps the target's law, as with any drafter.

With images in the prompt the memory holds the target's features at text positions only (`text_only`).
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from spec_cli.decoding.costs import PER_ROUND
from spec_cli.decoding.drafter import Draft
from spec_cli.decoding.sampling import SamplingParams
from spec_cli.drafting.base import CatchUpDrafter, drafted_token
from spec_cli.drafting.text_only import TextOnly
from spec_cli.llama.context import Context, common_prefix
from spec_cli.llama.grammar import Grammar
from spec_cli.llama.heads import BlockContext


class DFlashDrafter(CatchUpDrafter):
    """Drafts with the DFlash drafter whose memory is `block` for the target whose context is `target` (which
    keeps the features the drafter was trained on). A round's drafts are one pass over the block."""

    cost_shape = PER_ROUND

    def __init__(self, target: Context, block: BlockContext, p_min: float = 0.0) -> None:
        if not target.keeps_features:
            raise ValueError("the target context must keep the drafter's feature layers (feature_layers=...)")
        self.target, self.block, self.p_min = target, block, p_min
        self.clocks = (block,)
        self.k_max = block.block_size - 1
        self.text = TextOnly()  # positions below are those of the sequence's text, its images left out

    def start(self, tokens: Sequence[int]) -> None:
        """A new prompt: keep the features the memory holds of it; the catch-up injects the rest."""
        held = self.text.sequence(self.block.tokens)
        self.text.see(tokens)
        self.block.trim(self.text.length(common_prefix(held, tokens)))

    def _feed(self, tokens: Sequence[int], n: int) -> list[tuple[int, float]]:
        """Inject the next `n` positions the memory lacks: not a cost the rounds are priced with, as a round is one
        pass."""
        self._catch_up(tokens, min(self.text.length(len(tokens)) - 1, self.block.n_past + n))
        return []

    def pending(self, tokens: Sequence[int]) -> int:
        return self.text.length(len(tokens)) - 1 - self.block.n_past

    def propose(self, tokens: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator,
                grammar: Grammar | None = None) -> Draft:
        """Up to k tokens after `tokens` from one block pass, each drawn from its row's law transformed as the
        target's p (penalties counting the drafted tokens before it); the draft ends at the first row the
        confidence stop or the grammar ends it at."""
        draft = Draft()
        k = min(k, self.k_max)
        if k <= 0:
            return draft
        started = time.perf_counter()
        self._catch_up(tokens, self.text.length(len(tokens)) - 1)
        rows = self.block.block(tokens[-1], k + 1)[1:]
        choose, recent = drafted_token(sampling, rng, self.p_min, grammar), sampling.recent(tokens)
        for logits in rows:
            token = choose(draft, logits, recent)
            if token is None:
                break
            recent = sampling.recent([*recent, token])
        draft.steps.append((k + 1, time.perf_counter() - started))
        return draft

    def rewind(self, n_keep: int) -> None:
        self.block.trim(self.text.length(n_keep))

    def _catch_up(self, tokens: Sequence[int], end: int) -> None:
        """Inject the target's features at text positions from the memory's end to `end` (the target has
        decoded them)."""
        start = self.block.n_past
        if end > start:
            features = self.target.features(self.text.positions(start, end))
            self.block.inject(self.text.text(tokens, start, end), features)
