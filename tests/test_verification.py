"""The verification rules, checked exactly: every draft block and every outcome of the uniforms enumerated
on a tiny vocabulary, the round's output law compared with the target's."""

from __future__ import annotations

import itertools
from typing import Callable, Iterator

import numpy as np
import pytest

from spec_cli.decoding import sampling
from spec_cli.decoding.verification import (RULES, THRESHOLDS, Rule, Verdict, block_verification,
                                            gumbel_verification, token_thresholds, token_verification)

Prefix = tuple[int, ...]
Law = Callable[[Prefix], np.ndarray]


def drafts(q_of: Law, k: int, stops: Callable[[Prefix], bool]) -> Iterator[tuple[Prefix, float]]:
    """Every draft block the draft can make, with its probability; `stops` ends a block early."""
    def grow(prefix: Prefix, prob: float) -> Iterator[tuple[Prefix, float]]:
        if len(prefix) == k or (prefix and stops(prefix)):
            yield prefix, prob
            return
        q = q_of(prefix)
        for x in np.flatnonzero(q):
            yield from grow((*prefix, int(x)), prob * q[x])
    yield from grow((), 1.0)


def outcomes(rule: str | Rule, p: list[np.ndarray], q: list[np.ndarray],
             block: Prefix) -> Iterator[tuple[float, int, np.ndarray]]:
    """(probability, τ, next-token law) over the uniforms: only η_i ≤ h_i or not matters at each position, so
    one uniform inside and one outside each threshold stand for all of them. A rule given as a function
    is decided at token verification's thresholds."""
    verify = RULES[rule] if isinstance(rule, str) else rule
    thresholds = (THRESHOLDS[rule] if isinstance(rule, str) else token_thresholds)(p, q, block)
    for passes in itertools.product((True, False), repeat=len(block)):
        prob = float(np.prod([h if ok else 1 - h for h, ok in zip(thresholds, passes)]))
        if prob > 0:
            uniforms = [h / 2 if ok else (1 + h) / 2 for h, ok in zip(thresholds, passes)]
            verdict = verify(p, q, block, uniforms)
            yield prob, verdict.accepted, verdict.next_token


def round_law(rule: str | Rule, p_of: Law, q_of: Law, k: int,
              stops: Callable[[Prefix], bool] = lambda _prefix: False) -> tuple[dict[Prefix, float], float]:
    """The exact law of K + 1 tokens made by one round and then the target alone, and E[τ]."""
    law: dict[Prefix, float] = {}
    mean_accepted = 0.0

    def continue_with_target(prefix: Prefix, prob: float) -> None:
        if len(prefix) == k + 1:
            law[prefix] = law.get(prefix, 0.0) + prob
            return
        p = p_of(prefix)
        for x in np.flatnonzero(p):
            continue_with_target((*prefix, int(x)), prob * p[x])

    for block, q_prob in drafts(q_of, k, stops):
        p = [p_of(block[:i]) for i in range(len(block) + 1)]
        q = [q_of(block[:i]) for i in range(len(block))]
        for prob, tau, next_law in outcomes(rule, p, q, block):
            mean_accepted += q_prob * prob * tau
            for y in np.flatnonzero(next_law):
                continue_with_target((*block[:tau], int(y)), q_prob * prob * next_law[y])
    return law, mean_accepted


def target_law(p_of: Law, k: int) -> dict[Prefix, float]:
    law = {}
    for seq in itertools.product(range(p_of(()).size), repeat=k + 1):
        prob = float(np.prod([p_of(seq[:i])[seq[i]] for i in range(k + 1)]))
        if prob > 0:
            law[seq] = prob
    return law


def assert_same_law(actual: dict[Prefix, float], expected: dict[Prefix, float]) -> None:
    for seq in set(actual) | set(expected):
        assert actual.get(seq, 0.0) == pytest.approx(expected.get(seq, 0.0), abs=1e-12), seq


def random_law(seed: int, n_vocab: int, concentration: float, zeros: int = 0) -> Law:
    """A context-dependent law, fixed per prefix by the seed; `zeros` tokens get no mass (a filter's work)."""
    def law(prefix: Prefix) -> np.ndarray:
        rng = np.random.default_rng([seed, len(prefix), *prefix])
        probs = rng.dirichlet(np.full(n_vocab, concentration))
        probs[rng.permutation(n_vocab)[:zeros]] = 0.0
        return probs / probs.sum()
    return law


def one_hot_law(seed: int, n_vocab: int) -> Law:
    """An n-gram proposal: one deterministic token per prefix, q = 1 on it."""
    def law(prefix: Prefix) -> np.ndarray:
        probs = np.zeros(n_vocab)
        probs[np.random.default_rng([seed, len(prefix), *prefix]).integers(n_vocab)] = 1.0
        return probs
    return law


# The paper's example (Sun et al. 2025, section 3): context-free laws on {a, b}.
PAPER_P = np.array([1 / 3, 2 / 3])
PAPER_Q = np.array([2 / 3, 1 / 3])

