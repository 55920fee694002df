"""The book of calls by size (`batch_costs.BatchCosts`): per-size means that follow the machine's load, the fitted line
for sizes not seen, the monotone fit that keeps more rows from reading cheaper than fewer, and the reads it keeps."""

from __future__ import annotations

import pytest

from spec_cli.decoding.batch_costs import FOLLOW_STEP, LOAD_BAND, REPRICE, BatchCosts
from spec_cli.decoding.costs import LoopCosts


def test_means_by_size_and_a_line_between_them() -> None:
    costs = BatchCosts()
    for n, seconds in [(1, 0.010), (1, 0.012), (3, 0.020), (5, 0.030)]:
        costs.record(n, seconds)
    assert costs.seconds(1) == pytest.approx(0.011)
    assert costs.seconds(3) == pytest.approx(0.020)
    assert 0.020 < costs.seconds(4) < 0.030  # read off the fitted line
    slope = costs.seconds(7) - costs.seconds(6)
    assert costs.seconds(9) - costs.seconds(6) == pytest.approx(3 * slope)  # beyond the sizes seen: the same line
    assert slope == pytest.approx(0.0047, abs=0.0002)  # weighted least squares (the size seen twice weighs more)


def test_decay_follows_the_latest_calls() -> None:
    costs = BatchCosts(decay=0.5)
    for seconds in (1.0, 1.0, 1.0, 3.0):
        costs.record(2, seconds)
    assert costs.seconds(2) == pytest.approx((0.25 + 0.5 + 3.0) / (0.25 + 0.5 + 1.0))  # the first replaced
    plain = BatchCosts()
    for seconds in (1.0, 1.0, 1.0, 3.0):
        plain.record(2, seconds)
    assert plain.seconds(2) == pytest.approx(1.5)  # plain means (a benchmark's) count every call


def test_a_size_not_measured_for_a_while_is_read_off_the_line() -> None:
    """A size measured once on a busy machine does not price that size for good (the planner would never choose it
    again to measure it): once its calls weigh less than `STALE`, it is read off the line the fresh sizes make."""
    costs = BatchCosts(decay=0.9)
    costs.record(8, 0.100)
    assert costs.seconds(8) == pytest.approx(0.100)
    for _ in range(20):
        for n in (1, 2, 4):
            costs.record(n, 0.020 + 0.003 * n)
    assert 0.040 < costs.seconds(8) < 0.050  # 0.020 + 0.003 · 8, the stale call barely pulling the line
    assert costs.mean(8) == pytest.approx(0.100)  # the call itself is kept, weighing less and less


def test_a_size_seen_long_ago_keeps_its_shape_at_todays_level() -> None:
    """A 6-row pass measured beside 4-row ones at 2.5 times their cost is read at 2.5 times what a 4-row pass costs
    now that contexts have grown and it costs twice as much: not its own old mean (one fresh size draws no line)."""
    costs = BatchCosts(decay=0.9)
    for _ in range(10):
        costs.record(4, 0.010)
        costs.record(6, 0.025)
    costs.record(4, 0.010)
    for _ in range(100):
        costs.record(4, 0.020)
    assert costs.mean(6) == pytest.approx(0.025)
    assert costs.seconds(6) == pytest.approx(0.050, rel=1e-3)
    assert costs.seconds(4) == pytest.approx(0.020, rel=1e-3)


def test_a_cost_books_sizes_follow_the_machines_load_until_measured() -> None:
    """A book filled on a quiet machine, read under load: the sizes this process has not measured are brought to the
    level its measured ones show against the book (under a process taking a core, draft steps cost 31 ms where the
    book said 8, and a 64-token catch-up read at the book's 220 ms entered the draft model where it cost ~850). A
    level within `LOAD_BAND` is the book's other prompts and contexts, not load: read as 1."""
    costs = BatchCosts(decay=0.95)
    costs.seed({"1": 0.008, "2": 0.014, "64": 0.220}, 4.0)
    for _ in range(60):
        costs.record(1, 0.0104)  # 1.3 times the book: within the band
    between = 0.014 + (0.220 - 0.014) * 30 / 62
    assert costs.interpolated(32) == pytest.approx(between)
    assert costs.mean(2) == pytest.approx(0.014) and costs.mean(64) == pytest.approx(0.220)
    for _ in range(60):
        costs.record(1, 0.031)
    level = costs.seconds(1) / 0.008
    assert costs.level() == pytest.approx(level) and level > LOAD_BAND
    assert costs.interpolated(32) == pytest.approx(between * level, rel=FOLLOW_STEP)
    assert costs.mean(2) == pytest.approx(0.014 * level, rel=FOLLOW_STEP)
    assert costs.mean(64) == pytest.approx(0.220 * level, rel=FOLLOW_STEP)
    brought = costs.mean(2)
    costs.record(2, 0.050)
    costs.record(2, 0.056)  # measured now (the first call replaced): mixed with the book's, at the level brought to
    book = 4 * 0.95 ** 122  # the book's calls, aged by every call since
    assert costs.mean(2) == pytest.approx((book * brought + 0.056) / (book + 1))


