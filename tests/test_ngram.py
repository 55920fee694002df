"""The n-gram drafter's matching on hand-made sequences, and its q for sampling."""

from __future__ import annotations


import numpy as np

from spec_cli.decoding.sampling import SamplingParams
from spec_cli.drafting.ngram import NgramDrafter

GREEDY = SamplingParams()


def propose(tokens: list[int], k: int, n_max: int = 4, n_min: int = 2) -> list[int]:
    drafter = NgramDrafter(n_vocab=100, n_max=n_max, n_min=n_min)
    drafter.prefill(tokens[:1])
    return drafter.propose(tokens, k, GREEDY, np.random.default_rng(0)).tokens


def test_proposes_what_followed_the_earlier_occurrence() -> None:
    assert propose([1, 2, 3, 4, 5, 6, 9, 2, 3], k=3) == [4, 5, 6]


def test_continuation_is_cut_at_k_and_at_the_sequence_end() -> None:
    assert propose([1, 2, 3, 4, 5, 6, 9, 2, 3], k=2) == [4, 5]
    assert propose([7, 8, 7, 8], k=5) == [7, 8]


def test_latest_occurrence_wins() -> None:
    assert propose([1, 2, 10, 1, 2, 20, 1, 2], k=1) == [20]


def test_longest_suffix_match_wins_over_a_later_shorter_one() -> None:
    # Suffix [5, 1, 2] occurs once (followed by 30); [1, 2] alone occurs later (followed by 40).
    assert propose([5, 1, 2, 30, 7, 1, 2, 40, 5, 1, 2], k=1) == [30]


def test_no_match_proposes_nothing() -> None:
    assert propose([1, 2, 3, 4, 5], k=4) == []
    assert propose([1, 2, 3, 1], k=4) == []  # a 1-gram match is below n_min


def test_incremental_index_equals_a_fresh_one() -> None:
    sequence = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 1, 4, 1, 5]
    growing = NgramDrafter(n_vocab=10)
    growing.prefill(sequence[:3])
    for end in range(4, len(sequence) + 1):
        grown = growing.propose(sequence[:end], 5, GREEDY, np.random.default_rng(0)).tokens
        assert grown == propose(sequence[:end], 5)


def test_rewind_forgets_dropped_tokens() -> None:
    drafter = NgramDrafter(n_vocab=100)
    drafter.prefill([1, 2, 3, 9, 1, 2, 7])
    drafter.rewind(6)  # the 7 was rejected: [1, 2] must point at its first occurrence again
    assert drafter.propose([1, 2, 3, 9, 1, 2], 2, GREEDY, np.random.default_rng(0)).tokens == [3, 9]


def test_sampling_proposals_carry_one_hot_q() -> None:
    drafter = NgramDrafter(n_vocab=50)
    drafter.prefill([1, 2, 3, 1, 2])
    draft = drafter.propose([1, 2, 3, 1, 2], 2, SamplingParams(temperature=1.0), np.random.default_rng(0))
    assert draft.tokens == [3, 1]
    assert len(draft.q) == 2
    for token, q in zip(draft.tokens, draft.q):
        dense = np.asarray(q)
        assert dense.shape == (50,) and dense[token] == 1.0 and dense.sum() == 1.0
