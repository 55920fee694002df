"""One row's speed over the best of several others, without the best one's luck.

The best of several rows measured with noise reads high by its noise alone (of eight rows equally fast, each ±3%, the
best reads ~4% above them), and a ratio to it charges that to the row compared. Cross-fitting takes it out: the best
is chosen on the runs of the even rounds and the ratio read on the odd rounds', and the other way about, the two
averaged. Each row's runs come in rounds, every row running each round alike (the same prompts, interleaved).
"""

from __future__ import annotations

import statistics
from typing import Sequence

Rounds = Sequence[Sequence[float]]  # a row's tokens/s, run by run, round by round


def held_out_ratio(row: Rounds, others: Sequence[Rounds]) -> float | None:
    """`row`'s median tokens/s over the best of `others`' (chosen on one half of the rounds, read on the other),
    averaged over both halves; None with fewer than two rounds."""
    if len(row) < 2 or not others:
        return None
    ratios = []
    for half in (0, 1):
        chosen = max(others, key=lambda other: _median(other, half))
        ratios.append(_median(row, 1 - half) / _median(chosen, 1 - half))
    return statistics.mean(ratios)


def _median(rounds: Rounds, half: int) -> float:
    """The median of the runs of the even rounds (`half` 0) or the odd ones (1)."""
    return statistics.median(rate for number, runs in enumerate(rounds) if number % 2 == half for rate in runs)
