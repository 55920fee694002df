"""The loop's clock: each step's wall time and llama.cpp's share land in the right statistics, rollback counts
from the generation's start, and each round is booked in every cost book (its pass in the pair's by the scheduler)."""

from __future__ import annotations

import time

from spec_cli.decoding.costs import LoopCosts
from spec_cli.decoding.stats import Stats
from spec_cli.decoding.timing import RoundTimer


class Part:
    """Something that decodes: its counters move only when the test says it spent time in llama.cpp."""

    def __init__(self, busy_s: float = 0.0, rollback_s: float = 0.0) -> None:
        self.busy_s, self.rollback_s = busy_s, rollback_s

    def spend(self, busy_s: float, rollback_s: float = 0.0) -> None:
        self.busy_s += busy_s + rollback_s
        self.rollback_s += rollback_s


def test_steps_land_in_their_shares_and_rollback_counts_from_this_generation() -> None:
    """Each step's wall time goes to its share; llama.cpp's time is the round's, whatever step spent it (the pass a
    scheduler ran for the round, a rewind), and rollback counts from this generation's rounds."""
    stats = Stats(draft_max=2)
    target, drafter = Part(busy_s=7.0, rollback_s=3.0), Part()  # a context used by earlier generations
    running = LoopCosts()  # the pair's
    timer = RoundTimer(stats, [target, drafter], [running])
    timer.prompt_started()
    target.spend(0.5, rollback_s=0.25)  # the prompt's snapshot: not a round's rollback
    time.sleep(0.01)
    timer.prompt_done(40)
    assert stats.prompt_s >= 0.01 and stats.llama_s == 0.0
    timer.start_round()
    with timer.step("draft_s"):
        drafter.spend(0.125)
    started = time.perf_counter()
    target.spend(0.25)  # the scheduler's verify pass
    time.sleep(0.01)
    timer.verified(time.perf_counter() - started)
    with timer.step("verify_s"):
        time.sleep(0.01)
    target.spend(0.0, rollback_s=0.0625)  # the rewind
    timer.end_round([(1, 0.002), (1, 0.002)], drafted=2, emitted=3, context=40)
    assert stats.llama_s == 0.125 + 0.25 + 0.0625 and stats.rollback_s == 0.0625
    assert stats.verify_s >= 0.02 and 0 < stats.draft_s < stats.verify_s
    assert stats.costs.verify.mean(3) == stats.verify_s  # its pass over [last, d1, d2]
    assert not running.verify.weight  # the scheduler that ran the pass books it there (`Planner.passed`)
    assert running.per_row >= 0.01 / 3 and stats.costs.per_row == 0.0  # the work on its 3 rows, apart there
    assert running.per_token == stats.costs.per_token
    for book in (stats.costs, running):
        assert book.draft.mean(1) == 0.002
    assert stats.decode_s >= stats.verify_s
