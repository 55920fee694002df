"""K for each sequence of one verify pass, chosen for the whole batch's goodput.

A pass over R rows costs c(R) (measured as the scheduler runs: `batch_costs.BatchCosts` by rows), each drafted token
d_i more, its drafter's step, and a round that drafts at all r_s once (its drafter's catch-up, or a block
drafter's pass: the cost shape its drafter declares). Sequence s, drafting K_s, emits
E_s(K_s) = 1 + Σ_{i≤K_s} a_{s,1}·…·a_{s,i} tokens on average (`draft_length.PositionAcceptance`). The step's host
work h (the loop's own, between passes) is paid whatever K. The pass's goodput is
G = Σ_s E_s(K_s) / (h + c(N + Σ_s K_s) + Σ_s (K_s·d_s + r_s)) (TurboSpec/SmartSpec, arXiv 2406.14066, measured
online). Work that grows with the tokens emitted (o a token) never moves the choice: a position worth g tokens for
c seconds joins a step of E tokens and C seconds where g·C > E·c, with or without o·(E + g) on both sides; h does,
as a dearer step makes more tokens a step worth more.

Starting from K = 0 everywhere (the batch without speculation), draft positions are added a move at a time, the
move with the most expected tokens per second of added cost first, while G grows: the next position of a
sequence is worth a_{s,1}·…·a_{s,K+1} tokens, which only falls as K grows, so each sequence's best draft
positions come first. A move adds to one sequence as many positions as make it worth most: what a round costs
once (r_s: a catch-up on what an idle drafter missed, a block's pass) and a step up in c(R) are weighed against
several positions, which one position alone seldom pays; a drafter whose catch-up does not pay within this pass
waits for a probe (`planner`). A
sequence the target seldom agrees with, or one whose drafter is dear, keeps K = 0; a busy batch, whose rows
cost more, gives fewer draft tokens to each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from spec_cli.decoding.batch_costs import BatchCosts


@dataclass(frozen=True)
class Candidate:
    """One sequence of the coming pass, drafting one way: g_1..g_cap, its chance of keeping each draft position, g_i =
    a_1·…·a_i (`gains`, `PositionAcceptance.gains`; cap = the most it may draft), `fixed` K when its request set one
    (None: the batch chooses), `step_s`, a draft token's seconds, and `round_s`, what a round that drafts at all
    costs once (`LoopCosts.step_costs`: the catch-up on the tokens its drafter did not see while idle, or a block
    drafter's pass), and `token_s`, what each token a round that drafts emits pays besides: an entry (a drafter's
    catch-up beyond a steady round's) spread over the tokens the answer may still emit, so that a round that drafts
    pays its share of it. `others`: the other ways it may draft instead (a drafter of several ways offers its
    preferred one and the others), each priced alike; the batch takes one."""

    gains: Sequence[float]
    fixed: int | None = None
    step_s: float = 0.0
    round_s: float = 0.0
    token_s: float = 0.0
    others: tuple[Candidate, ...] = ()

    def drafting_s(self, k: int) -> float:
        """The drafting seconds of k draft positions: k steps, and what the round costs once."""
        return k * self.step_s + (self.round_s if k else 0.0)

    @property
    def ways(self) -> tuple[Candidate, ...]:
        return (self, *self.others)


def choose(candidates: Sequence[Candidate], pass_costs: BatchCosts, host_s: float = 0.0,
           replan_s: float = 0.0) -> list[tuple[int, int]]:
    """(K, which of its ways) for each candidate: the fixed ones as asked (their first way), the others by goodput, a
    step costing `host_s` (h) besides its passes. A sequence's way is the one whose first positions pay best; its
    further positions are that way's. `replan_s`: what a step that drafts at all costs besides (the choice the next
    step then makes, where a step that drafts nothing is followed by steps that do not choose), paid once like a
    round's own cost.

    Passes of sizes not measured yet are priced by `BatchCosts.seconds`'s optimistic guess, which gets them
    tried; to keep one guess from drafting everything at once, a pass grows to at most twice the largest
    measured (before any, no sequence the batch chooses for drafts: that pass measures the batch alone).
    """
    ks = [c.fixed if c.fixed is not None else 0 for c in candidates]
    chosen = [0] * len(candidates)
    if not pass_costs.weight or all(c.fixed is not None for c in candidates):
        return list(zip(ks, chosen))
    gains = [[way.gains for way in c.ways] for c in candidates]
    expected = sum(1.0 + sum(g[0][:k]) for g, k in zip(gains, ks))
    rows = len(candidates) + sum(ks)
    most_rows = 2 * max(pass_costs.weight)
    reach = sum(max(map(len, g)) for c, g in zip(candidates, gains) if c.fixed is None)
    passes = pass_costs.prices(max(rows, min(most_rows, rows + reach)))  # c(R) for every R the pass may grow to
    seconds = host_s + passes[rows] + sum(c.drafting_s(k) for k, c in zip(ks, candidates))
    while rows < most_rows:
        best = _best_move(candidates, gains, ks, chosen, passes, rows, most_rows, 0.0 if any(ks) else replan_s)
        if best is None:
            break
        i, w, j, gain, cost = best
        if (expected + gain) / (seconds + cost) <= expected / seconds:
            break
        ks[i], chosen[i] = ks[i] + j, w
        rows, expected, seconds = rows + j, expected + gain, seconds + cost
    return list(zip(ks, chosen))


def _best_move(candidates: Sequence[Candidate], gains: list[list[list[float]]], ks: list[int], chosen: list[int],
               passes: list[float], rows: int, most_rows: int,
               once_s: float) -> tuple[int, int, int, float, float] | None:
    """The next draft positions to add, (sequence, its way, how many, E[tokens] they add, seconds they add): the most
    tokens per second of added cost. A sequence not drafting yet may take any of its ways; one drafting goes on
    with its own. A move takes as many positions as make it worth the most: what its way's round costs once
    (`round_s`, and `once_s` for the step's first drafts) and the pass's first extra rows may not pay for one position
    alone (llama.cpp decodes one row by another path than several: on a busy machine the demo target's 2-row pass
    cost 1.7x its 1-row pass and the 6-row pass little more, and a lookup's proposal the default had chosen, 3 tokens
    for 2 extra rows, was given none), nor may the row past a step up in c(R) later (the demo pair's planner book
    read 36.7 ms at 6 rows and 42.8 at 7: a position a move after the first kept a list at K = 5 where 12 paid
    more). `passes`: c(R) by R."""
    best, best_value = None, 0.0
    base, further = passes[rows], passes[rows + 1:]  # c(R) now, and for each row added
    for i, c in enumerate(candidates):
        if c.fixed is not None:
            continue
        k = ks[i]
        for w in range(len(c.ways)) if k == 0 else (chosen[i],):
            way, g = c.ways[w], gains[i][w]
            reach = min(len(g) - k, most_rows - rows)
            step_s, token_s, gain = way.step_s, way.token_s, 0.0
            once = way.round_s + token_s + once_s if k == 0 else 0.0  # what its first positions pay once
            # The planner's innermost loop: locals and one division a turn (a choice at four sequences: 98 -> 90 us).
            for j, (g_j, pass_s) in enumerate(zip(g[k:k + reach], further[:reach]), 1):
                gain += g_j
                cost = pass_s - base + j * step_s + once + gain * token_s
                value = gain / (cost if cost > 1e-9 else 1e-9)
                if value > best_value:
                    best, best_value = (i, w, j, gain, cost), value
    return best

