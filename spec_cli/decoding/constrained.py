"""The laws under a grammar, llama.cpp's "grammar first": the sampler chain applied to the tokens the grammar
allows, every other token's logit −∞ before the penalties, top-k, top-p, min-p and the temperature.

p and q alike come from here (with each one's own grammar state), so speculation stays exact: a drafted
token the grammar forbids has p = 0, and a draft drawn from its masked q proposes none.

The mask is the whole vocabulary's (llguidance computes one in tens of µs, `llama.grammar`), kept for the
grammar's state: q and p at one position, and a position drafted again after a rejection, pay for it once.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from spec_cli.decoding.sampling import Law, SamplingParams, penalized, probabilities
from spec_cli.llama.grammar import Grammar, GrammarError


class NothingAllowed(GrammarError):
    """The grammar allows no token of the vocabulary: it needs a character no token spells."""

    def __init__(self) -> None:
        super().__init__("allows no token of the target's vocabulary here: it asks for text that no token can "
                         "spell")


def constrained_greedy(logits: np.ndarray, params: SamplingParams, recent: Sequence[int], grammar: Grammar) -> int:
    """The most likely token after the penalties among those the grammar allows (the lowest id on a tie, as
    an argmax over the masked row)."""
    z = penalized(logits, params, recent)
    best = int(np.argmax(z))
    if grammar.allows(best):  # mostly: no list of the allowed ids is needed
        return best
    allowed = _allowed(grammar)
    return int(allowed[np.argmax(z[allowed])])


def constrained_probabilities(logits: np.ndarray, params: SamplingParams, recent: Sequence[int],
                              grammar: Grammar) -> Law:
    """`probabilities` of the row with every token the grammar forbids at −∞.

    The chain runs on the allowed tokens' logits alone (penalties first, as they read the whole row's ids),
    and the law is mapped back to the vocabulary's ids: top-k needs the k largest allowed logits, the other
    filters and the temperature see only what top-k kept, as in `probabilities`."""
    n = logits.size
    if params.greedy:
        return Law.one_hot(constrained_greedy(logits, params, recent, grammar), n)
    z = penalized(logits, params, recent)
    allowed = _allowed(grammar)
    law = probabilities(z[allowed], replace(params, repeat_last_n=0))
    return Law(law.probs, allowed if law.tokens is None else allowed[law.tokens], n)


def _allowed(grammar: Grammar) -> np.ndarray:
    """The tokens the grammar allows next, ascending."""
    allowed = grammar.allowed_tokens()
    if not allowed.size:
        raise NothingAllowed()
    return allowed
