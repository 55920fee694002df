"""One row's speed over the best of several others, without the best one's luck.

The best of several rows measured with noise reads high by its noise alone (of eight rows equally fast, each ±3%, the
best reads ~4% above them), and a ratio to it charges that to the row compared. Cross-fitting takes it out: the best
is chosen on the runs of the even rounds and the ratio read on the odd rounds', and the other way about, the two
averaged. Each row's runs come in rounds, every row running each round alike (the same prompts, interleaved).

A run may be left out (None): one whose text is not the others' (`speedup`: greedy texts parted at a float tie) is
another workload, so each ratio is read over the runs both rows kept, and the best is chosen on each row's own.
"""

from __future__ import annotations

import statistics
from typing import Sequence

Rounds = Sequence[Sequence[float | None]]  # a row's tokens/s, run by run, round by round (None: left out)


def held_out_ratio(row: Rounds, others: Sequence[Rounds]) -> float | None:
    """`row`'s median tokens/s over the best of `others`' (chosen on one half of the rounds, read on the other, over
    the runs both kept), averaged over both halves; None with fewer than two rounds, or no runs to read."""
    if len(row) < 2 or not others:
        return None
    ratios = []
    for half in (0, 1):
        scored = [(median, other) for other in others if (median := _median(_half(other, half))) is not None]
        if not scored:
            continue
        chosen = max(scored, key=lambda scored_other: scored_other[0])[1]
        ratio = paired_ratio(_half(row, 1 - half), _half(chosen, 1 - half))
        if ratio is not None:
            ratios.append(ratio)
    return statistics.mean(ratios) if ratios else None


def paired_ratio(row: Sequence[float | None], other: Sequence[float | None]) -> float | None:
    """`row`'s median over `other`'s, run for run, over the runs both kept (None where they kept none in common)."""
    pairs = [(mine, theirs) for mine, theirs in zip(row, other) if mine is not None and theirs is not None]
    if not pairs:
        return None
    return statistics.median(mine for mine, _ in pairs) / statistics.median(theirs for _, theirs in pairs)


def _half(rounds: Rounds, half: int) -> list[float | None]:
    """The runs of the even rounds (`half` 0) or the odd ones (1), in order."""
    return [rate for number, runs in enumerate(rounds) if number % 2 == half for rate in runs]


def _median(rates: Sequence[float | None]) -> float | None:
    kept = [rate for rate in rates if rate is not None]
    return statistics.median(kept) if kept else None
