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

An image in the prompt has no token to pair: the head reads the text around it (as a text-only draft does),
each text token paired with the target's state at the text token before it, which has seen the image. Only
the pairs change; every draft is verified as ever.
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
        self._start: list[int] = []  # the sequence's tokens before the head's first pair
        # Positions below are those of the sequence's text (its images left out): where the prompt held images,
        # the sequence position of each of its text tokens, how many image ids it held, and the prompt itself.
        self._text_at: np.ndarray | None = None
        self._images = 0
        self._prompt: list[int] = []

    @staticmethod
    def _check(target: Context) -> None:
        """Refuse a target context that does not keep the states `_states` reads."""
        if target.hidden is None:
            raise ValueError("the target context must keep its hidden states (hidden_states=True)")

    @property
    def busy_s(self) -> float:
        return self.head.busy_s

    def prefill(self, tokens: Sequence[int]) -> list[tuple[int, float]]:
        """Pair the prompt's tokens (all but its last, which the target has decoded) with their states, keeping
        what the head already holds of them (up to the first image that differs: the states after it do)."""
        held = self._held()
        self._see(tokens)
        self.head.trim(max(self._text_length(common_prefix(held, tokens)) - self.first, 0))
        text = self._text(tokens, 0)
        self._start = text[:self.first]
        started = time.perf_counter()
        start = self.head.n_past + self.first
        fed = len(text) - start
        if fed > 0:
            self.head.decode(text[start:], self._states(start, len(text)), 0)
        return [(fed, time.perf_counter() - started)] if fed > 0 else []

    def _held(self) -> list[int]:
        """The sequence (images included) whose text the head holds pairs of."""
        if not self.head.n_past:
            return []
        text = [*self._start, *self.head.tokens]
        if self._text_at is None:
            return text
        n = len(self._text_at)
        return self._prompt[:self._text_at[len(text) - 1] + 1] if len(text) <= n else [*self._prompt, *text[n:]]

    def _see(self, prompt: Sequence[int]) -> None:
        """Where the prompt's images are, for the positions of its text."""
        text_at = np.flatnonzero(np.asarray(prompt) >= 0) if prompt and min(prompt) < 0 else None
        self._text_at, self._images = text_at, 0 if text_at is None else len(prompt) - len(text_at)
        self._prompt = list(prompt) if text_at is not None else []

    def _text_length(self, n: int) -> int:
        """How many text tokens the first `n` of the sequence (the prompt, then what followed it) hold."""
        if self._text_at is None:
            return n
        return int(np.searchsorted(self._text_at, n)) if n <= len(self._prompt) else n - self._images

    def _text(self, tokens: Sequence[int], start: int) -> list[int]:
        """The sequence's text tokens from the `start`-th on."""
        if self._text_at is None:
            return list(tokens[start:])
        n = len(self._text_at)
        return [tokens[i] for i in self._text_at[start:]] + list(tokens[max(start, n) + self._images:])

    def _positions(self, start: int, end: int) -> np.ndarray | slice:
        """The sequence positions of text tokens [start, end)."""
        if self._text_at is None:
            return slice(start, end)
        n = len(self._text_at)
        at = np.arange(start, end)
        return np.where(at < n, self._text_at[np.minimum(at, n - 1)], at + self._images)

    def pending(self, tokens: Sequence[int]) -> int:
        """How many pairs the next proposal feeds before its first draft step (its catch-up)."""
        return self._text_length(len(tokens)) - self.head.n_past - self.first

    def propose(self, tokens: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator,
                grammar: Grammar | None = None) -> Draft:
        """Up to k tokens after `tokens`: catch up to the last token with the target's states, then feed back
        the head's own. Penalties count the drafted tokens, as the target's p will."""
        n, start = self._text_length(len(tokens)), self.head.n_past + self.first
        hidden: np.ndarray | None = None

        def step(i: int, fed: list[int]) -> np.ndarray:
            nonlocal hidden
            states = self._states(start, n) if i == 0 else hidden
            logits, hidden = self.head.decode(fed, states, 1)  # the next step pairs its token with this h'
            return logits[0]

        draft = draft_step_by_step(step, self._text(tokens, start), k, sampling, sampling.recent(tokens),
                                   drafted_token(sampling, rng, self.p_min, grammar))
        self.head.trim(n - self.first)  # the pairs of drafted tokens hold the head's h', never the target's
        return draft

    def rewind(self, n_keep: int) -> None:
        self.head.trim(max(self._text_length(n_keep) - self.first, 0))

    def _states(self, start: int, end: int) -> np.ndarray:
        """h_{p-1} for text tokens p in [start, end): the target's hidden states at the text token before, zeros
        before the first token (as llama.cpp's own loop starts)."""
        hidden = self.target.hidden
        assert hidden is not None
        rows = np.empty((end - start, hidden.shape[1]), dtype=np.float32)
        if start == 0 and end > 0:
            rows[0] = 0.0
            rows[1:] = hidden[self._positions(0, end - 1)]
        else:
            rows[:] = hidden[self._positions(start - 1, end - 1)]
        return rows
