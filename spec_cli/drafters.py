"""Ways of proposing draft tokens, behind one small interface.

A drafter sees the whole sequence so far (prompt + accepted output) and proposes up to K tokens, each with
the distribution q it was drawn from (None when drafting greedily), so the engine can run the acceptance
test min(1, p/q). After verification the engine tells it how much of the sequence is still valid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np

from spec_cli.llama import Context
from spec_cli.sampling import SamplingParams, probabilities, sample


@dataclass
class Draft:
    """Proposed tokens d1..dK and, when sampling, the distributions q1..qK they were drawn from."""

    tokens: list[int] = field(default_factory=list)
    q: list[np.ndarray] = field(default_factory=list)


class Drafter(Protocol):
    busy_s: float
    """Seconds spent inside llama.cpp so far (0 for drafters without a model); for honest time splits."""

    def prefill(self, tokens: Sequence[int]) -> None:
        """Process a prompt ahead of the first round (work that would otherwise land in round one)."""

    def propose(self, tokens: Sequence[int], k: int, sampling: SamplingParams,
                rng: np.random.Generator) -> Draft:
        """Propose up to `k` tokens to follow `tokens`."""

    def rewind(self, n_keep: int) -> None:
        """Only the first `n_keep` tokens of the sequence last proposed from are still valid."""


class ModelDrafter:
    """Drafts with a small model that shares the target's vocabulary, on its own KV cache."""

    def __init__(self, context: Context) -> None:
        self.context = context

    @property
    def busy_s(self) -> float:
        return self.context.busy_s

    def prefill(self, tokens: Sequence[int]) -> None:
        self.context.prefill(tokens)

    def propose(self, tokens: Sequence[int], k: int, sampling: SamplingParams,
                rng: np.random.Generator) -> Draft:
        """Run the draft model k steps: catch up on the tokens it has not seen, then feed back its own.

        d_k itself is never fed back (nothing needs its logits), so after a fully accepted round the
        draft is one token behind; the next call's catch-up covers it.
        """
        draft = Draft()
        pending = list(tokens[self.context.n_past:])
        for _ in range(k):
            logits = self.context.decode(pending, 1)[0]
            if sampling.greedy:
                token = int(np.argmax(logits))
            else:
                q = probabilities(logits, sampling)
                token = sample(q, rng)
                draft.q.append(q)
            draft.tokens.append(token)
            pending = [token]
        return draft

    def rewind(self, n_keep: int) -> None:
        self.context.trim(min(n_keep, self.context.n_past))

