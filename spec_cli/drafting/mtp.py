"""Drafting with the target's own multi-token-prediction (MTP, "nextn") head: no second model, no second
vocabulary, a fraction of a draft model's memory.

Qwen3.5/3.6, GLM-4.5 and later, DeepSeek V3 and others ship one such head (or several) inside their GGUF. It
predicts the token after next from the token x_p and the target's hidden state h_{p-1} (its last layer's,
after the output norm): at position p of its own small memory it holds the pair (x_p, h_{p-1}). The target
hands over h for every position it decodes (`Context(hidden_states=True)`), so the verify pass that checks
one round's drafts also gives the head what it needs for the next.

A round from the sequence x_0..x_n: the head catches up on the pairs it lacks, all built on the target's
hidden states, and the last one, (x_n, h_{n-1}), yields q_1 and d_1 with the head's own hidden state h'_n;
then (d_1, h'_n) yields q_2 and d_2, and so on (Gloeckle et al. 2024; DeepSeek-V3's MTP used for speculative
decoding). The pairs from d_1 on carry the head's h', not the target's, so they are taken back as soon as
the round is drafted, whatever the target keeps: the next round pairs the kept tokens with the target's h.

An image in the prompt has no token to pair: the head reads the text around it (`text_only`), each text token
paired with the target's state at the text token before it, which has seen the image.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from spec_cli.decoding.drafter import Draft
from spec_cli.decoding.sampling import SamplingParams
from spec_cli.drafting.base import CatchUpDrafter, draft_step_by_step, drafted_token
from spec_cli.llama.context import Context, common_prefix
from spec_cli.llama.grammar import Grammar
from spec_cli.drafting.text_only import TextOnly
from spec_cli.llama.heads import HeadContext


class MtpDrafter(CatchUpDrafter):
    """Drafts with the MTP head of the target whose context is `target` (which keeps its hidden states).

    The head pairs sequence position p with the state before it, from position `first` on: its own position
    p − `first`. Subclasses that pair other states say where those come from (`_states`).
    """

    first = 0  # the first sequence position the head pairs (the MTP head pairs x_0 with zeros)

    def __init__(self, target: Context, head: HeadContext, p_min: float = 0.0) -> None:
        self._check(target)
        self.target, self.head, self.p_min = target, head, p_min
        self.clocks = (head,)
        self._start: list[int] = []  # the sequence's tokens before the head's first pair
        self.text = TextOnly()  # positions below are those of the sequence's text, its images left out

    @staticmethod
    def _check(target: Context) -> None:
        """Refuse a target context that does not keep the states `_states` reads."""
        if target.hidden is None:
            raise ValueError("the target context must keep its hidden states (hidden_states=True)")

    def start(self, tokens: Sequence[int]) -> None:
        """A new prompt: keep the pairs the head holds of it (up to the first image that differs: the states after
        it do); the catch-up pairs the rest."""
        held = self.text.sequence([*self._start, *self.head.tokens] if self.head.n_past else [])
        self.text.see(tokens)
        self.head.trim(max(self.text.length(common_prefix(held, tokens)) - self.first, 0))
        self._start = self.text.text(tokens, 0, self.first)

    def _feed(self, tokens: Sequence[int], n: int) -> list[tuple[int, float]]:
        """Pair the next `n` tokens the head lacks with the target's states before them."""
        start = self.head.n_past + self.first
        end = min(self.text.length(len(tokens)), start + n)
        if end <= start:
            return []
        started = time.perf_counter()
        self.head.decode(self.text.text(tokens, start, end), self._states(start, end), 0)
        return [(end - start, time.perf_counter() - started)]

    def pending(self, tokens: Sequence[int]) -> int:
        """How many pairs the next proposal feeds before its first draft step (its catch-up)."""
        return self.text.length(len(tokens)) - self.head.n_past - self.first

    def propose(self, tokens: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator,
                grammar: Grammar | None = None) -> Draft:
        """Up to k tokens after `tokens`: catch up to the last token with the target's states, then feed back
        the head's own. Penalties count the drafted tokens, as the target's p will."""
        n, start = self.text.length(len(tokens)), self.head.n_past + self.first
        hidden: np.ndarray | None = None

        def step(i: int, fed: list[int]) -> np.ndarray:
            nonlocal hidden
            states = self._states(start, n) if i == 0 else hidden
            logits, hidden = self.head.decode(fed, states, 1)  # the next step pairs its token with this h'
            return logits[0]

        draft = draft_step_by_step(step, self.text.text(tokens, start), k, sampling, sampling.recent(tokens),
                                   drafted_token(sampling, rng, self.p_min, grammar))
        self.head.trim(n - self.first)  # the pairs of drafted tokens hold the head's h', never the target's
        return draft

    def rewind(self, n_keep: int) -> None:
        self.head.trim(max(self.text.length(n_keep) - self.first, 0))

    def _states(self, start: int, end: int) -> np.ndarray:
        """h_{p-1} for text tokens p in [start, end): the target's hidden states at the text token before, zeros
        before the first token (as llama.cpp's own loop starts)."""
        hidden = self.target.hidden
        assert hidden is not None
        rows = np.empty((end - start, hidden.shape[1]), dtype=np.float32)
        if start == 0 and end > 0:
            rows[0] = 0.0
            rows[1:] = hidden[self.text.positions(0, end - 1)]
        else:
            rows[:] = hidden[self.text.positions(start - 1, end - 1)]
        return rows
