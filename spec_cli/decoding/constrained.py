"""The laws under a grammar, llama.cpp's "grammar first": the sampler chain applied to the tokens the grammar
allows, every other token's logit −∞ before the penalties, top-k, top-p, min-p and the temperature.

p and q alike come from here (with each one's own grammar state), so speculation stays exact: a drafted
token the grammar forbids has p = 0, and a draft drawn from its masked q proposes none.

Asking the grammar about every token of a 150k vocabulary costs milliseconds, so it is asked about the
largest logits first (`_allowed_head`): greedy decoding needs the largest allowed one, top-k the k largest
allowed ones, and those lie among the largest logits whenever enough of those are allowed. Only top-k = 0
(every allowed token counts) or a grammar that forbids nearly all of the head reads the whole row, and that
mask is kept for the grammar's state (`Grammar.mask`): q and p at one position, and a position drafted
again after a rejection, pay for it once.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from spec_cli.decoding.sampling import Law, SamplingParams, penalized, probabilities
from spec_cli.errors import SpecError
from spec_cli.llama.grammar import Grammar

FIRST_HEAD = 64  # logits asked about first; each retry asks about 16 times as many, at last all


class NothingAllowed(SpecError):
    """The grammar allows no token of the vocabulary: it needs a character no token spells."""

    def __init__(self) -> None:
        super().__init__("the grammar allows no token of the target's vocabulary here: it asks for text that no "
                         "token can spell")


def constrained_greedy(logits: np.ndarray, params: SamplingParams, recent: Sequence[int], grammar: Grammar) -> int:
    """The most likely token after the penalties among those the grammar allows (the lowest id on a tie, as
    an argmax over the masked row)."""
    z = penalized(logits, params, recent)
    best = int(np.argmax(z))
    if grammar.allows(best):
        return best
    allowed = _allowed_head(z, grammar, 1)
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
    wanted = params.top_k if 0 < params.top_k < n else n
    allowed = _allowed_head(z, grammar, wanted)
    law = probabilities(z[allowed], replace(params, repeat_last_n=0))
    return Law(law.probs, allowed if law.tokens is None else allowed[law.tokens], n)


def _allowed_head(z: np.ndarray, grammar: Grammar, wanted: int) -> np.ndarray:
    """The allowed tokens among the largest logits of `z`, ascending: at least `wanted` of them, or every
    allowed token. A head holds every token tied with its smallest logit, so it holds the `wanted` largest
    allowed logits whenever it holds `wanted` allowed tokens."""
    n = z.size
    size = FIRST_HEAD if wanted < n and not grammar.mask_known else n
    while size < n:
        head = np.flatnonzero(z >= np.partition(z, -size)[-size])
        allowed = head[grammar.allowed(head)]
        if allowed.size >= wanted:
            break
        size *= 16
        if size > n // 4:  # a head of a quarter of the row costs a good part of the whole, which is kept
            size = n
    else:
        allowed = np.flatnonzero(grammar.mask())
    if not allowed.size:
        raise NothingAllowed()
    return allowed
