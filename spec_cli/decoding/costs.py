"""What a round of the draft-and-verify loop costs on this machine, measured as the loop runs.

Three costs make up a round that drafts K tokens and emits E of them:
- c_d(n), a draft-model step that feeds n tokens (n = 1 while drafting; the catch-up at the start of a round
  feeds 1 token after a rejection and 2, [d_K, bonus], after a fully accepted round, more after n-gram
  rounds the model sat out); for a drafter that drafts a block in one pass (DFlash), c_d(K + 1) is that pass;
- c_v(R), the target's pass over R rows with the verification work on their logits: a round alone verifies
  [last, d1..dK], R = K + 1; a scheduler's pass holds every sequence's rows;
- o, the loop's own work per emitted token (detokenising, the consumer of the events, rewinding).

How c_d grows with K is the drafter's cost shape, which each drafter declares in its own module
(`Drafter.cost_shape`): host time only (a lookup), a step per drafted token (a draft model, a head), or one pass
per round (a block drafter). `round_seconds` and `step_costs` put them together; the hybrid drafter's regimes, the
planner's goodput choice, the cost book's reading and `spec bench`'s prediction all read them, so the bench's
predicted column checks the very model the loop optimises. So does the one rule for when an idle drafter is
tried again (`probe_rounds`).
"""

from __future__ import annotations

import math
from bisect import bisect_right, insort
from dataclasses import dataclass, field
from typing import Iterable, Protocol

from spec_cli.decoding.fits import monotone, weighted_line


# How a round's drafting cost grows with K (`LoopCosts.draft_seconds`): a lookup costs host time only, no decode;
# a draft model or a head takes a step per drafted token; a block drafter (DFlash) one pass per round.
HOST, PER_TOKEN, PER_ROUND = "host", "per token", "per round"
DECAY = 0.95  # every call weighs 5% less at each call recorded after it: the costs follow the machine's load
REFIT_EVERY = 16  # calls of sizes already seen between two fits of `BatchCosts`' line
STALE = 0.5  # the weight (in calls) below which a size measured long ago is read off `BatchCosts`' line
LOAD_BAND = 1.5  # a level within this factor of a cost book's is its workload's and contexts', not the machine's load
FOLLOW_STEP = 0.05  # how far the level a book's seeded sizes follow moves before they are brought to it
FLOOR = 0.01  # the least weight (in calls) a size measured long ago keeps in the line's fit: its shape stays known
RESCALE = 1e150  # `BatchCosts`' scale past which its weights are brought back to real calls (the rest forgotten)
PROBE_SHARE = 0.015  # the most a probe of an idle drafter may cost, as a share of the idle rounds' time
PROBE_ROUNDS = 32  # the fewest idle rounds before a probe; doubled after each probe that did not pay
STEADY_BACKLOG = 2  # the most a drafter lacks after a round it drafted: [d_K, bonus] after a full acceptance
SLOPE_DECAY = 0.998  # the context slope's one-token steps weigh 0.2% less at each one after: ~500 steps, texts apart
SPREAD = 64  # the least spread (weighted s.d., tokens) of the contexts steps were measured at that shows a slope
SLOPE_STEPS = 64  # the fewest one-token steps (aged) a slope stands on
LISTED = 17  # the sizes `BatchCosts.seconds` reads off one list: K + 1 rows up to `-k auto`'s largest K
REPRICE = 0.02  # how far a size's mean moves (a share of it) before what `BatchCosts`' reads kept is found again


class Acceptance(Protocol):
    def expected_tokens(self, k: int) -> float:
        """E[tokens emitted by a round drafting k]: the accepted drafts plus the target's own token."""

    def all_accepted(self, k: int) -> float:
        """P(every one of k drafted tokens is accepted)."""


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
            slope, intercept = weighted_line(means, {m: max(self.calls(m), FLOOR) for m in means})
            self._line, self._since_fit = (max(slope, 0.0), intercept), 0
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


@dataclass
class Position:
    """The tokens the loop's next round follows (`LoopCosts.at`): one a sequence's drafting, shared by the books of
    its ways, which read c_d there. Not the target's book of passes, which every slot shares."""

    context: int = 0


