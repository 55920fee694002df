"""How figures and statistics are written for people."""

from __future__ import annotations

import pytest

from spec_cli.summary import percent


@pytest.mark.parametrize("rate, digits, text", [
    (2498 / 2507, 0, "99.6%"),   # rounds to 100% at 0 decimals: one more is shown
    (0.9999, 0, "99.99%"),
    (1.0, 0, "100%"),
    (0.004, 0, "0.4%"),          # nor does a partial figure read as nothing
    (0.0, 0, "0%"),
    (0.94, 0, "94%"),
    (0.0004, 1, "0.04%"),
    (0.251, 1, "25.1%"),
])
def test_percentages_never_round_a_partial_figure_to_all_or_nothing(rate: float, digits: int, text: str) -> None:
    assert percent(rate, digits) == text
