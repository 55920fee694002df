"""The K controller's decisions on synthetic acceptance and cost histories."""

from __future__ import annotations

import pytest

from spec_cli.draft_length import AdaptiveK, FixedK, expected_tokens


def test_fixed_k_never_changes() -> None:
    fixed = FixedK(5)
    fixed.update(5, 0, 0.1, 0.1)
    assert fixed.next_k() == 5 and fixed.k_max == 5


def test_expected_tokens_formula() -> None:
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_warmup_follows_the_transformers_heuristic() -> None:
    controller = AdaptiveK(k_max=10, k_start=4, warmup_rounds=100)
    controller.update(4, 4, 0.01, 0.02)
    assert controller.next_k() == 6
    controller.update(6, 6, 0.01, 0.02)
    controller.update(8, 8, 0.01, 0.02)
    assert controller.next_k() == 10  # capped at k_max
    controller.update(10, 3, 0.01, 0.02)
    assert controller.next_k() == 9
    for _ in range(20):
        controller.update(controller.next_k(), 0, 0.01, 0.02)
    assert controller.next_k() == 1  # never below 1


def feed(controller: AdaptiveK, alpha_accepts: list[tuple[int, int]], draft_step: float,
         verify: callable) -> None:
    for drafted, accepted in alpha_accepts:
        controller.update(drafted, accepted, drafted * draft_step, verify(drafted))


def test_high_acceptance_and_cheap_drafts_choose_long_drafts() -> None:
    controller = AdaptiveK(k_max=16, warmup_rounds=4)
    history = [(k, k) for k in (2, 4, 6, 8)] + [(8, 7), (8, 8), (8, 8), (8, 8)] * 5
    feed(controller, history, draft_step=0.001, verify=lambda k: 0.040 + 0.002 * (k + 1))
    assert controller.alpha > 0.9
    assert controller.next_k() >= 10


def test_low_acceptance_chooses_short_drafts() -> None:
    controller = AdaptiveK(k_max=16, warmup_rounds=4)
    history = [(4, 0), (3, 1), (2, 0), (4, 1)] * 6
    feed(controller, history, draft_step=0.010, verify=lambda k: 0.040 + 0.005 * (k + 1))
    assert controller.alpha == pytest.approx(2 / 6, abs=0.02)  # 2 accepted, 4 rejections per cycle
    assert controller.next_k() == 1


def test_expensive_drafts_shorten_k_at_the_same_acceptance() -> None:
    history = [(k, max(0, k - 1)) for k in (2, 3, 4, 5, 6)] * 6

    def best_k(draft_step: float) -> int:
        controller = AdaptiveK(k_max=16, warmup_rounds=4)
        feed(controller, history, draft_step=draft_step, verify=lambda k: 0.040 + 0.003 * (k + 1))
        return controller.next_k()

    assert best_k(0.030) < best_k(0.002)


def test_choice_maximises_the_modelled_rate() -> None:
    controller = AdaptiveK(k_max=12, warmup_rounds=2)
    feed(controller, [(3, 2), (5, 4), (4, 3), (6, 4)] * 5, draft_step=0.015,
         verify=lambda k: 0.041 + 0.004 * (k + 1))
    a, b = controller.verify_cost()
    assert a == pytest.approx(0.041, abs=1e-6) and b == pytest.approx(0.004, abs=1e-6)
    rates = {k: controller.expected_tokens(k) / (k * 0.015 + a + b * (k + 1)) for k in range(1, 13)}
    best = max(rates, key=rates.get)
    assert abs(controller.next_k() - best) <= 1  # it walks towards the best K, 2 at most a round


def test_per_position_acceptance_shapes_expected_tokens() -> None:
    """Early positions always accepted, position 3 never: E stops growing at K = 2, unlike geometric α."""
    controller = AdaptiveK(k_max=8, warmup_rounds=100)
    for _ in range(20):
        controller.update(4, 2, 0.04, 0.05)
    assert controller.expected_tokens(2) == pytest.approx(3.0, abs=0.01)
    assert controller.expected_tokens(4) == pytest.approx(controller.expected_tokens(2), abs=0.01)
    # A single α would instead promise more tokens from longer drafts.
    assert expected_tokens(controller.alpha, 4) > expected_tokens(controller.alpha, 2) + 0.3


def test_k_moves_at_most_two_a_round_after_warmup() -> None:
    controller = AdaptiveK(k_max=16, k_start=8, warmup_rounds=2)
    chosen = []
    for _ in range(12):
        k = controller.next_k()
        controller.update(k, 0, k * 0.05, 0.040 + 0.004 * (k + 1))  # expensive drafts, none accepted
        chosen.append(controller.next_k())
    steps = [abs(after - before) for before, after in zip(chosen[1:], chosen[2:])]
    assert max(steps) <= 2
    assert chosen[-1] == 1
