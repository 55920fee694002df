"""Suffix matching: the longest suffix found, its continuation drafted by frequency for at most α·m tokens, and
the NumPy index answering as the incremental one does."""

from __future__ import annotations

import numpy as np
import pytest

from spec_cli.drafting import suffix
from spec_cli.drafting.suffix import MAX_MATCH, MIN_PROB, SuffixIndex


def test_the_continuation_of_the_longest_suffix_is_drafted() -> None:
    index = SuffixIndex([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    found = index.match([0, 2, 3, 4], k=8)
    assert found.tokens == [5, 6, 7] and found.length == 3  # α·m with α = 1 and m = 3


def test_the_draft_is_cut_at_k_and_at_the_end_of_its_document() -> None:
    index = SuffixIndex()
    index.add_document([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    index.add_document([20, 21])
    assert index.match([1, 2, 3, 4, 5, 6], k=2).tokens == [7, 8]
    assert index.match([7, 8, 9, 10, 11, 12, 20, 21], k=8).tokens == []  # no match crosses a document's end
    assert index.match([5, 6, 7, 8, 9, 10], k=8).tokens == [11, 12]


def test_a_longer_older_match_wins_over_a_shorter_recent_one() -> None:
    index = SuffixIndex([9, 1, 2, 3, 40, 41, 42, 0, 7, 2, 3, 50, 51, 52])
    assert index.match([8, 1, 2, 3], k=3).tokens == [40, 41, 42]
    assert index.match([8, 5, 2, 3], k=2).tokens in ([40, 41], [50, 51])


def test_the_most_frequent_branch_is_followed_while_likely_enough() -> None:
    # After [1, 2]: 7 three times and 8 once; after [1, 2, 7]: 9 twice and 5 once.
    index = SuffixIndex()
    for document in ([1, 2, 7, 9, 9], [1, 2, 7, 9, 9], [1, 2, 7, 5, 5], [1, 2, 8, 6, 6]):
        index.add_document(document)
    found = index.match([3, 1, 2], k=8)
    assert found.tokens == [7, 9]  # m = 2: at most two tokens
    assert found.score == pytest.approx(3 / 4 + 3 / 4 * 2 / 3)


def test_of_equally_frequent_branches_the_smallest_token_is_followed_and_an_end_first() -> None:
    index = SuffixIndex()
    for document in ([1, 2, 9, 4], [1, 2, 5, 4]):
        index.add_document(document)
    found = index.match([1, 2], k=2)
    assert found.tokens == [5, 4] and found.score == pytest.approx(0.5 + 0.5)
    ended = SuffixIndex()
    for document in ([1, 2], [1, 2, 5]):  # one occurrence's document ends where the other goes on
        ended.add_document(document)
    assert ended.match([1, 2], k=2).tokens == []


def test_an_unlikely_path_is_not_drafted() -> None:
    index = SuffixIndex()
    for tail in range(20):  # twenty different continuations of [1, 2, 3, 4]
        index.add_document([1, 2, 3, 4, 100 + tail, 200])
    found = index.match([1, 2, 3, 4], k=4)
    assert 1 / 20 < MIN_PROB and found.tokens == []


def test_appending_and_truncating_keep_the_index_right() -> None:
    index = SuffixIndex([5, 6, 7, 8])
    index.extend([5, 6])
    assert index.match(index.tokens.tolist(), k=2).tokens == [7, 8]
    index.truncate(4)
    assert len(index) == 4 and index.match([5, 6], k=2).tokens == [7, 8]


@pytest.mark.parametrize("kept", [700, 300])
def test_a_truncated_index_answers_as_a_fresh_one_of_the_tokens_kept(kept: int,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Going back within the tokens scanned since the last rebuild (700 of 1000, rebuilt at 512) or into the NumPy
    index (300) leaves an index that drafts as one built from the tokens kept."""
    monkeypatch.setattr(suffix, "REBUILD", 512)
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, 6, 1000).tolist()
    index = SuffixIndex()
    for i in range(0, len(tokens), 50):
        index.extend(tokens[i:i + 50])
    index.truncate(kept)
    fresh = SuffixIndex(tokens[:kept])
    assert index.tokens.tolist() == tokens[:kept]
    contexts = [rng.integers(0, 6, 12).tolist() for _ in range(200)]
    assert [index.match(c, k=6) for c in contexts] == [fresh.match(c, k=6) for c in contexts]
    assert sum(bool(fresh.match(c, k=6).tokens) for c in contexts) > 100


@pytest.mark.parametrize("vocabulary", [3, 40])
def test_the_numpy_index_answers_as_the_incremental_one(vocabulary: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same documents, indexed all at once in NumPy and appended a few tokens at a time (scanned, rebuilt
    every 512 tokens), give the same drafts for 300 random contexts; each draft is what followed the context's
    longest suffix somewhere."""
    rng = np.random.default_rng(7)
    documents = [rng.integers(0, vocabulary, rng.integers(20, 200)).tolist() for _ in range(40)]
    whole = SuffixIndex()
    for document in documents:
        whole.add_document(document)
    monkeypatch.setattr(suffix, "REBUILD", 512)
    grown = SuffixIndex()
    for document in documents:
        grown.add_document(document[:5])
        for i in range(5, len(document), 7):
            grown.extend(document[i:i + 7])
    flat = whole.tokens.tolist()
    assert grown.tokens.tolist() == flat
    drafted = 0
    for _ in range(300):
        context = rng.integers(0, vocabulary, 30).tolist()
        found = whole.match(context, k=6)
        assert found == grown.match(context, k=6)
        if found.tokens:
            drafted += 1
            m = found.length
            assert 2 <= m <= MAX_MATCH and len(found.tokens) <= m
            occurs = any(flat[p - m:p] == context[-m:] and flat[p:p + len(found.tokens)] == found.tokens
                         for p in range(m, len(flat)))
            assert occurs
    assert drafted > 100