def test_a_catch_up_measured_long_ago_is_read_at_todays_level() -> None:
    """A draft model's catch-ups are seldom and each of its own size: one measured on a quiet stretch prices a
    catch-up under load at the ratio it had to a draft step then, not at its old seconds."""
    costs = BatchCosts(decay=0.95)
    for _ in range(20):
        costs.record(1, 0.008)
    costs.record(50, 0.200)
    for _ in range(60):
        costs.record(1, 0.024)
    assert not costs.fresh(50)
    step = costs.seconds(1)
    assert costs.interpolated(50) == pytest.approx(0.600, rel=0.03)  # three times the quiet 200 ms
    assert costs.interpolated(50) == pytest.approx(0.200 / 0.008 * step)
    assert costs.interpolated(25) == pytest.approx(step + (0.200 / 0.008 - 1) * step * 24 / 49)


def test_a_draft_book_follows_the_load_the_targets_passes_show_until_it_measures_its_own() -> None:
    """A draft model that has not drafted in this process (`spec run` is a process a prompt) is priced at its book's
    seconds times how much dearer the target's passes are now than the book said: under a process taking a core a
    book filled on a quiet machine priced its steps at a third of their cost. Its first calls mix with the book's
    at that level (no jump), and from then on it follows its own."""
    costs = LoopCosts(decay=0.95)
    costs.verify.seed({"0": 0.020, "5": 0.035}, 4.0)
    costs.draft.seed({"1": 0.008, "64": 0.220}, 4.0)
    assert costs.verify.level() == 1.0 and costs.draft.seconds(1) == pytest.approx(0.008)
    for _ in range(40):
        costs.verify.record(0, 0.060)
    level = costs.verify.level()
    assert level == pytest.approx(costs.verify.seconds(0) / 0.020) and 2.5 < level < 3.0
    assert costs.draft.seconds(1) == pytest.approx(0.008 * level, rel=0.05)
    assert costs.draft.interpolated(64) == pytest.approx(0.220 * level, rel=0.05)
    led = costs.draft.seconds(1)
    costs.draft.record(1, 0.030)
    costs.draft.record(1, 0.026)
    book = 4 * 0.95 ** 2
    assert costs.draft.seconds(1) == pytest.approx((book * led + 0.026) / (book + 1))
    for _ in range(40):
        costs.verify.record(0, 0.020)  # quiet again: the draft's own calls price it now
    assert costs.draft.seconds(1) == pytest.approx((book * led + 0.026) / (book + 1))
    drafting = BatchCosts(decay=0.95)  # every pass drafts 5: the size the book said most of is not measured
    drafting.seed({"0": 0.020, "5": 0.035}, 4.0)
    for _ in range(3):
        drafting.record(5, 0.105)
    assert drafting.level() == pytest.approx(drafting.mean(5) / 0.035)


def test_aging_is_the_same_however_long_the_machine_runs() -> None:
    """Aged lazily, every call weighs decay^(calls since) over tens of thousands of calls (past the point where
    the scale is brought back), with means kept; a size gone for so long that its weight is no number is
    forgotten, as if never seen."""
    costs = BatchCosts(decay=0.95)
    costs.record(4, 0.040)
    for _ in range(10):
        costs.record(1, 0.010)
    assert costs.calls(4) == pytest.approx(0.95 ** 10) and costs.mean(4) == pytest.approx(0.040)
    assert costs.calls(1) == pytest.approx(sum(0.95 ** i for i in range(9)))  # the first replaced by the second
    for _ in range(20_000):
        costs.record(1, 0.010)
    assert costs.calls(1) == pytest.approx(1 / (1 - 0.95)) and costs.seconds(1) == pytest.approx(0.010)
    assert costs.mean(4) is None
    costs.record(2, 0.015)
    merged = BatchCosts(decay=0.95)
    merged.merge(costs)
    assert merged.calls(2) == pytest.approx(1.0) and merged.mean(2) == pytest.approx(0.015)


def test_more_rows_never_read_cheaper_than_fewer() -> None:
    """One noisy call must not make a larger pass look cheaper than a smaller one: the planner would add rows as if
    they paid it back. The two are pooled, each call weighing as aged."""
    costs = BatchCosts(decay=0.95)
    costs.record(4, 0.0006)
    costs.record(8, 0.0003)
    pooled = (0.95 * 0.0006 + 0.0003) / 1.95
    assert costs.seconds(4) == pytest.approx(pooled) and costs.seconds(8) == pytest.approx(pooled)
    assert costs.seconds(16) >= pooled
    assert costs.mean(8) == pytest.approx(0.0003)


