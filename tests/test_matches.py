"""A lookup's acceptance by the length of the match its proposal follows: bands, their start, their aging."""

from __future__ import annotations

import pytest

from spec_cli.decoding.draft_length import PositionAcceptance
from spec_cli.drafting.matches import BANDS, FIRST_ROUNDS, MatchAcceptance, band


def test_a_match_falls_in_the_band_of_the_longest_n_gram_it_reaches() -> None:
    assert BANDS == (2, 4, 8)
    assert [band(m) for m in (0, 1, 2, 3, 4, 7, 8, 24)] == [2, 2, 2, 2, 4, 4, 8, 8]


def test_a_new_band_starts_from_every_proposals_acceptance_and_then_learns_its_own() -> None:
    every = PositionAcceptance(0.98)
    for _ in range(40):
        every.update(4, 1)
    matches = MatchAcceptance(0.98)
    long = matches.of(9, every)
    assert long is matches.of(16, every) and long is not matches.of(3, every)
    assert long.measured == pytest.approx(FIRST_ROUNDS) and long.expected_tokens(4) == pytest.approx(
        every.expected_tokens(4), rel=0.05)
    for _ in range(10):
        long.update(4, 4)
    assert long.expected_tokens(4) > 4.0 and matches.of(2, every).expected_tokens(4) < 2.5


def test_a_new_text_keeps_a_share_of_what_each_band_learnt() -> None:
    matches = MatchAcceptance(1.0)
    for _ in range(10):
        matches.of(8, PositionAcceptance()).update(4, 4)
    matches.forget(0.3)
    assert matches.of(8, PositionAcceptance()).measured == pytest.approx(3.0)
