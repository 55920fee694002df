"""What one call of each size costs on this machine, as the loop measures it: `BatchCosts`, the book that every price
of a pass or a decode reads (the target's pass by its rows, c_v(R); a draft model's decode by the tokens it feeds,
c_d(n)). Its means follow the machine's load (older calls weigh less), sizes not measured lately are read off a line
through the sizes seen, and more rows never read cheaper than fewer. `costs` puts the books together into what a
round costs."""

from __future__ import annotations

import math
from bisect import bisect_right, insort

from spec_cli.decoding.fits import monotone, weighted_line

REFIT_EVERY = 16  # calls of sizes already seen between two fits of `BatchCosts`' line
STALE = 0.5  # the weight (in calls) below which a size measured long ago is read off `BatchCosts`' line
LOAD_BAND = 1.5  # a level within this factor of a cost book's is its workload's and contexts', not the machine's load
FOLLOW_STEP = 0.05  # how far the level a book's seeded sizes follow moves before they are brought to it
FLOOR = 0.01  # the least weight (in calls) a size measured long ago keeps in the line's fit: its shape stays known
RESCALE = 1e150  # `BatchCosts`' scale past which its weights are brought back to real calls (the rest forgotten)
LISTED = 17  # the sizes `BatchCosts.seconds` reads off one list: K + 1 rows up to `-k auto`'s largest K
REPRICE = 0.02  # how far a size's mean moves (a share of it) before what `BatchCosts`' reads kept is found again