def test_one_preempted_pass_does_not_price_every_larger_one() -> None:
    """Under a process taking a core, a pass of a size called once was preempted (189 ms where 1-row passes took 80
    and the sizes around it ~100): the monotone fit pools it with the sizes above it instead of lifting them all to
    it, as a running maximum did (drafting more than two tokens priced at 2.4 plain steps)."""
    costs = BatchCosts(decay=0.95)
    for _ in range(12):
        costs.record(1, 0.080)
    for n, seconds in [(4, 0.189), (5, 0.100), (6, 0.100), (7, 0.100), (8, 0.100)]:
        costs.record(n, seconds)
        costs.record(n, seconds)  # a size's first call is replaced by its second
        costs.record(1, 0.080)
    assert costs.seconds(1) == pytest.approx(0.080)
    reads = [costs.seconds(n) for n in range(1, 12)]
    assert reads == sorted(reads)
    assert 0.100 < costs.seconds(4) == costs.seconds(8) < 0.125  # the spike spread over five sizes
    assert costs.seconds(8) <= costs.seconds(11) < 0.189  # off the line, which the spike no longer sets


def test_prices_read_every_size_as_seconds_does() -> None:
    """The goodput choice reads c(0..R) in one pass (`prices`): the same prices `seconds` reads one size at a time, on
    books with one size, with fresh and stale sizes, with a size's shape against the one fresh size, and seeded."""
    import random

    rng = random.Random(7)
    books = []
    for case in range(40):
        costs = BatchCosts(decay=rng.choice([0.5, 0.9, 0.99]))
        if case % 4 == 0:
            costs.seed({str(n): 0.01 + 0.002 * n for n in range(1, 18)}, 1.0)
        for _ in range(rng.randrange(1, 60)):
            n = rng.choice([1, 1, 1, 2, 4, 6, 9] if case % 3 else [3])
            costs.record(n, (0.01 + 0.002 * n) * rng.uniform(0.6, 1.6))
        books.append(costs)
    assert any(len(book.weight) == 1 for book in books)
    assert any(not all(book.fresh(n) for n in book.weight) for book in books)
    for book in books:
        prices = book.prices(rng.choice([0, 4]))  # read short first, then extended
        assert book.prices(30) is prices == [book.seconds(n) for n in range(31)]
        assert book.prices(12) is prices  # kept until a call


def test_one_size_seen_guesses_cheap_on_both_sides() -> None:
    """Optimism gets the other sizes tried: cheaper below (in proportion to n + 1), no dearer above."""
    costs = BatchCosts()
    assert costs.seconds(3) is None
    costs.record(3, 0.040)
    assert costs.seconds(0) == pytest.approx(0.010)
    assert costs.seconds(8) == pytest.approx(0.040)


def test_merge_pools_calls() -> None:
    first, second = BatchCosts(), BatchCosts()
    first.record(1, 0.010)
    second.record(1, 0.020)
    second.record(2, 0.030)
    first.merge(second)
    assert first.as_dict() == {"1": pytest.approx(0.015), "2": pytest.approx(0.030)}


def test_the_line_never_dips_below_what_smaller_sizes_read() -> None:
    costs = BatchCosts()
    for n, seconds in [(4, 0.050), (6, 0.040), (8, 0.060)]:  # noise: K=6 measured cheaper than K=4
        costs.record(n, seconds)
    assert costs.seconds(4) == costs.seconds(5) == costs.seconds(6) == pytest.approx(0.045)  # the two pooled
    assert 0.045 <= costs.seconds(7) <= costs.seconds(8) == pytest.approx(0.060)
    reads = [costs.seconds(n) for n in range(12)]
    assert reads == sorted(reads)  # the line between two sizes stays within their fits
    assert 0.010 <= costs.seconds(0) < 0.050  # at least K=4's cost in proportion to K + 1


def test_where_more_rows_measured_cheaper_the_line_is_level_at_the_points_mean() -> None:
    """Noise can make a line through the sizes seen slope down; more rows never cost less, so it is read level, at
    the points' weighted mean, not at the sloping line's intercept (above every point measured)."""
    costs = BatchCosts()
    for _ in range(10):
        costs.record(2, 0.010)
        costs.record(6, 0.008)
    assert costs.seconds(2) == costs.seconds(6) == pytest.approx(0.009)  # pooled by the monotone fit
    assert costs.seconds(10) == pytest.approx(0.009)  # beyond the sizes seen: the level line, not 0.011


