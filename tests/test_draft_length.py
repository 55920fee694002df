"""Fixed K, the warm-up of a drafter under auto before the planner prices it, and acceptance by position."""

from __future__ import annotations

from typing import Callable

import pytest

from spec_cli.decoding.costs import PER_TOKEN, LoopCosts
from spec_cli.decoding.draft_length import (TEXT_ROUNDS, AdaptiveK, FixedK, Pool, PositionAcceptance,
                                            expected_tokens)
from spec_cli.decoding.stats import Stats


def test_fixed_k_never_changes_but_learns_acceptance() -> None:
    fixed = FixedK(5)
    for accepted in (0, 0, 5):
        fixed.update(5, accepted)
    assert fixed.next_k() == 5 and fixed.k_max == 5
    reached = 1 + 0.98 + 0.98 ** 2  # older rounds weigh less
    alpha = 5 / (5 + 0.98 + 0.98 ** 2)  # 5 accepted tokens against the two rounds that ended in a rejection
    assert fixed.acceptance.alpha == pytest.approx(alpha)
    assert fixed.acceptance.rates(1)[0] == pytest.approx((1 + 3 * alpha) / (reached + 3))


def test_expected_tokens_formula() -> None:
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_acceptance_by_position() -> None:
    """Early positions always accepted, position 3 never: E stops growing at K = 2, unlike geometric α."""
    acceptance = PositionAcceptance(prior_weight=0.0)
    assert acceptance.expected_tokens(4) == 5.0  # optimistic before any round
    for _ in range(20):
        acceptance.update(4, 2)
    assert list(acceptance.rates(4)) == [1.0, 1.0, 0.0, acceptance.alpha]
    assert acceptance.expected_tokens(2) == pytest.approx(3.0)
    assert acceptance.expected_tokens(4) == pytest.approx(3.0)
    assert acceptance.all_accepted(2) == 1.0 and acceptance.all_accepted(3) == 0.0
    assert expected_tokens(acceptance.alpha, 4) > expected_tokens(acceptance.alpha, 2) + 0.3


def test_few_rounds_lean_on_the_overall_rate() -> None:
    """One early rejection at position 3 of 3 rounds is weak evidence: its rate is shrunk towards α̂."""
    acceptance = PositionAcceptance()
    for drafted, accepted in [(4, 2), (3, 3), (5, 5)]:
        acceptance.update(drafted, accepted)
    alpha = acceptance.alpha
    assert alpha == pytest.approx(10 / 11)
    assert acceptance.rates(3)[2] == pytest.approx((2 + 3 * alpha) / (3 + 3))
    assert acceptance.rates(3)[2] > 2 / 3


def test_a_capped_acceptance_weighs_at_most_so_many_rounds_at_the_same_rates() -> None:
    acceptance = PositionAcceptance()
    for accepted in (4, 2, 0, 3) * 5:
        acceptance.update(4, accepted)
    rates = acceptance.rates(4)
    acceptance.cap(2.0)
    assert acceptance.measured == pytest.approx(2.0)
    assert acceptance.alpha == pytest.approx(9 / 12)  # 45 accepted, 15 rejections, scaled alike
    few = PositionAcceptance()
    few.update(4, 1)
    few.cap(2.0)
    assert few.measured == 1.0 and rates != acceptance.rates(4)  # the prior (3 rounds at α̂) now weighs more


def test_counts_aged_lazily_are_the_decayed_counts_however_long_it_runs() -> None:
    # decay 0.5 brings the lazy scale past `batch_costs.RESCALE` after ~500 rounds: the counts come back to real rounds
    # there
    acceptance = PositionAcceptance(0.5)
    for _ in range(1200):
        acceptance.update(3, 1)  # reaches positions 1 and 2, keeps position 1
    steady = 1 / (1 - 0.5)  # Σ 0.5^i: every round's count, aged
    assert acceptance.reached == pytest.approx([steady, steady, 0.0])
    assert acceptance.accepted_at == pytest.approx([steady, 0.0, 0.0])
    assert acceptance.measured == pytest.approx(steady)
    assert acceptance.rates(2) == pytest.approx([(steady + 3 * 0.5) / (steady + 3), 1.5 / (steady + 3)])
    acceptance.forget(0.5)
    assert acceptance.reached == pytest.approx([steady / 2, steady / 2, 0.0])