CASES = {
    "paper example": (lambda _: PAPER_P, lambda _: PAPER_Q, 2),
    "hand-made, draft misses a token": (
        lambda prefix: np.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]])[len(prefix) % 3],
        lambda prefix: np.array([[0.7, 0.3, 0.0], [0.2, 0.5, 0.3], [0.0, 0.5, 0.5]])[len(prefix) % 3], 3),
    "random, 3 tokens": (random_law(1, 3, 1.0), random_law(2, 3, 1.0), 3),
    "random, 4 tokens, peaked": (random_law(3, 4, 0.3), random_law(4, 4, 0.3), 3),
    "target filters tokens the draft proposes": (random_law(5, 4, 1.0, zeros=2), random_law(6, 4, 1.0), 3),
    "draft equals target": (random_law(7, 3, 1.0), random_law(7, 3, 1.0), 3),
    "n-gram proposal (q one-hot)": (random_law(8, 3, 1.0), one_hot_law(9, 3), 3),
}


@pytest.mark.parametrize("rule", sorted(RULES))
@pytest.mark.parametrize("case", CASES)
def test_one_round_follows_the_target_exactly(rule: str, case: str) -> None:
    p_of, q_of, k = CASES[case]
    law, _ = round_law(rule, p_of, q_of, k)
    assert_same_law(law, target_law(p_of, k))


def on_support(law: Law) -> Callable[[Prefix], sampling.Law]:
    """The same law held on its support only, as the sampler's filters hand p and q to the rules."""
    def held(prefix: Prefix) -> sampling.Law:
        probs = law(prefix)
        support = np.flatnonzero(probs)
        return sampling.Law(probs[support], support, probs.size)
    return held


@pytest.mark.parametrize("rule", sorted(RULES))
@pytest.mark.parametrize("case", CASES)
def test_one_round_follows_the_target_exactly_with_laws_on_supports(rule: str, case: str) -> None:
    """The rules' sums and residuals over p's and q's supports (which need not match) are the dense ones."""
    p_of, q_of, k = CASES[case]
    law, _ = round_law(rule, on_support(p_of), on_support(q_of), k)
    assert_same_law(law, target_law(p_of, k))


@pytest.mark.parametrize("rule", sorted(RULES))
def test_exact_when_the_draft_stops_early(rule: str) -> None:
    """The confidence stop ends a block depending on the drafted tokens; the output law must not change."""
    p_of, q_of = random_law(10, 3, 0.6), random_law(11, 3, 0.6)
    law, _ = round_law(rule, p_of, q_of, 3, stops=lambda prefix: q_of(prefix).max() < 0.55)
    assert_same_law(law, target_law(p_of, 3))


@pytest.mark.parametrize("case", CASES)
def test_block_keeps_at_least_as_many_tokens_as_token_wise(case: str) -> None:
    p_of, q_of, k = CASES[case]
    _, token = round_law("token", p_of, q_of, k)
    _, block = round_law("block", p_of, q_of, k)
    assert block >= token - 1e-12


def test_block_gain_on_the_papers_example() -> None:
    """E[τ] for K = 2: 10/9 token by token, 11/9 with block verification (the paper's figures)."""
    assert round_law("token", *CASES["paper example"])[1] == pytest.approx(10 / 9)
    assert round_law("block", *CASES["paper example"])[1] == pytest.approx(11 / 9)


def test_block_can_keep_a_token_that_token_wise_rejects() -> None:
    """x_1 = a is under-weighted by the target (p/q = 1/2); a failed η_1 still keeps it when x_2 = b, which
    the target favours, passes: the block's weight is restored to 1."""
    p, q, block = [PAPER_P] * 3, [PAPER_Q] * 2, (0, 1)
    uniforms = [0.9, 0.1]
    assert token_verification(p, q, block, uniforms).accepted == 0
    assert block_verification(p, q, block, uniforms).accepted == 2


def test_a_wrong_rule_is_caught() -> None:
    """The check above can fail: drawing the correction from p instead of the residual is not exact."""
    def no_residual(p, q, block, uniforms) -> Verdict:
        verdict = token_verification(p, q, block, uniforms)
        return Verdict(verdict.accepted, p[verdict.accepted])
    p_of, q_of, k = CASES["random, 3 tokens"]
    law, _ = round_law(no_residual, p_of, q_of, k)
    with pytest.raises(AssertionError):
        assert_same_law(law, target_law(p_of, k))


def test_gumbel_verification_keeps_drafts_while_they_are_the_target_s_picks() -> None:
    """Row i's token is the pick of p_i at i; the first draft that is not it ends the round with the pick, and a
    block kept whole ends with p_{K+1}'s pick. The draft's q plays no part."""
    p = [np.full(8, 1 / 8)] * 4
    picks = [3, 5, 1, 6]
    rounds = {(3, 5, 1): (3, 6), (3, 5, 2): (2, 1), (4, 5, 1): (0, 3), (3,): (1, 5)}
    for draft, (kept, token) in rounds.items():
        verdict = gumbel_verification(p[:len(draft) + 1], list(draft), lambda law, i: picks[i])
        assert verdict.accepted == kept and sampling.Law.of(verdict.next_token)[token] == 1.0