class ContextSlope:
    """How a decode's seconds grow with the context it attends to, b in c(n, L) = c(n) + b·(L − L̄): a decode
    reads the whole cache once whatever it feeds, so each call pays b a token of context. L̄ is the mean context of
    the calls a book's means hold (aged as they are, `decay`); b is the least-squares slope of one-token steps'
    seconds over their contexts, over ~500 steps (`SLOPE_DECAY`), several texts long and short, and stands only
    on `SLOPE_STEPS` steps or more whose contexts spread `SPREAD` tokens (else the slope a cost book brought,
    `prior`): a drafter that seldom drafts (probes of a tiny model's twin) fitted a slope to a few noisy steps.

    Why: a draft model's book is measured only while it drafts. On the demo pair a draft step costs 7.2 ms near a
    text's start and 10.5 ms 600 tokens in; the book kept the long text's price, and the short prompts after it
    priced the draft model ~30% dear and never drafted with it, so never measured it again. The target's book needs
    none of this: its passes are measured every round.

    What `shift` reads, (L̄, b), is found once after the calls change: a round prices a drafter's steps several times
    (~1.6 µs a read on the demo pair, ~9 µs a round, before)."""

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self.prior = 0.0
        self._at = self._at_weight = 0.0  # L̄ × weight, weight
        self._sums = [0.0] * 5  # Σw, ΣwL, Σws, ΣwL², ΣwLs over one-token steps
        self._read: tuple[float, float] | None = None  # (L̄, b) as `shift` last read them, until a change

    def record(self, n: int, seconds: float, context: int) -> None:
        self._at = self._at * self.decay + context
        self._at_weight = self._at_weight * self.decay + 1.0
        if n == 1:  # unrolled: a round records a step per drafted token
            w, wl, ws, wll, wls = self._sums
            d = SLOPE_DECAY
            self._sums = [w * d + 1.0, wl * d + context, ws * d + seconds, wll * d + context * context,
                          wls * d + context * seconds]
        self._read = None

    @property
    def at(self) -> float | None:
        """L̄: the mean context of the calls measured (None before any)."""
        return self._at / self._at_weight if self._at_weight else None

    @property
    def slope(self) -> float:
        """b: seconds a token of context adds to a decode, never below 0."""
        w, wl, ws, wll, wls = self._sums
        spread = wll * w - wl * wl
        if w < SLOPE_STEPS or spread < (SPREAD * w) ** 2:
            return self.prior
        return max(0.0, (wls * w - wl * ws) / spread)

    def shift(self, context: int) -> float:
        """b·(L − L̄): what a decode at context `context` costs beyond the book's means."""
        if self._read is None:
            if not self._at_weight:
                return 0.0
            self._read = (self._at / self._at_weight, self.slope)
        at, slope = self._read
        return slope * (context - at)

    def as_dict(self) -> dict[str, float]:
        return {"at": self.at or 0.0, "slope": self.slope}

    def seed(self, kept: dict[str, float], weight: float) -> None:
        """Start from a cost book's (`as_dict`'s form): L̄ as `weight` calls, its slope as the prior."""
        self._at, self._at_weight = weight * float(kept["at"]), weight
        self.prior = max(0.0, float(kept["slope"]))
        self._read = None

    def merge(self, other: ContextSlope) -> None:
        self._at, self._at_weight = self._at + other._at, self._at_weight + other._at_weight
        self._sums = [mine + theirs for mine, theirs in zip(self._sums, other._sums)]
        self.prior = self.prior or other.prior
        self._read = None


