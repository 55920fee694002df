"""A lookup's acceptance by the length of the match its proposal follows: bands, their start, what they learn over
every text and share with the pair's other sequences."""

from __future__ import annotations

import pytest

from spec_cli.decoding.draft_length import PositionAcceptance
from spec_cli.drafting.matches import BANDS, FIRST_ROUNDS, MatchAcceptance, MatchPools, band


def test_a_match_falls_in_the_band_of_the_longest_n_gram_it_reaches() -> None:
    assert BANDS == (2, 4, 8)
    assert [band(m) for m in (0, 1, 2, 3, 4, 7, 8, 24)] == [2, 2, 2, 2, 4, 4, 8, 8]


def test_a_new_band_starts_from_every_proposals_acceptance_and_then_learns_its_own() -> None:
    every = PositionAcceptance(0.98)
    for _ in range(40):
        every.update(4, 1)
    matches = MatchAcceptance(0.98, MatchPools(0.995))
    long = matches.of(9, every)
    assert long is matches.of(16, every) and long is not matches.of(3, every)
    assert long.measured == pytest.approx(FIRST_ROUNDS) and long.expected_tokens(4) == pytest.approx(
        every.expected_tokens(4), rel=0.05)
    for _ in range(10):
        long.update(4, 4)
    assert long.expected_tokens(4) > 4.0 and matches.of(2, every).expected_tokens(4) < 2.5


def test_a_new_text_starts_each_band_from_what_it_kept_over_every_text_not_from_the_last_text() -> None:
    """A band whose proposals kept all on one text and none on the next starts a third from its acceptance over both,
    worth `FIRST_ROUNDS` rounds: kept as a share of the last text's, it read the second text's misses, mostly."""
    pools = MatchPools(0.995)
    matches = MatchAcceptance(1.0, pools)
    for kept in (4, 0):
        for _ in range(10 if kept else 3):
            matches.of(8, PositionAcceptance()).update(4, kept)
        matches.new_text()
    third = matches.of(8, PositionAcceptance())
    assert third.measured == pytest.approx(FIRST_ROUNDS)
    assert third.alpha == pytest.approx(pools.of(8).every.alpha) and third.alpha > 0.9  # 40 kept, 3 misses


def test_the_bands_of_a_pairs_sequences_learn_over_every_text_together() -> None:
    """A slot's bands add their rounds to the pair's acceptance over every text, which another slot's new band starts
    from: four slots at `--parallel 4` each learnt a quarter of the proposals, and read the same lookup at 0.02 to 0.89."""
    pair = MatchPools(0.995)
    first, second = (MatchAcceptance(1.0, MatchPools(0.995, shared=pair)) for _ in range(2))
    for _ in range(6):
        first.of(4, PositionAcceptance()).update(3, 3)
    assert pair.of(4).every.measured == pytest.approx(6.0, rel=0.05)
    fresh = second.of(5, PositionAcceptance())
    assert fresh.measured == pytest.approx(FIRST_ROUNDS) and fresh.expected_tokens(3) > 3.5
    assert second.of(2, PositionAcceptance()).measured == 0.0  # another band: nothing learnt there
