"""Suffix matching over token documents: the query a suffix tree answers, for drafting from what was written before.

SuffixDecoding (Oliaro et al., arXiv 2411.04975) keeps suffix trees over previous outputs with a count at each
node. To draft it finds the deepest node matching the sequence's last tokens (its match length m). Under that
node it follows the most frequent continuation while the product of the branches' empirical probabilities
stays above `MIN_PROB`, for at most α·m tokens (its adaptive length; α = `SPEC_FACTOR`). Less likely branches
are dropped.

`SuffixIndex` answers that query without building the tree. It keeps the tokens in one array (documents
separated by `END`) and an index from each n-gram (n in `KEYS`) to the positions that followed it. The
deepest node is the set of recent occurrences that share the longest suffix (up to `MAX_MATCH` tokens,
SuffixDecoding's tree depth). Its counts are the continuations read off those positions. The index is two NumPy
arrays (hashes sorted, and their positions) rebuilt in one sort; the tokens added since the last rebuild (at most
`REBUILD`) are scanned at each query, so appending is a copy and a query O(log N + REBUILD) in NumPy.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import numpy as np

END = -1  # between documents: no match or continuation crosses it
KEYS = (2, 4, 8)  # n-gram lengths indexed; the longest that matches gives the occurrences
MAX_MATCH = 24  # the longest suffix compared (SuffixDecoding's tree depth)
CANDIDATES = 64  # the most recent occurrences of the matched n-gram that are compared
SPEC_FACTOR = 1.0  # α: a match of m tokens drafts at most α·m (SuffixDecoding's max_spec_factor)
MIN_PROB = 0.1  # a path whose probability falls below this is not drafted further (its min_token_prob)
REBUILD = 4096  # tokens added before the NumPy index is rebuilt
_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)
_MULTIPLIER_INT, _MASK = int(_MULTIPLIER), (1 << 64) - 1


@dataclass(frozen=True)
class Match:
    """A drafted continuation: its tokens, the match length m it follows from, and its score, the expected
    number of its tokens that are right (the sum of the path's probabilities, SuffixDecoding's)."""

    tokens: list[int]
    length: int = 0
    score: float = 0.0


NO_MATCH = Match([])


class SuffixIndex:
    """Token documents and the index that finds where a sequence's suffix occurred before (see the module
    notes)."""

    def __init__(self, tokens: Sequence[int] = ()) -> None:
        self._reset(tokens)

    def _reset(self, tokens: Sequence[int]) -> None:
        """Hold `tokens` alone (indexed in NumPy where they are more than a scan's worth)."""
        self._array = np.full(max(1024, 2 * len(tokens)), END, dtype=np.int32)
        self._n = 0
        self._indexed = 0  # tokens[:_indexed] are in the NumPy index; those after it are scanned
        self._hashes: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.extend(tokens)

    def __len__(self) -> int:
        return self._n

    @property
    def tokens(self) -> np.ndarray:
        return self._array[:self._n]

    def add_document(self, tokens: Sequence[int]) -> None:
        """A new document, after an `END` that keeps matches from running into the last one."""
        if self._n and self._array[self._n - 1] != END:
            self.extend([END])
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append `tokens` to the last document: a copy, until the tokens since the last rebuild are more than
        `REBUILD` (a query scans them: `_scanned`)."""
        if not len(tokens):
            return
        start = self._n
        if start + len(tokens) > len(self._array):
            grown = np.full(max(2 * len(self._array), start + len(tokens)), END, dtype=np.int32)
            grown[:start] = self._array[:start]
            self._array = grown
        self._array[start:start + len(tokens)] = tokens
        self._n += len(tokens)
        if self._n - self._indexed > REBUILD:
            self._rebuild()

    def truncate(self, n: int) -> None:
        """Keep only the first `n` tokens (a sequence that went back)."""
        if n >= self._n:
            return
        if n < self._indexed:
            self._reset(self.tokens[:n].copy())
            return
        self._array[n:self._n] = END
        self._n = n

    def match(self, context: Sequence[int], k: int) -> Match:
        """The continuation to draft after `context` (at most k tokens): from the occurrences sharing its longest
        suffix, the most frequent path while its probability stays above `MIN_PROB`, for at most α·m tokens."""
        tail = list(context[-MAX_MATCH:])
        scanned = self._scanned(tail)
        occurrences: list[int] = []
        for n in reversed(KEYS):
            if n <= len(tail):
                occurrences = self._indexed_occurrences(tail[-n:]) + scanned.get(n, [])
                if occurrences:
                    break
        if not occurrences or k <= 0:
            return NO_MATCH
        starts = np.asarray(occurrences[-CANDIDATES:], dtype=np.int64)
        lengths = self._suffix_lengths(starts, tail)
        m = int(lengths.max())
        if m < KEYS[0]:  # a hash that collided
            return NO_MATCH
        return self._walk(starts[lengths == m], m, min(k, math.ceil(SPEC_FACTOR * m)))

    def _indexed_occurrences(self, gram: list[int]) -> list[int]:
        """The positions in the NumPy index that followed `gram`, oldest first."""
        if not self._indexed:
            return []
        hashes, positions = self._hashes[len(gram)]
        key = np.uint64(_gram_hash(gram))
        lo, hi = np.searchsorted(hashes, key, "left"), np.searchsorted(hashes, key, "right")
        return positions[lo:hi].tolist()

    def _scanned(self, tail: list[int]) -> dict[int, list[int]]:
        """For each n of `KEYS`, the positions after the NumPy index that followed the last n tokens of `tail`, oldest
        first: the tokens added since the last rebuild (at most `REBUILD`) compared with its last token, then the few
        that equal it with each token before, one n after another. An index of each n-gram in a dict, kept as tokens
        came, cost ~1 µs a token in Python: on a tiny model, where a lookup is made every ~100 steps, more than a
        plain step's share."""
        found: dict[int, list[int]] = {}
        first = max(self._indexed, 1)
        if first >= self._n or not tail:
            return found
        positions = (self._array[first - 1:self._n - 1] == tail[-1]).nonzero()[0] + first
        for back in range(1, min(len(tail), KEYS[-1]) + 1):
            if back > 1:
                if len(positions) and positions[0] < back:  # too near the start for this gram
                    positions = positions[positions >= back]
                positions = positions[self._array[positions - back] == tail[-back]]
            if not len(positions) or tail[-back] == END:  # no gram with an END in it is indexed
                break
            if back in KEYS:
                found[back] = positions.tolist()
        return found

    def _suffix_lengths(self, starts: np.ndarray, tail: list[int]) -> np.ndarray:
        """For each position, how many tokens before it equal the last tokens of `tail` (at most its length)."""
        back = np.arange(1, len(tail) + 1)
        before = starts[:, None] - back[None, :]
        seen = np.where(before >= 0, self._array[np.maximum(before, 0)], END - 1)
        same = seen == np.asarray(tail[::-1], dtype=np.int32)[None, :]
        return np.where(same.all(axis=1), len(tail), same.argmin(axis=1))

    def _walk(self, starts: np.ndarray, m: int, most: int) -> Match:
        """Follow the most frequent continuation of `starts` (documents that end count as branches; of equally
        frequent ones the smallest token, an end first). The occurrences' next tokens are read in one block and
        counted in Python: on a few dozen of them `np.unique` per drafted token was most of a lookup."""
        if len(starts) == 1:  # one occurrence: its continuation, to the end of its document
            run = self._array[int(starts[0]):min(int(starts[0]) + most, self._n)]
            stop = np.flatnonzero(run == END)
            tokens = run[:stop[0] if len(stop) else len(run)].tolist()
            return Match(tokens, m, float(len(tokens)))
        positions = starts[:, None] + np.arange(most)
        alive = np.where(positions < self._n, self._array[np.minimum(positions, self._n - 1)], END)
        tokens: list[int] = []
        probability, score = 1.0, 0.0
        for step in range(most):  # each row is one occurrence's continuation; the rows off the path drop out
            column = alive[:, step]
            counts = Counter(column.tolist())
            most_often = max(counts.values())
            top = min(token for token, count in counts.items() if count == most_often)
            if top == END:
                break
            probability *= most_often / len(alive)
            if probability < MIN_PROB:
                break
            score += probability
            tokens.append(top)
            alive = alive[column == top]
        return Match(tokens, m, score)

    def _rebuild(self) -> None:
        """Index every position in NumPy (one sort per n-gram length) and empty the dict."""
        tokens = self.tokens.astype(np.int64)
        self._hashes = {}
        for n in KEYS:
            if self._n <= n:
                self._hashes[n] = (np.zeros(0, np.uint64), np.zeros(0, np.int64))
                continue
            grams = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)  # gram i ends before position i + n
            valid = ~(grams == END).any(axis=1)
            positions = np.flatnonzero(valid) + n
            hashes = _hash(grams[valid])
            order = np.argsort(hashes, kind="stable")
            self._hashes[n] = (hashes[order], positions[order])
        self._recent = {}
        self._indexed = self._n


def _hash(grams: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each n-gram (the last axis); collisions only cost a comparison, which `match` makes
    anyway."""
    h = np.zeros(grams.shape[:-1], dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i in range(grams.shape[-1]):
            h = (h ^ grams[..., i].astype(np.uint64)) * _MULTIPLIER
    return h


def _gram_hash(gram: Sequence[int]) -> int:
    """`_hash` of one gram, in Python integers: a query hashes a gram of at most 8 tokens, where each NumPy
    operation on a scalar costs more than the whole loop here."""
    h = 0
    for token in gram:
        h = ((h ^ token) * _MULTIPLIER_INT) & _MASK
    return h