class BatchCosts:
    """Mean seconds of a call by size n, with older calls weighing `decay`× less at each new call.

    `decay` = 1 gives plain means (a benchmark's pooled figures); below 1 the means follow the machine's load, and
    a size not called for a while (its calls weigh less than `STALE`) is read off the line like a size never seen:
    a pass of 8 rows measured once on a busy machine priced every 8-row pass since, kept the planner from choosing
    one again, and so was never measured again. A size never seen is read off a least-squares line through the
    sizes seen (weighted by how much each was seen, a size seen long ago as `FLOOR` calls: where one size is fresh,
    the old ones still give the line its slope; forgotten, they left one size, read as if batching were free, and
    on a tiny model whose 2-row pass costs three 1-row ones the planner drafted 7 rows every ~135 rounds),
    refitted when a new size is seen and every `REFIT_EVERY` calls otherwise. A size seen long ago was measured beside
    the size called most (`_shape`: its mean over that one's when it was last called), and is at that ratio of the
    other's cost today, in the line, between the sizes seen (`interpolated`) and, where fewer than two sizes are fresh
    (no line to read it off), as its price: passes cost more as contexts grow and as the machine's load changes, and a
    6-row pass measured early beside 4-row ones priced it cheap long after the 4-row passes had doubled (four
    sequences on a tiny model drafted where a row costs more than the whole pass). The sizes a cost book seeded and
    this process has not measured follow the machine's load (`_follow`). With one size n0 seen, the guess errs cheap
    on both sides, so that whatever depends on it gets tried and measured: proportional to n + 1 below n0, the same
    as n0 above (as if batching were free).

    A loop records a call every round and its planning reads many sizes, so what a read needs is kept as calls are
    recorded rather than found again from every size: the means (a call changes its own size's only), the sizes in
    order, which are fresh (found again only once one may have gone stale, `_stale_at`, or a stale one is called),
    the line (fitted ~60 µs a fit with NumPy, in closed form now, and only as said above) and what each size read
    until the next call. A draft model's book holds a size for every catch-up it made (~50 on the demo pair): found
    from them all at every read, a round's reads cost ~20 µs.

    A live book's first call of a size (decay < 1) prices it only until the second, which replaces it: the first pass
    of a shape is cold (a tiny model's first 4-row pass took 510 µs, the next ones ~110), and as the floor of every
    larger size it made rows look free.

    Aging is lazy: `weight` and `total` hold calls × `_scale`, and a call adds `_scale`, which grows by 1/decay at
    each one, so a call costs the same whatever the number of sizes (`calls(n)` is the real weight). A cost book
    or a test that seeds 128 sizes made every recorded call age all of them: ~15 µs a call.
    """

    def __init__(self, decay: float = 1.0) -> None:
        self.decay = decay
        self.weight: dict[int, float] = {}
        self.total: dict[int, float] = {}
        self._mean: dict[int, float] = {}  # total / weight, by size
        self._sorted: list[int] = []  # the sizes seen, in order
        self._fresh: list[int] | None = None  # the sizes measured lately, in order (None: to be found again)
        self._fresh_set: frozenset[int] = frozenset()
        self._stale_at = math.inf  # the least weight among the fresh sizes: past it, STALE × scale may make one stale
        self._fit: tuple[list[int], list[float]] | None = None  # `_fitted`, until a call
        self._line: tuple[float, float] | None = None  # (slope, intercept), fitted when first needed
        self._since_fit = 0  # calls recorded since the line was fitted
        self._read: dict[int, float | None] = {}  # what `seconds` read since the last call recorded
        self._prices: list[float] = []  # what `prices` read, likewise
        self._between: dict[int, float | None] = {}  # what `interpolated` read, likewise
        self._basis: dict[int, float] = {}  # the means of the sizes called since, when those reads were found (`_near`)
        self._scale = 1.0  # decay^-(calls recorded since the last rescale)
        self._ref: int | None = None  # the size called most (aged): what the others' shapes are measured against
        self._shape: dict[int, tuple[int, float]] = {}  # size: (the size called most, its mean over that one's)
        self._seeded: set[int] = set()  # sizes whose calls all came from a seed: none measured in this process
        self._first: dict[int, tuple[float, float] | None] = {}  # a size's first call (weight, total) until its second
        self.follows: BatchCosts | None = None  # whose `level` the seeded sizes follow until one is measured
        self._booked: dict[int, float] = {}  # a size's mean as a cost book seeded it
        self._followed = 1.0  # the level its seeded sizes were last brought to
        self._level: float | None = None  # `level`, until a call
        self._unmeasured = False  # whether it has seeded sizes and has measured none of them (`follows` leads then)
        self._follow_due = False  # whether calls were recorded since the seeded sizes last followed (`_ready`)
        self._synced = -1  # the calls `follows` had recorded when this book last followed it
        self.calls_recorded = 0  # how many calls `record` took: a book that follows this one reads it to catch up

    def record(self, n: int, seconds: float) -> None:
        known, before = n in self.weight, self._mean.get(n, 0.0)
        if not known or self._since_fit >= REFIT_EVERY:
            self._line = None
        if self.decay < 1.0:
            self._scale /= self.decay
            if self._scale > RESCALE:
                self._rescale()
        first = self._first.get(n)
        if first:  # the second call replaces the first, which was cold
            self.weight[n] -= first[0]
            self.total[n] -= first[1]
        if self.decay < 1.0:  # a live book's (plain means, a benchmark's, count every call)
            self._first[n] = None if n in self._first else (self._scale, self._scale * seconds)
        self._add(n, self._scale, self._scale * seconds)
        self._seeded.discard(n)
        shaped: int | None = n  # the size whose shape this call updates
        if self._ref is None or self.weight[n] > self.weight[self._ref]:  # only the size called can overtake
            self._ref, shaped = n, self._ref  # the one overtaken keeps its shape against the new most called
        if shaped is not None and shaped != self._ref:
            self._shape[shaped] = (self._ref, self._mean[shaped] / self._mean[self._ref])
        self._since_fit += 1
        if n not in self._fresh_set or STALE * self._scale > self._stale_at:
            self._fresh = None
        if not known or first or self._fresh is None or not self._near(n, before):
            self._forget_reads()
        self._level = None
        self.calls_recorded += 1
        if n in self._booked:
            self._unmeasured = False
        self._follow_due = bool(self._seeded)

    def _near(self, n: int, before: float) -> bool:
        """Whether size n's mean, just recorded, is within `REPRICE` of what it was when the reads kept were found (its
        mean before the first call since, `_basis`): a call moves a live book's mean by a twentieth of its noise, and
        the reads found again after every call (each book a round, after a pass that left the caches cold) were ~60 µs
        of the default's ~250 µs choice on the demo pair; prices within a share of a call's noise choose alike."""
        basis = self._basis.setdefault(n, before)
        return abs(self._mean[n] - basis) <= REPRICE * basis

    def _forget_reads(self) -> None:
        """The means changed: what reads kept (`seconds`, `interpolated`, `prices`, the monotone fit) is found again
        (emptied only where a read kept something: a round's draft steps are recorded one after another)."""
        if self._fit is not None or self._prices or self._read or self._between:
            self._read, self._between, self._prices, self._fit = {}, {}, [], None
        if self._basis:
            self._basis = {}

    def _add(self, n: int, weight: float, total: float) -> None:
        if n not in self.weight:
            insort(self._sorted, n)
            self.weight[n], self.total[n] = weight, total
        else:
            self.weight[n] += weight
            self.total[n] += total
        self._mean[n] = self.total[n] / self.weight[n]

    def fresh(self, n: int) -> bool:
        """Whether size n was measured lately (its calls weigh at least `STALE`): its own mean prices it."""
        return n in self.weight and self.weight[n] >= STALE * self._scale

    def first_only(self, n: int) -> bool:
        """Whether size n has been called once only: that call was cold (llama.cpp's first pass of a shape, the first
        after a prompt), and the second replaces it."""
        return bool(self._first.get(n))

    def calls(self, n: int) -> float:
        """How many calls of size n the mean weighs, each aged by `decay` at every call since."""
        return self.weight[n] / self._scale

    def _rescale(self) -> None:
        """Weights back to real calls; a size whose weight would no longer be a number is forgotten."""
        for size in list(self.weight):
            self.weight[size] /= self._scale
            self.total[size] /= self._scale
            first = self._first.get(size)
            if first:
                self._first[size] = first[0] / self._scale, first[1] / self._scale
            if self.weight[size] < 1e-200:
                del self.weight[size], self.total[size], self._mean[size]
                self._shape.pop(size, None)
                self._first.pop(size, None)
                self._seeded.discard(size)
        self._scale = 1.0
        self._sorted = sorted(self.weight)
        self._changed()

    def _changed(self) -> None:
        """Many sizes changed at once (a merge, a seed, a rescale): what reads kept is found again."""
        self._ref = max(self.weight, key=self.weight.__getitem__, default=None)
        self._shape = {n: shape for n, shape in self._shape.items() if shape[0] in self.weight}
        self._line, self._fresh, self._level = None, None, None
        self._forget_reads()

    def merge(self, other: BatchCosts) -> None:
        other._ready()
        for n in other.weight:
            calls = other.calls(n) * self._scale
            self._add(n, calls, calls * other.total[n] / other.weight[n])
        self._changed()

    def mean(self, n: int) -> float | None:
        self._ready()
        return self._mean.get(n)

    def level(self) -> float:
        """How dear the size measured most in this process is now against what a cost book seeded it at: the machine's
        load since the book was filled (1 where no book said, or nothing it said has been measured since). Kept until
        the next call recorded."""
        if self._level is None:
            most = self._ref
            if most not in self._booked or most in self._seeded:
                measured = [m for m in self._booked if m not in self._seeded and m in self.weight]
                most = max(measured, key=self.weight.__getitem__, default=None)
            self._level = 1.0 if most is None else self._mean[most] / self._booked[most]
        return self._level

    def _follow(self) -> None:
        """The sizes a cost book seeded and this process has not measured, brought to the level of the machine's load
        now: this book's own (`level`), or, where it has measured none of them yet (a draft model that has not drafted
        in this process), that of the book it follows (the target's passes, measured every round). Under a process
        taking a core, a book filled on a quiet machine priced the draft model's steps at a third of their cost (31 ms,
        not 8) and its catch-up of a 64-token prompt at 220 ms where it took ~850, and the default entered the draft
        model where it lost; `spec run`, a process a prompt, read nothing else until it drafted. A level within
        `LOAD_BAND` of the book's is read as 1: on a quiet machine the target's 1-row passes read 1.3 times the book's
        (other prompts, other contexts) while its larger passes and the draft's steps cost what the book said, and
        following that priced the draft model out of a process's first answers in three runs of three. Brought there
        once it moves by `FOLLOW_STEP`; a size's first call then mixes with its seeded ones at that level."""
        source = self.follows if self._unmeasured else self
        level = source.level() if source is not None else 1.0
        if source is self.follows and source is not None:
            self._synced = source.calls_recorded
        if 1.0 / LOAD_BAND <= level <= LOAD_BAND:
            level = 1.0
        if abs(level / self._followed - 1.0) <= FOLLOW_STEP:
            return
        for n in self._seeded:
            self.total[n] *= level / self._followed
            self._mean[n] = self.total[n] / self.weight[n]
        self._followed = level
        self._line = None
        self._forget_reads()

    def _ready(self) -> None:
        """Before a read: the seeded sizes `_follow` the level once, after the calls recorded since, or the book this
        one follows, which leads while this one has measured nothing, where it has recorded calls since. Once a read,
        not a call: a round records a call for each draft step, and following at each cost ~10 µs of a round."""
        if self._unmeasured:
            follows = self.follows
            if follows is not None and follows.calls_recorded != self._synced:
                self._follow()
        elif self._follow_due:
            self._follow()
        self._follow_due = False

    def seconds(self, n: int) -> float | None:
        """c(n): the measured mean where n was seen, the fitted line elsewhere (None before any call). A size up to
        `LISTED` is read off `prices`, found for every size up to it in one pass: a round reads c(0), c(K) and c(K + 1)
        of each book, and each read on its own walked the fit's sizes again."""
        if self._unmeasured or self._follow_due:
            self._ready()
        if n < len(self._prices):
            return self._prices[n]
        if not self.weight:
            return None
        if n <= LISTED:
            return self.prices(n)[n]
        if n not in self._read:
            self._read[n] = self._seconds(n)
        return self._read[n]

    def _fresh_sizes(self) -> frozenset[int]:
        """The sizes measured lately (their calls weigh at least `STALE`), found again only when one may have gone
        stale or a stale one was called."""
        if self._fresh is None:
            stale = STALE * self._scale  # calls(m) >= STALE, without a call per size
            self._fresh = [m for m in self._sorted if self.weight[m] >= stale]
            self._fresh_set = frozenset(self._fresh)
            self._stale_at = min((self.weight[m] for m in self._fresh), default=math.inf)
        return self._fresh_set

    def _today(self, m: int, fresh: frozenset[int]) -> float:
        """Size m's mean; for one seen long ago with a shape against a fresh size, that ratio of its cost today."""
        if m not in fresh and m in self._shape:
            ref, ratio = self._shape[m]
            if ref in fresh:
                return ratio * self._mean[ref]
        return self._mean[m]

    def _seconds(self, n: int) -> float | None:
        return self._run(n, n)[0] if self.weight else None

    def prices(self, most: int) -> list[float]:
        """c(0)..c(`most`), each as `seconds` reads it, found in one pass over the sizes and kept until the next call
        recorded: the goodput choice reads every pass it may grow a step to (~20 sizes a step), where a read each cost
        ~1.5 µs, and more in a loop's step, between passes that leave the caches cold; the quiet rule reads the pass
        over the sequences alone first, and the choice extends it. At least one call recorded."""
        if self._unmeasured or self._follow_due:
            self._ready()
        if len(self._prices) <= most:
            self._prices += self._run(len(self._prices), most)
        return self._prices

    def _run(self, low: int, high: int) -> list[float]:
        """c(n) for n in `low`..`high` (`seconds`): a fresh size's monotone fit; where fewer than two sizes are fresh
        (no line through them), a size with a shape against a fresh one at that ratio of it today; with one size
        seen, that size in proportion to n + 1 below it and as it above; else the line.

        Each is kept between what the fresh sizes' monotone fit reads at the sizes either side of n, and below the
        sizes seen, at least the smallest one's in proportion to n + 1: more rows never read cheaper than fewer (a
        line through noisy points can dip, and so can one call: the first 4-row pass of four sequences on a tiny
        model took twice what the 8-row pass after it did, and the planner drafted as if rows paid it back). The fit
        (over all sizes where none is fresh) is the weighted least-squares one that never decreases (`fits.monotone`,
        weights = calls), not the running maximum it replaced: under a process taking a core, one preempted pass of a
        size called once (189 ms where a 1-row pass took 80) set the price of every larger size, and drafting more
        than two tokens was priced at 2.4 plain steps."""
        if len(self._sorted) < 2:  # one size to go by
            size = self._sorted[0]
            mean = self._mean[size]
            return [mean * min(1.0, (n + 1) / (size + 1)) for n in range(low, high + 1)]
        fresh = self._fresh_sizes()
        sizes, fitted = self._fitted()
        shaped = self._shape if len(fresh) < 2 else {}  # no line through fresh sizes
        line: tuple[float, float] | None = None
        at, prices = bisect_right(sizes, low), []
        for n in range(low, high + 1):
            while at < len(sizes) and sizes[at] <= n:
                at += 1
            if at and sizes[at - 1] == n:  # one noisy call must not make more rows look cheaper than fewer
                prices.append(fitted[at - 1])
                continue
            if n in shaped and shaped[n][0] in fresh:
                seconds = self._today(n, fresh)
            else:
                if line is None:
                    line = self._fitted_line(fresh)
                seconds = line[1] + line[0] * n
            if not at:
                prices.append(min(max(seconds, fitted[0] * (n + 1) / (sizes[0] + 1)), fitted[0]))
            elif at < len(sizes):
                prices.append(min(max(seconds, fitted[at - 1]), fitted[at]))
            else:
                prices.append(max(seconds, fitted[at - 1]))
        return prices

    def _fitted_line(self, fresh: frozenset[int]) -> tuple[float, float]:
        """(slope, intercept) of the line through every size seen at today's level, refitted as `record` says."""
        if self._line is None:
            means = {m: self._today(m, fresh) for m in self._sorted}
            weights = {m: max(self.calls(m), FLOOR) for m in means}
            slope, intercept = weighted_line(means, weights)
            if slope < 0.0:  # more rows never cost less: the level line nearest the points, not this one's intercept
                slope, intercept = 0.0, sum(weights[m] * means[m] for m in means) / sum(weights.values())
            self._line, self._since_fit = (slope, intercept), 0
        return self._line

    def _fitted(self) -> tuple[list[int], list[float]]:
        """The fresh sizes (all where none is) and their monotone fit: found at the first read after a call."""
        if self._fit is None:
            fresh = self._fresh_sizes()
            sizes = self._fresh or self._sorted
            values = [self._mean[m] for m in sizes] if fresh else [self._today(m, fresh) for m in sizes]
            fitted = monotone(values, [self.weight[m] for m in sizes])
            self._fit = sizes, fitted
        return self._fit

    def interpolated(self, n: int) -> float | None:
        """c(n) read between the sizes seen, for a size far from the many small calls that dominate the line
        of `seconds`: linear between the nearest sizes seen on either side; beyond the largest, in proportion
        to n (a large batch costs per token); below the smallest, as `seconds` (None before any call).
        A draft model's catch-up after a stretch of n-gram rounds is such a size: on the demo pair the line
        priced 40 tokens at ~80 ms where they took ~150 ms. What it read is kept until the next call recorded: the
        default drafting prices a drafter's catch-up several times a round."""
        if self._unmeasured or self._follow_due:
            self._ready()
        if n not in self._between:
            self._between[n] = self._interpolated(n)
        return self._between[n]

    def _interpolated(self, n: int) -> float | None:
        sizes = self._sorted
        if not sizes or n <= sizes[0] or n in self.weight:
            return self.seconds(n)
        at = bisect_right(sizes, n)
        below, fresh = sizes[at - 1], self._fresh_sizes()
        if at == len(sizes):  # beyond the largest: per token (a size 0, a pass that feeds none, has no such rate)
            return self._today(below, fresh) * n / below if below else self.seconds(n)
        above = sizes[at]
        low, high = self._today(below, fresh), self._today(above, fresh)
        return low + (high - low) * (n - below) / (above - below)

    def as_dict(self) -> dict[str, float]:
        self._ready()
        return {str(n): self._mean[n] for n in self._sorted}

    def seed(self, means: dict[str, float], weight: float) -> None:
        """Start from means measured before (`as_dict`'s form, as a cost book keeps them), each counting as
        `weight` calls: the first calls measured now soon outweigh them."""
        for n, seconds in means.items():
            if int(n) in self.weight:  # replaced, not added to (a first call included)
                self.weight[int(n)] = self.total[int(n)] = 0.0
                self._first.pop(int(n), None)
            self._add(int(n), weight * self._scale, weight * self._scale * float(seconds))
            self._seeded.add(int(n))
            self._booked[int(n)] = float(seconds)
        self._followed, self._unmeasured = 1.0, bool(means)
        self._changed()
