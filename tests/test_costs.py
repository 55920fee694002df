"""The loop's cost model: what a round costs from its drafter's cost shape, its catch-up, the target's pass, the
loop's own work and the context it follows, and the rate it yields."""

from __future__ import annotations

import pytest

from spec_cli.decoding.costs import HOST, PER_ROUND, PER_TOKEN, LoopCosts
from spec_cli.decoding.draft_length import PositionAcceptance


class Fixed:
    """An acceptance model with a given E[tokens](k) and P(all k accepted)."""

    def __init__(self, expected: float, all_accepted: float) -> None:
        self._expected, self._all = expected, all_accepted

    def expected_tokens(self, k: int) -> float:
        return self._expected if k else 1.0

    def all_accepted(self, k: int) -> float:
        return self._all if k else 1.0


def loop_costs(c1: float = 0.010, c2: float = 0.016, verify=lambda k: 0.040 + 0.004 * k,
               shape: str = "per token") -> LoopCosts:
    costs = LoopCosts(shape=shape)
    for k in (0, 2, 4, 6):
        costs.verify.record(k + 1, verify(k))  # c_v by rows: a round drafting k verifies k + 1
    costs.draft.record(1, c1)
    costs.draft.record(2, c2)
    return costs


def test_a_model_round_pays_k_steps_and_the_catch_up_of_a_full_acceptance() -> None:
    costs = loop_costs()
    acceptance = Fixed(expected=3.5, all_accepted=0.4)
    draft = 4 * 0.010 + 0.4 * (0.016 - 0.010)
    assert costs.draft_seconds(4, acceptance) == pytest.approx(draft)
    assert costs.round_seconds(4, acceptance) == pytest.approx(draft + 0.056)
    assert loop_costs(shape=HOST).round_seconds(4, acceptance) == pytest.approx(0.056)  # n-gram: host time only
    assert costs.rate(4, acceptance) == pytest.approx(3.5 / (draft + 0.056))
    assert costs.rate(0, acceptance) == pytest.approx(1 / 0.040)  # no draft: one target step


def test_a_catch_up_is_priced_as_the_first_draft_step_it_is() -> None:
    """A drafter that lacks n > 1 tokens feeds them with its first draft step, so K drafted tokens cost c_d(n) +
    (K − 1)·c_d(1): beyond K steps a round pays c_d(n) − c_d(1) once, as the steady round's price above does (priced
    as a step more, a fully accepted round's [d_K, bonus] made the planner give the draft model K = 0 where the
    default's regime priced it right and kept it, for the ~26 rounds to an answer's end)."""
    costs = loop_costs(c1=0.009, c2=0.014)
    costs.draft.record(40, 0.080)
    assert costs.step_costs(1) == (pytest.approx(0.009), 0.0)
    assert costs.step_costs(2) == pytest.approx((0.009, 0.005))
    assert costs.step_costs(40) == pytest.approx((0.009, 0.071))
    assert loop_costs(shape=HOST).step_costs(40) == (0.0, 0.0)


def test_a_book_whose_drafter_decodes_nothing_keeps_no_draft_steps() -> None:
    """The default's own book (a lookup's cost shape) is handed every round's steps, which its drafters' books keep:
    it keeps none of them, and its rounds still count the time outside their passes."""
    host, model = LoopCosts(shape=HOST), LoopCosts(shape=PER_TOKEN)
    for book in (host, model):
        book.record_round([(2, 0.014), (1, 0.009)], k=2, verify_s=0.030, round_s=0.060, emitted=3, context=100)
    assert not host.draft.weight and model.draft.seconds(2) == pytest.approx(0.014)
    assert host.per_token == model.per_token == pytest.approx(0.007 / 3)


def test_a_block_round_pays_one_pass_whatever_k() -> None:
    costs = loop_costs(c1=0.004, c2=0.006, shape=PER_ROUND)  # smaller passes cost less (`BatchCosts`' floor)
    costs.draft.record(5, 0.012)
    acceptance = Fixed(expected=3.5, all_accepted=0.4)
    assert costs.draft_seconds(4, acceptance) == pytest.approx(0.012)  # the pass over [last, 4 masks]
    assert costs.round_seconds(4, acceptance) == pytest.approx(0.012 + 0.056)


def test_the_loops_own_work_counts_per_token() -> None:
    costs = loop_costs(shape=HOST)
    costs.record_round([(1, 0.010), (1, 0.010)], k=2, verify_s=0.048, round_s=0.074, emitted=3)
    assert costs.per_token == pytest.approx(0.006 / 3)
    acceptance = Fixed(expected=2.5, all_accepted=0.5)
    assert costs.round_seconds(2, acceptance) == pytest.approx(costs.verify.seconds(3) + 2.5 * 0.002)


