"""Drafting with a small model that shares the target's token ids."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from spec_cli.decoding.drafter import Draft, DraftSteps, run_steps
from spec_cli.decoding.sampling import SamplingParams
from spec_cli.drafting.base import ContextDrafter, draft_steps, drafted_token
from spec_cli.llama.context import Context
from spec_cli.llama.grammar import Grammar


class ModelDrafter(ContextDrafter):
    """Drafts with a small model that shares the target's vocabulary, on its own KV cache.

    Confidence stop: drafting ends early once the draft's most likely next token has probability below
    `p_min`, since such a token is unlikely to be accepted and each draft step costs time. The stop depends
    only on the draft model, so exactness is untouched.
    """

    def propose(self, tokens: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator,
                grammar: Grammar | None = None) -> Draft:
        """Run the draft model k steps: catch up on the tokens it has not seen, then feed back its own.

        d_k itself is never fed back (nothing needs its logits), so after a fully accepted round the
        draft is one token behind; the next call's catch-up covers it. Penalties count the drafted tokens
        too, exactly as the target's p will.
        """
        return run_steps(self.stepped(tokens, k, sampling, rng, grammar)[1], self._step)

    def stepped(self, tokens: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator,
                grammar: Grammar | None = None) -> tuple[Context, DraftSteps]:
        return self.context, draft_steps(self.memory.backlog(tokens), k, sampling, sampling.recent(tokens),
                                         drafted_token(sampling, rng, self.p_min, grammar))

    def pending(self, tokens: Sequence[int]) -> int:
        """How many tokens the next proposal must feed before its first draft step (its catch-up, within the
        window its budget allows)."""
        return self.memory.lacking(tokens)

    def _feed(self, tokens: Sequence[int], n: int) -> list[tuple[int, float]]:
        return self.memory.feed(tokens, n)

    def narrow(self, tokens: Sequence[int]) -> None:
        self.memory.narrow(tokens)

    def rewind(self, n_keep: int) -> None:
        """What a snapshot restore takes back beyond `n_keep`, the next catch-up feeds again."""
        self.memory.rewind(n_keep)