@dataclass
class LoopCosts:
    """c_d(n) by batch size for a drafter of cost shape `shape`, c_v(R) by rows, and o per emitted token, as
    measured so far.

    c_v is the target's, whoever drafted: books that price different drafters share one (`sharing`), which is also
    the planner's c(R) (`Planner.meet`), so that a pass is booked once, by rows, whatever ran it. c_d is read at the
    context the loop is at now (`at`, a `Position` the books of one sequence's drafting share), by how the draft's
    decodes grow with context (`ContextSlope`): the target's passes are measured every round, the draft's only while
    it drafts."""

    decay: float = 1.0
    shape: str = PER_TOKEN
    draft: BatchCosts = field(init=False)
    verify: BatchCosts = field(init=False)
    draft_context: ContextSlope = field(init=False)
    position: Position = field(default_factory=Position)
    other_s: float = 0.0
    other_tokens: float = 0.0
    row_s: float = 0.0  # the work on a verify pass's rows (their p, a grammar's masks) where c_v is the pass alone
    rows: float = 0.0

    def __post_init__(self) -> None:
        self.draft, self.verify = BatchCosts(self.decay), BatchCosts(self.decay)
        self.draft.follows = self.verify  # the machine's load, read off the passes measured every round
        self.draft_context = ContextSlope(self.decay)

    @classmethod
    def sharing(cls, verify: BatchCosts, decay: float, shape: str, position: Position) -> LoopCosts:
        """A book of its own drafter's steps (of cost shape `shape`) and loop work over the target's passes
        `verify`, read at its sequence's `position`."""
        costs = cls(decay, shape, position=position)
        costs.verify = costs.draft.follows = verify
        return costs

    def record_round(self, steps: list[tuple[int, float]], k: int, verify_s: float, round_s: float,
                     emitted: int, context: int = 0, pass_s: float | None = None) -> None:
        """One round at `context` tokens: its draft steps (tokens fed, seconds), its verify pass over its K + 1 rows
        with the work on their logits (`verify_s`), and all it took, `emitted` tokens. Where whoever ran the pass booked
        it (a scheduler books c_v by the rows of every sequence: each booking the whole pass against its own K + 1 rows
        priced a lone round at a batch's pass), `pass_s` is the pass alone, and the rest of `verify_s` the work on its
        rows (`per_row`; left out, a tiny model's one-row pass under a grammar read ~110 µs where it and the work on
        its row took ~220, and the default there no longer took the memory's proposals)."""
        self.record_draft(steps, context)
        if pass_s is None:
            self.verify.record(k + 1, verify_s)
        else:
            self.row_s = self.row_s * self.decay + max(0.0, verify_s - pass_s)
            self.rows = self.rows * self.decay + k + 1
        self.other_s = self.other_s * self.decay + max(0.0, round_s - verify_s - sum(s for _, s in steps))
        self.other_tokens = self.other_tokens * self.decay + emitted

    def at(self, context: int) -> None:
        """The loop's next round follows `context` tokens: c_d is read there (every book sharing this one's position)."""
        self.position.context = context

    def record_draft(self, steps: list[tuple[int, float]], context: int = 0) -> None:
        """Draft-model decodes at about `context` tokens, (tokens fed, seconds) each; a prompt's is the size of a
        large catch-up. A book of cost shape `HOST` keeps none: its drafter decodes nothing, and nothing reads them
        (the default's own book was given every step its drafters took, ~5 records a model round, which their own
        books keep)."""
        if self.shape == HOST:
            return
        for n, seconds in steps:
            self.draft.record(n, seconds)
            self.draft_context.record(n, seconds, context)

    def merge(self, other: LoopCosts) -> None:
        self.draft.merge(other.draft)
        self.verify.merge(other.verify)
        self.draft_context.merge(other.draft_context)
        self.position.context = other.position.context
        self.other_s += other.other_s
        self.other_tokens += other.other_tokens
        self.row_s += other.row_s
        self.rows += other.rows

    @property
    def per_row(self) -> float:
        """The work on each row of a verify pass whose c_v is the pass alone (`record_round`)."""
        return self.row_s / self.rows if self.rows else 0.0

    @property
    def per_token(self) -> float:
        """o: the loop's own seconds per emitted token."""
        return self.other_s / self.other_tokens if self.other_tokens else 0.0

    def draft_seconds(self, k: int, acceptance: Acceptance) -> float | None:
        """Expected drafting seconds of a round drafting k, in the steady state, at the context the loop is at now.
        Host only: none. Per token: k steps of c_d(1), and c_d(2) − c_d(1) more when the round before was fully
        accepted (the catch-up on [d_K, bonus]). Per round: one pass over the block of k + 1, c_d(k + 1)."""
        if self.shape == HOST or k == 0:
            return 0.0
        if self.shape == PER_ROUND:
            block = self.draft.seconds(k + 1)
            return None if block is None else self._now(block)
        step, catch_up = self.draft.seconds(1), self.draft.seconds(2)
        if step is None or catch_up is None:
            return None
        return k * self._now(step) + acceptance.all_accepted(k) * (catch_up - step)

    def _now(self, seconds: float) -> float:
        """A draft decode the book measured at `seconds`, at the context the loop is at now (`ContextSlope.shift`).
        A slope fitted over noise never prices a decode below half its measured mean."""
        return seconds + max(self.draft_context.shift(self.position.context), -seconds / 2)

    def round_seconds(self, k: int, acceptance: Acceptance) -> float | None:
        """Expected seconds of a round drafting k: drafting (as the shape says), c_v(k + 1) with the work on its rows,
        o per emitted token."""
        verify, draft = self.verify.seconds(k + 1), self.draft_seconds(k, acceptance)
        if verify is None or draft is None:
            return None
        return draft + verify + self.per_row * (k + 1) + self.per_token * acceptance.expected_tokens(k)

    def rate(self, k: int, acceptance: Acceptance) -> float | None:
        """Expected tokens per second of rounds drafting k; None while a cost it needs is unmeasured."""
        seconds = self.round_seconds(k, acceptance)
        return acceptance.expected_tokens(k) / seconds if seconds else None

    def best_k(self, acceptance: Acceptance, ks: Iterable[int]) -> int | None:
        """The K among `ks` with the highest expected rate; None while a cost it needs is unmeasured."""
        rates = {k: self.rate(k, acceptance) for k in ks}
        if not rates or None in rates.values():
            return None
        return max(rates, key=lambda k: rates[k] or 0.0)

    def peak_rate(self, acceptance: Acceptance, k: int, most: int) -> float | None:
        """The expected rate at the best K within 1..`most`, climbed to from `k` while a K one further yields more (the
        rate rises to one peak as K grows): a few rates, where `best_k` over every K of 16 texts cost the default
        ~0.5 ms a new text on the demo pair. None while a cost it needs is unmeasured."""
        rate = self.rate(k, acceptance)
        if rate is None:
            return None
        for step in (1, -1):
            while 1 <= k + step <= most:
                further = self.rate(k + step, acceptance)
                if further is None or further <= rate:
                    break
                k, rate = k + step, further
        return rate

    def step_costs(self, backlog: int) -> tuple[float, float] | None:
        """(seconds a drafted token adds, seconds a round that drafts at all adds) for a drafter that lacks `backlog`
        tokens: per token, c_d(1) a token and c_d(backlog) − c_d(1) once, as its first draft step feeds the backlog (K
        tokens cost c_d(backlog) + (K − 1)·c_d(1), as `draft_seconds` prices a steady round; a step more made a fully
        accepted round look ~9 ms dearer to the planner than to the default's regimes, and the planner gave the draft
        model K = 0 while its regime stayed in use); per round, the block's pass once; host only, nothing. None while a
        cost it needs is unmeasured."""
        if self.shape == HOST:
            return 0.0, 0.0
        if self.shape == PER_ROUND:
            block = self.draft.seconds(2)
            return None if block is None else (0.0, self._now(block))
        step = self.draft.seconds(1)
        catch_up = self.draft.interpolated(backlog) if backlog > 1 else 0.0
        if step is None or catch_up is None:
            return None
        return self._now(step), max(0.0, self._now(catch_up) - self._now(step)) if backlog > 1 else 0.0

    def as_dict(self) -> dict[str, object]:
        return {"draft_step_s": self.draft.as_dict(), "verify_s": self.verify.as_dict(),
                "other_per_token_s": self.per_token}


def probe_rounds(price: float, round_s: float) -> int:
    """The one rule for trying an option the loop has stopped choosing: a probe is made once its price is at most
    `PROBE_SHARE` of the idle rounds it sat out, each `round_s` seconds (a round alone, or a sequence's share of a
    batch's pass), so that probes cost at most that share whatever the drafter. Returns how many idle rounds that
    takes."""
    return math.ceil(price / (PROBE_SHARE * round_s)) if round_s > 0 else 0
