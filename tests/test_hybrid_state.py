"""What the default drafting keeps across generations: the lookup's prior, the regimes' decayed rates."""

from __future__ import annotations

import pytest

from spec_cli.decoding.draft_length import FixedK
from spec_cli.drafting.hybrid_state import DecayedRate, HybridState


def test_the_lookup_starts_from_one_proposal_of_two_kept_not_from_all() -> None:
    """Before any proposal the lookup's acceptance is the prior `LOOKUP_PRIOR` (a_1 = α̂ = 0.5, two rounds' worth), not
    the 1 of an acceptance never measured: a first 3-token proposal is priced at 1 + 0.5 + 0.25 + 0.125 tokens, not 4,
    in every band of match; rounds that keep all soon outweigh it."""
    state = HybridState({"ngram": FixedK(8)})
    assert state.lengths["ngram"].acceptance.measured == 2.0
    for match in (2, 4, 8):
        assert state.lookup_acceptance(match).expected_tokens(3) == pytest.approx(1.875)
    for _ in range(2):
        state.lengths["ngram"].acceptance.update(3, 3)
    assert state.lengths["ngram"].acceptance.rates(1)[0] > 0.75


def test_rounds_added_at_once_are_the_same_rounds_added_one_by_one() -> None:
    one_by_one, at_once = DecayedRate(3.0, 0.1), DecayedRate(3.0, 0.1)
    for _ in range(5):
        one_by_one.add(2.0, 0.05, 0.8)
    at_once.add(2.0, 0.05, 0.8, rounds=5)
    assert (at_once.tokens, at_once.seconds) == pytest.approx((one_by_one.tokens, one_by_one.seconds))
