"""The cost model's fits: a weighted monotone fit (pool adjacent violators) and a weighted least-squares line."""

from __future__ import annotations

import pytest

from spec_cli.decoding.fits import monotone, weighted_line


def test_values_in_order_are_their_own_fit() -> None:
    values = [0.01, 0.02, 0.02, 0.05]
    assert monotone(values, [1.0, 2.0, 3.0, 4.0]) == values


def test_a_value_below_the_one_before_is_pooled_at_their_weighted_mean() -> None:
    assert monotone([1.0, 3.0, 2.0, 4.0], [1.0, 1.0, 1.0, 1.0]) == pytest.approx([1.0, 2.5, 2.5, 4.0])
    assert monotone([1.0, 3.0, 2.0, 4.0], [1.0, 1.0, 3.0, 1.0]) == pytest.approx([1.0, 2.25, 2.25, 4.0])


def test_a_pool_still_below_the_one_before_joins_it() -> None:
    """A spike of little weight spreads over the values after it until the pool no longer falls."""
    fitted = monotone([80.0, 189.0, 100.0, 100.0, 100.0], [5.0, 1.0, 1.0, 1.0, 1.0])
    assert fitted == pytest.approx([80.0, 122.25, 122.25, 122.25, 122.25])
    assert monotone([3.0, 2.0, 1.0], [1.0, 1.0, 1.0]) == pytest.approx([2.0, 2.0, 2.0])


def test_the_fit_is_the_nearest_non_decreasing_one_in_weighted_least_squares() -> None:
    """Against every non-decreasing sequence on a grid of values, none is nearer (a brute-force check, seed-free)."""
    from itertools import combinations_with_replacement

    values, weights = [2.0, 0.0, 3.0, 1.0], [1.0, 2.0, 1.0, 3.0]
    fitted = monotone(values, weights)
    assert fitted == sorted(fitted)

    def loss(fit: list[float]) -> float:
        return sum(w * (f - v) ** 2 for f, v, w in zip(fit, values, weights))

    grid = [i / 8 for i in range(0, 25)]
    assert all(loss(list(other)) >= loss(fitted) - 1e-12 for other in combinations_with_replacement(grid, 4))


def test_the_weighted_line_through_points() -> None:
    assert weighted_line({1: 0.010, 3: 0.020}, {1: 1.0, 3: 1.0}) == pytest.approx((0.005, 0.005))
    slope, intercept = weighted_line({1: 0.010, 2: 0.030, 3: 0.020}, {1: 1.0, 2: 0.0001, 3: 1.0})
    assert slope == pytest.approx(0.005, abs=1e-5) and intercept == pytest.approx(0.005, abs=1e-5)
