"""`spec bench --concurrency`'s figures (`bench.concurrency.report`): each side over the target alone, over the best
side, and over the best of the others held out."""

from __future__ import annotations

import pytest

from spec_cli.bench.concurrency import Batch, report


def batch(mode: str, rates: list[float]) -> Batch:
    """A side whose batches, one a round, each ran 1 s at `rates` tokens/s."""
    return Batch(2, mode, wall_s=[1.0] * len(rates), tokens=[int(rate) for rate in rates])


def test_each_side_over_the_best_of_the_others_held_out() -> None:
    """Two rounds: the best other side is chosen on one and read on the other, both ways; the target alone and the
    best side keep their plain ratios beside it."""
    sides = [batch("hybrid", [50, 60]), batch("memory", [55, 40]), batch("none", [45, 50])]
    [level] = report(sides)["concurrency"]
    figures = {side["draft_mode"]: side for side in level["sides"]}
    # the default: memory is best on round 0 (55), read on round 1 (60 / 40); none on round 1 (50), read on 0 (50 / 45)
    assert figures["hybrid"]["of_best_other_held_out"] == pytest.approx((60 / 40 + 50 / 45) / 2)
    # memory: the default is best of the others on both rounds
    assert figures["memory"]["of_best_other_held_out"] == pytest.approx((40 / 60 + 55 / 50) / 2)
    assert figures["hybrid"]["speedup"] == pytest.approx(55 / 47.5) and figures["hybrid"]["of_best"] == 1.0
    [level] = report([batch("hybrid", [50]), batch("none", [45])])["concurrency"]
    assert all(side["of_best_other_held_out"] is None for side in level["sides"])  # one round: nothing to hold out