def test_counts_from_stats_equal_the_running_counts() -> None:
    rounds = [(4, 4), (4, 1), (3, 3), (4, 0), (2, 1)]
    stats, running = Stats(draft_max=4), PositionAcceptance(prior_weight=0.0)
    for drafted, accepted in rounds:
        stats.record_round(drafted, accepted)
        running.update(drafted, accepted)
    counted = PositionAcceptance.from_counts(stats.reached_at, stats.accepted_at, stats.rejected_rounds)
    for k in range(1, 6):
        assert counted.expected_tokens(k) == pytest.approx(running.expected_tokens(k))
    assert counted.alpha == pytest.approx(running.alpha) == pytest.approx(9 / 12)


def fed_costs(draft_step: float, verify: Callable[[int], float], catch_up: float | None = None,
              shape: str = PER_TOKEN) -> LoopCosts:
    costs = LoopCosts(shape=shape)
    for k in range(0, 17, 2):
        costs.verify.record(k + 1, verify(k))  # by rows: K + 1
    costs.draft.record(1, draft_step)
    costs.draft.record(2, catch_up if catch_up is not None else draft_step)
    return costs


def feed(controller: AdaptiveK, rounds: list[tuple[int, int]]) -> None:
    for drafted, accepted in rounds:
        controller.update(drafted, accepted)


def test_warmup_follows_the_transformers_heuristic() -> None:
    controller = AdaptiveK(LoopCosts(), k_max=10, k_start=4, warmup_rounds=100)
    controller.update(4, 4)
    assert controller.next_k() == 6
    feed(controller, [(6, 6), (8, 8)])
    assert controller.next_k() == 10  # capped at k_max
    controller.update(10, 3)
    assert controller.next_k() == 9
    for _ in range(20):
        controller.update(controller.next_k(), 0)
    assert controller.next_k() == 1  # never below 1


def test_a_controller_is_priced_once_measured_or_seeded_from_a_book() -> None:
    """The planner prices a drafter's rounds once its acceptance is measured (warm-up rounds, or a cost book's counts
    where the book has the costs too); before, the warm-up's K tries it."""
    controller = AdaptiveK(fed_costs(0.01, lambda k: 0.04 + 0.004 * k), k_max=16, warmup_rounds=3)
    feed(controller, [(4, 4), (6, 2)])
    assert not controller.priced and controller.next_k() == 5
    controller.update(5, 5)
    assert controller.priced and controller.next_k() == 5  # the warm-up's K no longer moves
    controller.update(0, 0)  # a round the planner gave K = 0: nothing to learn
    assert controller.rounds == 3
    counts = controller.acceptance.as_counts()
    seeded, unpriced = AdaptiveK(fed_costs(0.01, lambda k: 0.04), k_max=16), AdaptiveK(LoopCosts(), k_max=16)
    seeded.seed(counts, 50.0)
    unpriced.seed(counts, 50.0)
    assert seeded.priced and not unpriced.priced


def test_a_new_text_starts_from_the_acceptance_pooled_over_every_text() -> None:
    """The pool takes every round its texts take; a new text starts from it, worth a few rounds, not from the last
    text's rate (a draft that kept little on one text was then priced as such on the next). Each text it drafted in
    for `TEXT_ROUNDS` rounds or more is kept apart too: the spread from text to text."""
    pool = Pool(decay=0.995)
    for _ in range(100):  # earlier texts: nearly every draft kept
        pool.update(4, 4)
    pool.new_text()
    text = FixedK(4)
    text.acceptance.pooled = pool
    for _ in range(30):  # the last text: the first draft rejected every round
        text.update(4, 0)
    assert text.acceptance.alpha < 0.05 and pool.every.measured == pytest.approx(sum(0.995 ** i for i in range(130)))
    assert 0.7 < pool.every.alpha < 0.95  # the last text is a part of the pool, not all of it
    pool.new_text()
    assert [(t.measured, t.alpha) for t in pool.texts] == [(100.0, 1.0), (30.0, 0.0)]
    for _ in range(TEXT_ROUNDS - 1):  # a text that drafted too little to say what it keeps
        pool.update(4, 4)
    pool.new_text()
    assert len(pool.texts) == 2 and pool.text.measured == 0.0
    text.acceptance.new_text(8.0)
    assert text.acceptance.alpha == pytest.approx(pool.every.alpha) and text.acceptance.measured == pytest.approx(8.0)
    every = pool.every
    shares = [accepted / reached for accepted, reached in zip(every.accepted_at, every.reached)]
    assert [a / r for a, r in zip(text.acceptance.accepted_at, text.acceptance.reached)] == pytest.approx(shares)
    alone = PositionAcceptance(decay=0.98)
    alone.update(4, 1)
    alone.new_text(8.0)  # no pool: what it learnt stands
    assert alone.alpha == pytest.approx(0.5) and alone.measured == 1.0
