"""Ways of proposing draft tokens, behind one small interface.

A drafter sees the whole sequence so far (prompt + accepted output) and proposes up to K tokens, each with
the distribution q it was drawn from (None when drafting greedily), so the engine can run the acceptance
test min(1, p/q). A deterministic proposal (n-gram lookup) has q = 1 at its token, which keeps sampling
exact: the token is kept with probability p(x), and a rejection draws from norm(max(0, p − q)), that is p
without x. After verification the engine tells the drafter how much of the sequence is still valid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np

from spec_cli.llama import Context
from spec_cli.sampling import SamplingParams, one_hot, penalized, probabilities, sample


@dataclass
class Draft:
    """Proposed tokens d1..dK and, when sampling, the distributions q1..qK they were drawn from."""

    tokens: list[int] = field(default_factory=list)
    q: list[np.ndarray] = field(default_factory=list)


class Drafter(Protocol):
    busy_s: float
    """Seconds spent inside llama.cpp so far (0 for drafters without a model); for honest time splits."""
    rollback_s: float
    """The part of `busy_s` spent taking back rejected draft tokens (snapshots, restores)."""

    def prefill(self, tokens: Sequence[int]) -> None:
        """Take in a new prompt before the first round (work that would otherwise land in round one)."""

    def propose(self, tokens: Sequence[int], k: int, sampling: SamplingParams,
                rng: np.random.Generator) -> Draft:
        """Propose up to `k` tokens to follow `tokens`."""

    def rewind(self, n_keep: int) -> None:
        """Only the first `n_keep` tokens of the sequence last proposed from are still valid."""


class ModelDrafter:
    """Drafts with a small model that shares the target's vocabulary, on its own KV cache.

    Confidence stop: drafting ends early once the draft's most likely next token has probability below
    `p_min`, since such a token is unlikely to be accepted and each draft step costs time. The stop depends
    only on the draft model, so exactness is untouched.
    """

    def __init__(self, context: Context, p_min: float = 0.0) -> None:
        self.context = context
        self.p_min = p_min

    @property
    def busy_s(self) -> float:
        return self.context.busy_s

    @property
    def rollback_s(self) -> float:
        return self.context.rollback_s

    def prefill(self, tokens: Sequence[int]) -> None:
        self.context.prefill(tokens)

    def propose(self, tokens: Sequence[int], k: int, sampling: SamplingParams,
                rng: np.random.Generator) -> Draft:
        """Run the draft model k steps: catch up on the tokens it has not seen, then feed back its own.

        d_k itself is never fed back (nothing needs its logits), so after a fully accepted round the
        draft is one token behind; the next call's catch-up covers it. The catch-up is final; the draft's
        own tokens are speculative (`n_final`), so a memory that cannot cut them prepares to go back.
        Penalties count the drafted tokens too, exactly as the target's p will.
        """
        draft = Draft()
        pending = list(tokens[self.context.n_past:])
        recent = sampling.recent(tokens)
        for step in range(k):
            logits = self.context.decode(pending, 1, n_final=len(pending) if step == 0 else 0)[0]
            if sampling.greedy:
                z = penalized(logits, sampling, recent)
                token = int(np.argmax(z))
                if self.p_min > 0 and _top_probability(z) < self.p_min:
                    break
            else:
                q = probabilities(logits, sampling, recent)
                if q.max() < self.p_min:
                    break
                token = sample(q, rng)
                draft.q.append(q)
            draft.tokens.append(token)
            recent = sampling.recent([*recent, token])
            pending = [token]
        return draft

    def rewind(self, n_keep: int) -> None:
        """What a snapshot restore takes back beyond `n_keep`, the next catch-up feeds again."""
        self.context.trim(n_keep)


def _top_probability(logits: np.ndarray) -> float:
    """max softmax(logits), without normalising the whole vector twice."""
    shifted = np.exp(logits - logits.max())
    return float(1.0 / shifted.sum())


class NgramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the sequence's last n tokens and propose what
    followed it. No second model; it shines when the output copies its input (edits, rewrites, code).

    Tries n = n_max down to n_min, longest match first. An index of n-gram → latest end position is
    extended as the sequence grows, so a round costs O(new tokens), not O(sequence).
    """

    busy_s = 0.0
    rollback_s = 0.0

    def __init__(self, n_vocab: int, n_max: int = 4, n_min: int = 2) -> None:
        self.n_vocab = n_vocab
        self.n_max = n_max
        self.n_min = n_min
        self._tokens: list[int] = []
        self._index: dict[tuple[int, ...], int] = {}

    def prefill(self, tokens: Sequence[int]) -> None:
        self._tokens, self._index = [], {}
        self._extend(tokens)

    def propose(self, tokens: Sequence[int], k: int, sampling: SamplingParams,
                rng: np.random.Generator) -> Draft:
        self._extend(tokens)
        draft = Draft(tokens=self.lookup(k))
        if not sampling.greedy:
            draft.q = [one_hot(token, self.n_vocab) for token in draft.tokens]
        return draft

    def rewind(self, n_keep: int) -> None:
        if n_keep < len(self._tokens):
            self.prefill(self._tokens[:n_keep])

    def lookup(self, k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix."""
        tokens = self._tokens
        for n in range(min(self.n_max, len(tokens) - 1), self.n_min - 1, -1):
            end = self._index.get(tuple(tokens[-n:]))
            if end is not None:
                return tokens[end + 1:end + 1 + k]
        return []

    def _extend(self, tokens: Sequence[int]) -> None:
        """Index every n-gram that ends before the last token (so each indexed match has a continuation)."""
        start = len(self._tokens)
        self._tokens.extend(tokens[start:])
        for end in range(max(start - 1, 0), len(self._tokens) - 1):
            for n in range(self.n_min, self.n_max + 1):
                if end + 1 >= n:
                    self._index[tuple(self._tokens[end + 1 - n:end + 1])] = end


class HybridDrafter:
    """N-gram lookup when the sequence repeats itself, the draft model otherwise."""

    def __init__(self, ngram: NgramDrafter, model: ModelDrafter) -> None:
        self.ngram = ngram
        self.model = model

    @property
    def busy_s(self) -> float:
        return self.model.busy_s

    @property
    def rollback_s(self) -> float:
        return self.model.rollback_s

    def prefill(self, tokens: Sequence[int]) -> None:
        self.ngram.prefill(tokens)
        self.model.prefill(tokens)

    def propose(self, tokens: Sequence[int], k: int, sampling: SamplingParams,
                rng: np.random.Generator) -> Draft:
        draft = self.ngram.propose(tokens, k, sampling, rng)
        return draft if draft.tokens else self.model.propose(tokens, k, sampling, rng)

    def rewind(self, n_keep: int) -> None:
        self.ngram.rewind(n_keep)
        self.model.rewind(n_keep)
