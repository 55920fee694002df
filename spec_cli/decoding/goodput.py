"""K for each sequence of one verify pass, chosen for the whole batch's goodput.

A pass over R rows costs c(R) (measured as the scheduler runs: `costs.BatchCosts` by rows), and each drafted
token d_i more, its drafter's step. Sequence s, drafting K_s, emits E_s(K_s) = 1 + Σ_{i≤K_s} a_{s,1}·…·a_{s,i}
tokens on average (`draft_length.PositionAcceptance`). The pass's goodput is
G = Σ_s E_s(K_s) / (c(N + Σ_s K_s) + Σ_s K_s·d_s) (TurboSpec/SmartSpec, arXiv 2406.14066, measured online).

Starting from K = 0 everywhere (the batch without speculation), draft positions are added one at a time, the
one with the most expected tokens per second of added cost first, while G grows: the next position of a
sequence is worth a_{s,1}·…·a_{s,K+1} tokens, which only falls as K grows, so each sequence's best draft
positions come first. A drafter that sat idle must first catch up on what it missed: its first position
costs that too, so it drafts again only when that pays within this pass (else a probe, `scheduler`). A
sequence the target seldom agrees with, or one whose drafter is dear, keeps K = 0; a busy batch, whose rows
cost more, gives fewer draft tokens to each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from spec_cli.decoding.costs import BatchCosts


@dataclass(frozen=True)
class Candidate:
    """One sequence of the coming pass: its position rates a_1..a_cap (`rates`, cap = the most it may draft),
    `fixed` K when its request set one (None: the batch chooses), `step_s`, a draft token's seconds, and
    `catch_up_s`, what its drafter must decode before it drafts again (the tokens it did not see while idle)."""

    rates: np.ndarray
    fixed: int | None = None
    step_s: float = 0.0
    catch_up_s: float = 0.0

    def drafting_s(self, k: int) -> float:
        """The drafting seconds of k draft positions: k steps, and the catch-up before the first."""
        return k * self.step_s + (self.catch_up_s if k else 0.0)

    def cost(self, k: int) -> float:
        """The drafting seconds the (k + 1)-th draft position adds."""
        return self.drafting_s(k + 1) - self.drafting_s(k)


def choose_ks(candidates: Sequence[Candidate], pass_costs: BatchCosts) -> list[int]:
    """K for each candidate: the fixed ones as asked, the others by goodput.

    Passes of sizes not measured yet are priced by `BatchCosts.seconds`'s optimistic guess, which gets them
    tried; to keep one guess from drafting everything at once, a pass grows to at most twice the largest
    measured (before any, no sequence the batch chooses for drafts: that pass measures the batch alone).
    """
    ks = [c.fixed if c.fixed is not None else 0 for c in candidates]
    if not pass_costs.weight or all(c.fixed is not None for c in candidates):
        return ks
    gains = [np.cumprod(c.rates) for c in candidates]
    expected = sum(1.0 + float(g[:k].sum()) for g, k in zip(gains, ks))
    rows = len(candidates) + sum(ks)
    seconds = _pass(pass_costs, rows) + sum(c.drafting_s(k) for k, c in zip(ks, candidates))
    most_rows = 2 * max(pass_costs.weight)
    while rows < most_rows:
        added = _pass(pass_costs, rows + 1) - _pass(pass_costs, rows)
        best, best_value = None, 0.0
        for i, (c, g) in enumerate(zip(candidates, gains)):
            if c.fixed is None and ks[i] < len(g):
                value = g[ks[i]] / max(added + c.cost(ks[i]), 1e-9)
                if value > best_value:
                    best, best_value = i, value
        if best is None:
            return ks
        gain, cost = float(gains[best][ks[best]]), added + candidates[best].cost(ks[best])
        if (expected + gain) / (seconds + cost) <= expected / seconds:
            return ks
        ks[best] += 1
        rows, expected, seconds = rows + 1, expected + gain, seconds + cost


    return ks


def _pass(costs: BatchCosts, rows: int) -> float:
    """c(rows), once some pass has been measured."""
    seconds = costs.seconds(rows)
    assert seconds is not None
    return seconds
