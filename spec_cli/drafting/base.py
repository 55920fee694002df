"""What drafters with a memory of their own share: catching up on tokens they did not draft, a draft model's
KV cache, and drafting one decode at a time with the draft's law transformed exactly as the target's p."""

from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np

from spec_cli.decoding.constrained import constrained_greedy, constrained_probabilities
from spec_cli.decoding.costs import PER_TOKEN
from spec_cli.decoding.drafter import CatchUp, Draft, Drafter, DraftSteps, run_steps
from spec_cli.decoding.sampling import Law, SamplingParams, penalized, probabilities, sample
from spec_cli.drafting.window import DraftMemory
from spec_cli.llama.context import Context
from spec_cli.llama.grammar import Grammar


class CatchUpDrafter(Drafter):
    """A drafter with a memory of its own that catches up on the tokens it did not draft (a draft model, an
    MTP head): the hybrid weighs that backlog (`pending`), and a long one is taken in chunk by chunk between
    rounds (`catch_up`, over each drafter's `_feed`). Each drafted token is a step of its model."""

    cost_shape = PER_TOKEN

    def pending(self, tokens: Sequence[int]) -> int:
        raise NotImplementedError

    def catch_up(self, tokens: Sequence[int], chunk: int) -> CatchUp | None:
        if self.pending(tokens) <= chunk:
            return None
        steps = self._feed(tokens, chunk)
        return CatchUp(steps, self.pending(tokens))

    def _feed(self, tokens: Sequence[int], n: int) -> list[tuple[int, float]]:
        """Take in the next `n` tokens of the backlog (sure ones: the target has decoded them); return the decodes
        the cost model prices drafting with, (tokens fed, seconds) each."""
        raise NotImplementedError

    def narrow(self, tokens: Sequence[int]) -> None:
        """Make the catch-up on `tokens` the cheapest that drafts: the latest few only, where the memory can hold a
        window (a trial of a drafter whose costs are not known yet; `window`). By default nothing: the catch-up
        of a head fed with the target's states costs a fraction of its prefill anyway."""


class ContextDrafter(CatchUpDrafter):
    """What drafters on a draft model's own KV cache share: the time spent in llama.cpp, and what the cache holds
    of the sequence (`memory`, the pair's, kept across generations: a window of it where taking in all of it would
    cost more than β of the target's prefill of the same tokens; by default every token)."""

    def __init__(self, context: Context, p_min: float = 0.0, memory: DraftMemory | None = None) -> None:
        self.context = context
        self.clocks = (context,)
        self.p_min = p_min
        self.memory = memory if memory is not None else DraftMemory(context)

    def _step(self, i: int, fed: list[int]) -> np.ndarray:
        """Feed step i's tokens and return the logits of the next: the catch-up (step 0) is final, the draft's
        own tokens are speculative (`n_final`), so a memory that cannot cut them prepares to go back."""
        return self.context.decode(fed, 1, n_final=len(fed) if i == 0 else 0)[0]

    def start(self, tokens: Sequence[int]) -> None:
        """Keep what the cache holds of `tokens`; the catch-up decodes the rest (in chunks, or in the first round)."""
        self.memory.keep(tokens)


Choose = Callable[[Draft, np.ndarray, list[int]], "int | None"]


def draft_step_by_step(step: Callable[[int, list[int]], np.ndarray], catch_up: list[int], steps: int,
                       sampling: SamplingParams, recent: list[int], choose: Choose) -> Draft:
    """A round of a drafter that decodes one token at a time, at most `steps` decodes: `step(i, fed)` feeds
    step i's tokens (the catch-up first, then the token drafted last) and returns the logits of the next
    (`draft_steps` says the rest)."""
    return run_steps(draft_steps(catch_up, steps, sampling, recent, choose), step)


def draft_steps(catch_up: list[int], steps: int, sampling: SamplingParams, recent: list[int],
                choose: Choose) -> DraftSteps:
    """A round of at most `steps` decodes, one at a time: yields the tokens each feeds (the catch-up first,
    then the token drafted last) and is sent the logits of the next; `choose(draft, logits, recent)` adds what
    they draft to `draft` and returns the draft model's token to feed back, or None to end the round.
    `recent` counts the drafted tokens for the penalties, exactly as the target's p will. Each step's time
    (its decode and its choice) goes to the cost model."""
    draft = Draft()
    fed = catch_up
    for _ in range(steps):
        started = time.perf_counter()
        token = choose(draft, (yield fed), recent)
        draft.steps.append((len(fed), time.perf_counter() - started))
        if token is None:
            break
        recent = sampling.recent([*recent, token])
        fed = [token]
    return draft


def drafted_token(sampling: SamplingParams, rng: np.random.Generator, p_min: float,
                  grammar: Grammar | None = None) -> Choose:
    """The choice of a drafter on the target's vocabulary: the draft's own next token, with its q; under a
    grammar, from the masked law, with the grammar's state advanced past it."""
    def choose(draft: Draft, logits: np.ndarray, recent: list[int]) -> int | None:
        choice = next_draft_token(logits, sampling, recent, rng, p_min, grammar)
        if choice is None:
            return None
        token, q = choice
        draft.tokens.append(token)
        if q is not None:
            draft.q.append(q)
        if grammar is not None:
            grammar.accept(token)
        return token
    return choose


def next_draft_token(logits: np.ndarray, sampling: SamplingParams, recent: list[int], rng: np.random.Generator,
                      p_min: float, grammar: Grammar | None = None) -> tuple[int, Law | None] | None:
    """The drafted token and its q (None when greedy), or None when the confidence stop ends the draft: the
    most likely token has probability below `p_min` (under a grammar, greedy drafting measures the chosen
    token on the unmasked law: a lower bound of its masked probability). q goes through the same transforms
    as the target's p, the same grammar's mask included."""
    if sampling.greedy:
        z = penalized(logits, sampling, recent)
        token = int(np.argmax(z)) if grammar is None else constrained_greedy(logits, sampling, recent, grammar)
        if p_min > 0 and _probability_of(z, token) < p_min:
            return None
        return token, None
    q = (probabilities(logits, sampling, recent) if grammar is None
         else constrained_probabilities(logits, sampling, recent, grammar))
    if q.max() < p_min:
        return None
    return sample(q, rng), q


def _probability_of(logits: np.ndarray, token: int) -> float:
    """softmax(logits)[token]."""
    shifted = np.exp(logits - logits.max())
    return float(shifted[token] / shifted.sum())
