"""The K controller's decisions on synthetic acceptance and cost histories, and acceptance by position."""

from __future__ import annotations

from typing import Callable

import pytest

from spec_cli.decoding.costs import HOST, PER_TOKEN, PROBE_ROUNDS, PROBE_SHARE, LoopCosts
from spec_cli.decoding.draft_length import (AdaptiveK, FixedK, PositionAcceptance,
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
        costs.verify.record(k, verify(k))
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


def settle(costs: LoopCosts, rounds: list[tuple[int, int]]) -> int:
    controller = AdaptiveK(costs, k_max=16, warmup_rounds=4)
    feed(controller, rounds)
    return controller.next_k()


def test_high_acceptance_and_cheap_drafts_choose_long_drafts() -> None:
    costs = fed_costs(0.001, lambda k: 0.040 + 0.002 * (k + 1))
    assert settle(costs, [(k, k) for k in (2, 4, 6, 8)] + [(8, 7), (8, 8), (8, 8), (8, 8)] * 5) >= 10


def test_low_acceptance_chooses_short_drafts() -> None:
    costs = fed_costs(0.010, lambda k: 0.040 + 0.005 * (k + 1))
    assert settle(costs, [(4, 0), (3, 1), (2, 0), (4, 1)] * 6) == 1


def test_expensive_drafts_shorten_k_at_the_same_acceptance() -> None:
    history = [(k, max(0, k - 1)) for k in (2, 3, 4, 5, 6)] * 6
    verify = lambda k: 0.040 + 0.003 * (k + 1)  # noqa: E731
    cheap = settle(fed_costs(0.002, verify), history)
    assert settle(fed_costs(0.030, verify), history) < cheap
    assert settle(fed_costs(0.030, verify, shape=HOST), history) >= cheap  # n-gram drafts cost nothing


def test_choice_maximises_the_modelled_rate() -> None:
    costs = fed_costs(0.015, lambda k: 0.041 + 0.004 * (k + 1), catch_up=0.024)
    controller = AdaptiveK(costs, k_max=12, warmup_rounds=2)
    feed(controller, [(3, 2), (5, 4), (4, 3), (6, 4)] * 5)
    acceptance = controller.acceptance
    rates = {k: acceptance.expected_tokens(k) / (k * 0.015 + acceptance.all_accepted(k) * 0.009
                                                 + 0.041 + 0.004 * (k + 1)) for k in range(1, 13)}
    best = max(rates, key=rates.get)
    assert abs(controller.next_k() - best) <= 1  # it walks towards the best K, 2 at most a round


def test_k_moves_at_most_two_a_round_after_warmup() -> None:
    controller = AdaptiveK(fed_costs(0.05, lambda k: 0.040 + 0.004 * (k + 1)), k_max=16, k_start=8,
                           warmup_rounds=2)
    chosen = []
    for _ in range(12):
        controller.update(controller.next_k(), 0)  # expensive drafts, none accepted
        chosen.append(controller.next_k())
    steps = [abs(after - before) for before, after in zip(chosen[1:], chosen[2:])]
    assert max(steps) <= 2
    assert chosen[-1] == 0  # drafts that never pay: the target alone


def idle(controller: AdaptiveK, rounds: int) -> list[int]:
    """Run `rounds` rounds at the controller's K, none of whose drafts is kept; return the K of each."""
    ks = []
    for _ in range(rounds):
        ks.append(controller.next_k())
        controller.update(ks[-1], 0)
    return ks


def batched_catch_up(draft_step: float) -> LoopCosts:
    """Costs of a drafter that pays `draft_step` a token drafted and little more for a 64-token catch-up."""
    costs = fed_costs(draft_step, lambda k: 0.040 + 0.004 * (k + 1))
    costs.draft.record(64, 2 * draft_step)
    return costs


def test_an_idle_drafter_is_probed_less_and_less_while_probes_do_not_pay() -> None:
    controller = AdaptiveK(batched_catch_up(0.002), k_max=16, k_start=2, warmup_rounds=1)
    ks = idle(controller, 8 * PROBE_ROUNDS)
    first = ks.index(0)
    probes = [i for i, k in enumerate(ks) if i > first and k]
    assert probes[0] == first + PROBE_ROUNDS  # K = 1 once, after the idle rounds
    assert [b - a for a, b in zip(probes, probes[1:])] == [2 * PROBE_ROUNDS + 1, 4 * PROBE_ROUNDS + 1]
    assert all(k <= 1 for k in ks[first:])


def test_a_probe_that_pays_brings_drafting_back() -> None:
    controller = AdaptiveK(batched_catch_up(0.002), k_max=16, k_start=2, warmup_rounds=1)
    idle(controller, 20)
    assert controller.next_k() == 0
    for _ in range(PROBE_ROUNDS + 40):
        k = controller.next_k()
        controller.update(k, k)  # the text turned: every draft is kept
    assert controller.next_k() >= 3 and controller.probe_after == PROBE_ROUNDS


def test_a_probe_dearer_than_its_share_of_the_idle_time_is_not_made() -> None:
    """A drafter whose catch-up costs as much as the rounds it missed (one-token kernels) is not probed."""
    costs = fed_costs(0.050, lambda k: 0.040 + 0.004 * (k + 1))
    costs.draft.record(64, 64 * 0.050)
    controller = AdaptiveK(costs, k_max=16, k_start=1, warmup_rounds=1)
    assert set(idle(controller, 400)[3:]) == {0}
    assert controller.probe_price() > PROBE_SHARE * controller.idle * 0.044


def test_free_drafts_are_probed_for_the_price_of_a_row() -> None:
    controller = AdaptiveK(fed_costs(0.050, lambda k: 0.040 + 0.010 * (k + 1), shape=HOST), k_max=16, k_start=1,
                           warmup_rounds=1)
    ks = idle(controller, 2 + PROBE_ROUNDS)
    assert ks == [1] + [0] * PROBE_ROUNDS + [1] and controller.probe_price() == pytest.approx(0.010)