def test_where_the_pass_was_booked_by_its_runner_the_work_on_its_rows_is_priced_a_row() -> None:
    """A round whose verify pass the scheduler booked (c_v by rows, the pass alone) keeps the work on its rows (p, a
    grammar's masks) apart, and a round is priced with it a row: as it was when c_v held both."""
    costs = loop_costs(shape=HOST)
    costs.record_round([], 2, verify_s=0.030, round_s=0.036, emitted=3, pass_s=0.024)
    assert costs.per_row == pytest.approx(0.006 / 3) and costs.per_token == pytest.approx(0.006 / 3)
    acceptance = Fixed(expected=2.5, all_accepted=0.5)
    assert costs.round_seconds(2, acceptance) == pytest.approx(costs.verify.seconds(3) + 3 * 0.002 + 2.5 * 0.002)
    assert costs.round_seconds(0, acceptance) == pytest.approx(costs.verify.seconds(1) + 0.002 + 0.002)  # a plain round


def test_rate_is_unknown_until_the_costs_it_needs_are_measured() -> None:
    lookup, model = LoopCosts(shape=HOST), LoopCosts()
    model.verify = lookup.verify
    acceptance = PositionAcceptance()
    assert lookup.rate(3, acceptance) is None
    lookup.verify.record(4, 0.05)  # the pass over [last, d1..d3]
    assert lookup.rate(3, acceptance) == pytest.approx(4 / 0.05)  # optimistic: all accepted
    assert model.rate(3, acceptance) is None  # no draft step measured yet


def test_a_draft_step_is_priced_at_the_context_the_loop_is_at() -> None:
    costs = LoopCosts(decay=0.95)
    for context in range(50, 650):  # a step costs 7 ms near the start, 0.005 ms more a token of context
        costs.record_draft([(1, 0.007 + 0.000005 * context)], context)
    assert costs.draft_context.slope == pytest.approx(0.000005)
    costs.at(600)
    assert costs.step_costs(1) == (pytest.approx(0.010), 0.0)  # the book's latest steps, ~600 tokens in
    costs.at(100)  # a new, short prompt: the draft has not drafted since
    assert costs.step_costs(1) == (pytest.approx(0.0075, rel=0.01), 0.0)
    assert costs.draft_seconds(4, Fixed(3.0, 0.0)) == pytest.approx(4 * 0.0075, rel=0.01)


def test_a_context_slope_needs_contexts_that_spread() -> None:
    costs = LoopCosts(decay=0.95)
    for i in range(200):  # one short text: its contexts spread ~10 tokens, its noise says nothing of a slope
        costs.record_draft([(1, 0.007 + 0.001 * (i % 2))], 40 + i % 20)
    assert costs.draft_context.slope == 0.0
    rare = LoopCosts(decay=0.95)
    for context in range(0, 1000, 100):  # a drafter that seldom drafts: ten steps spread wide say little either
        rare.record_draft([(1, 0.007 + 0.00001 * context)], context)
    assert rare.draft_context.slope == 0.0
    costs.draft_context.prior = 0.000005  # a cost book's
    costs.at(1040)
    assert costs.step_costs(1)[0] == pytest.approx(0.0075 + 0.000005 * 1000, rel=0.01)


def test_a_context_slope_never_prices_a_step_below_half_its_mean() -> None:
    costs = LoopCosts(decay=0.95)
    for context in range(1000, 1400):
        costs.record_draft([(1, 0.001 + 0.00001 * context)], context)
    costs.at(0)
    assert costs.step_costs(1)[0] == pytest.approx(costs.draft.seconds(1) / 2)


def test_a_context_slope_kept_and_seeded() -> None:
    costs = LoopCosts(decay=0.95)
    for context in range(100, 400):
        costs.record_draft([(1, 0.007 + 0.000005 * context)], context)
    kept = costs.draft_context.as_dict()
    fresh = LoopCosts(decay=0.95)
    fresh.draft.seed(costs.draft.as_dict(), 8.0)
    fresh.draft_context.seed(kept, 8.0)
    fresh.at(100)
    assert fresh.draft_context.slope == pytest.approx(0.000005)
    assert fresh.step_costs(1)[0] == pytest.approx(0.0075, rel=0.02)


def test_the_peak_rate_is_climbed_to_from_any_k() -> None:
    """From below or above the best K, climbing one K at a time reaches the rate `best_k` finds over every K."""
    costs = LoopCosts()
    for k in range(17):
        costs.verify.record(k + 1, 0.020 + 0.002 * k)
    costs.draft.record(1, 0.004)
    costs.draft.record(2, 0.006)
    acceptance = PositionAcceptance()
    for _ in range(50):
        acceptance.update(16, 6)  # six of sixteen kept each round: the rate peaks at a middling K
    best = costs.best_k(acceptance, range(1, 17))
    assert best is not None and 1 < best < 16
    peak = costs.rate(best, acceptance)
    assert [costs.peak_rate(acceptance, k, 16) for k in (1, best, 16)] == pytest.approx([peak] * 3)