def test_interpolated_reads_between_the_sizes_seen_and_in_proportion_beyond() -> None:
    """A catch-up far larger than the draft steps is priced from the large calls seen, not from a line that
    the many one-token steps dominate."""
    costs = BatchCosts()
    for _ in range(50):
        costs.record(1, 0.009)
        costs.record(2, 0.016)
    costs.record(46, 0.181)
    assert costs.interpolated(2) == pytest.approx(0.016)
    assert costs.interpolated(24) == pytest.approx(0.016 + (0.181 - 0.016) * 22 / 44)
    assert costs.interpolated(92) == pytest.approx(0.181 * 2)
    assert BatchCosts().interpolated(3) is None


def test_interpolated_beyond_a_pass_that_fed_nothing_reads_the_line() -> None:
    """Size 0 (a verify pass of no drafts) has no per-token rate to scale: beyond it, `seconds`' guess."""
    costs = BatchCosts()
    costs.record(0, 0.010)
    assert costs.interpolated(3) == costs.seconds(3) == pytest.approx(0.010)


def test_reads_follow_the_calls_recorded_between_them() -> None:
    """What a read keeps (means, fresh sizes, the monotone fit) is updated by each call: a size read, then called
    again dearer than the size above it, is pooled with it."""
    costs = BatchCosts(decay=0.5)
    for n, seconds in [(1, 0.010), (2, 0.020), (1, 0.010), (2, 0.020)]:
        costs.record(n, seconds)
    assert costs.seconds(1) == pytest.approx(0.010) and costs.seconds(2) == pytest.approx(0.020)
    costs.record(1, 0.040)
    assert costs.mean(1) == pytest.approx((0.040 + 0.25 * 0.010) / (1 + 0.25))  # every call ages all
    assert costs.seconds(2) == costs.seconds(1) < costs.mean(1)  # more rows never read cheaper: the two pooled
    for _ in range(8):  # size 2 goes stale (its calls weigh < STALE): not its own old mean, 0.020, any more
        costs.record(1, 0.040)
    assert not costs.fresh(2)
    assert costs.seconds(2) >= costs.seconds(1) == pytest.approx(0.040, rel=0.01)


def test_reads_are_kept_while_the_means_they_rest_on_move_less_than_a_share() -> None:
    """A call that moves its size's mean by less than `REPRICE` (of the mean the reads were found with) leaves what
    reads found as it was; calls that move it further, a little at a time, or a new size, have it found again."""
    costs = BatchCosts(decay=0.95)
    for _ in range(20):
        costs.record(1, 0.010)
        costs.record(4, 0.040)
    read = costs.prices(4)
    costs.record(1, 0.0104)  # the mean of 1 moves by 0.2%
    assert costs.prices(4) == read and costs.mean(1) > 0.010
    for _ in range(10):  # 4% off it each, ~2.5% in all
        costs.record(1, 0.0104)
    assert costs.mean(1) > 0.010 * (1 + REPRICE)
    assert costs.seconds(1) == costs.mean(1) > read[1]
    moved = costs.seconds(1)
    costs.record(1, 0.0104)
    assert costs.seconds(1) == moved  # kept again: the reads were found at the moved mean
    costs.record(3, 0.030)  # a size seen for the first time
    assert costs.seconds(3) == pytest.approx(0.030)


def test_a_sizes_first_call_is_replaced_by_its_second() -> None:
    """The first pass of a shape is cold (a tiny model's first 4-row pass took 510 µs, the next ones ~110): it prices
    its size until a second call replaces it, and means are taken from the second call on."""
    costs = BatchCosts(decay=0.95)
    costs.record(4, 0.510)
    assert costs.first_only(4) and costs.seconds(4) == pytest.approx(0.510)
    costs.record(4, 0.110)
    assert not costs.first_only(4) and costs.seconds(4) == pytest.approx(0.110)
    costs.record(4, 0.130)
    assert costs.seconds(4) == pytest.approx((0.95 * 0.110 + 0.130) / 1.95)
    seeded = BatchCosts(decay=0.95)
    seeded.seed({"4": 0.100}, 1.0)  # a size a cost book knew: its first call now is replaced likewise
    seeded.record(4, 0.500)
    seeded.record(4, 0.120)
    assert seeded.seconds(4) == pytest.approx((0.95 ** 2 * 0.100 + 0.120) / (0.95 ** 2 + 1))
    reseeded = BatchCosts(decay=0.95)
    reseeded.record(4, 0.500)
    reseeded.seed({"4": 0.100}, 1.0)  # a seed replaces the size, its first call with it
    reseeded.record(4, 0.120)
    assert reseeded.seconds(4) == pytest.approx((0.95 * 0.100 + 0.120) / 1.95)
