"""What a round of the draft-and-verify loop costs on this machine, measured as the loop runs.

Three costs make up a round that drafts K tokens and emits E of them:
- c_d(n), a draft-model step that feeds n tokens (n = 1 while drafting; the catch-up at the start of a round
  feeds 1 token after a rejection and 2, [d_K, bonus], after a fully accepted round, more after n-gram
  rounds the model sat out); for a drafter that drafts a block in one pass (DFlash), c_d(K + 1) is that pass;
- c_v(R), the target's pass over R rows with the verification work on their logits: a round alone verifies
  [last, d1..dK], R = K + 1; a scheduler's pass holds every sequence's rows;
- o, the loop's own work per emitted token (detokenising, the consumer of the events, rewinding).

c_d and c_v are each a book of calls by size (`batch_costs.BatchCosts`), measured as the loop runs.

How c_d grows with K is the drafter's cost shape, which each drafter declares in its own module
(`Drafter.cost_shape`): host time only (a lookup), a step per drafted token (a draft model, a head), or one pass
per round (a block drafter). `round_seconds` and `step_costs` put them together; the hybrid drafter's regimes, the
planner's goodput choice, the cost book's reading and `spec bench`'s prediction all read them, so the bench's
predicted column checks the very model the loop optimises. So does the one rule for when an idle drafter is
tried again (`probe_rounds`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Protocol

from spec_cli.decoding.batch_costs import BatchCosts


# How a round's drafting cost grows with K (`LoopCosts.draft_seconds`): a lookup costs host time only, no decode;
# a draft model or a head takes a step per drafted token; a block drafter (DFlash) one pass per round.
HOST, PER_TOKEN, PER_ROUND = "host", "per token", "per round"
DECAY = 0.95  # every call weighs 5% less at each call recorded after it: the costs follow the machine's load
PROBE_SHARE = 0.015  # the most a probe of an idle drafter may cost, as a share of the idle rounds' time
PROBE_ROUNDS = 32  # the fewest idle rounds before a probe; doubled after each probe that did not pay
STEADY_BACKLOG = 2  # the most a drafter lacks after a round it drafted: [d_K, bonus] after a full acceptance
LEFT_SHARE = 0.5  # of the tokens a generation may still emit, those a drafter's entry (its catch-up beyond a steady
# round's) is expected to pay back over, where no answer has said how long answers run (`RegimeEntry.ahead`,
# `Planner._candidate`)
SLOPE_DECAY = 0.998  # the context slope's one-token steps weigh 0.2% less at each one after: ~500 steps, texts apart
SPREAD = 64  # the least spread (weighted s.d., tokens) of the contexts steps were measured at that shows a slope
SLOPE_STEPS = 64  # the fewest one-token steps (aged) a slope stands on


class Acceptance(Protocol):
    def expected_tokens(self, k: int) -> float:
        """E[tokens emitted by a round drafting k]: the accepted drafts plus the target's own token."""

    def all_accepted(self, k: int) -> float:
        """P(every one of k drafted tokens is accepted)."""


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
