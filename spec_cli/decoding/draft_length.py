"""How many tokens to draft next round: a fixed K, or K chosen from measured acceptance and costs.

With per-token acceptance probability α, a round that drafts K tokens emits on average
E[tokens](K) = (1 − α^(K+1)) / (1 − α) (Leviathan et al. 2023). Acceptance is tracked per draft position
instead (`PositionAcceptance`), since later positions are accepted less often, and a round's cost comes from
`costs.LoopCosts`: K draft steps with the catch-up a fully accepted round leaves, the target's pass over
K + 1 tokens, and the loop's own work per token. `AdaptiveK` keeps what the planner reads for a drafter under
`-k auto`; until it has measured enough the drafter is tried with the transformers heuristic (K + 2 after a fully
accepted round, K − 1 otherwise), which also explores K.

Under `-k auto` the planner chooses K (`planner`, `goodput`), 0 included: where drafting does not pay (a draft
dearer than its target, one the target seldom agrees with) the loop runs as the target alone, so that speculation
never costs.
"""

from __future__ import annotations

from collections import deque
from itertools import accumulate
from operator import add, mul
from typing import Protocol, Sequence

from spec_cli.decoding.batch_costs import RESCALE
from spec_cli.decoding.costs import LoopCosts

PRIOR_WEIGHT = 3.0  # pseudo-rounds at α̂ behind each position's rate
AUTO_K_MAX = 16  # the largest K `-k auto` chooses
TEXTS_KEPT = 16  # the last texts whose own acceptance a pool keeps (`Pool.texts`)
TEXT_ROUNDS = 3  # the rounds a text must have drafted for its acceptance to be kept as one of them
POOLED_DECAY = 0.995  # of an acceptance pooled over every text (`Pool.every`): ~200 rounds, several answers


def expected_tokens(alpha: float, k: int) -> float:
    """E[tokens per round] = (1 − α^(K+1)) / (1 − α): accepted drafts plus the target's own token."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class PositionAcceptance:
    """a_i = P(d_i accepted | d_1..d_{i−1} accepted), counted per draft position i.

    E[tokens](K) = 1 + Σ_{i≤K} a_1·…·a_i and P(all K accepted) = a_1·…·a_K. Positions seldom reached lean on
    the overall α̂ (the truncated-geometric estimate Σ accepted / (Σ accepted + rounds that ended in a
    rejection)). Before any round α̂ is 1: optimism that gets a drafter tried (and measured) before a
    hybrid drafter weighs it against the others; one round corrects it. Counts decay by `decay` a round, so
    the estimates follow the text (code and prose differ); 1 keeps plain counts. The counts are plain lists:
    `update` runs every round right after a decode, when each NumPy call costs microseconds. They age lazily, as
    `batch_costs.BatchCosts`' calls do: the positions' counts are kept × `_scale`, which grows by 1/decay a round, so a
    round adds to the positions it reached only (aging every position cost ~3 µs a round for each of the four
    acceptances a default round updates). So are the rates and what they imply for K up to `AUTO_K_MAX`, computed once
    after the counts change (`_table`): the planner reads them many times a round.

    `pooled`, where set, takes every round this one takes, and a new text starts from it (`new_text`): the
    acceptance of every text before, of which the last text's is only a part (`Pool`).
    """

    def __init__(self, decay: float = 1.0, prior_weight: float = PRIOR_WEIGHT) -> None:
        self.decay = decay
        self.prior_weight = prior_weight
        self.pooled: Pool | None = None
        self.accepted = 0.0
        self.rejections = 0.0
        self._reached: list[float] = []  # rounds that reached each position, × `_scale`
        self._accepted_at: list[float] = []  # rounds that kept each position, × `_scale`
        self._scale = 1.0
        self._cached: tuple[list[float], list[float], list[float]] | None = None  # `_table`'s

    @classmethod
    def from_counts(cls, reached: Sequence[int], accepted_at: Sequence[int], rejections: int) -> PositionAcceptance:
        """Plain counts, as `Stats` keeps them, taken as they are (no prior: a benchmark's counts are final)."""
        acceptance = cls(prior_weight=0.0)
        acceptance._grow(len(reached))
        acceptance._reached[:] = map(float, reached)
        acceptance._accepted_at[:len(accepted_at)] = map(float, accepted_at)
        acceptance.accepted, acceptance.rejections = float(sum(accepted_at)), float(rejections)
        acceptance._cached = None
        return acceptance

    @property
    def reached(self) -> list[float]:
        """How many rounds (decayed) reached each position: drafted it with every earlier one kept."""
        return [count / self._scale for count in self._reached]

    @property
    def accepted_at(self) -> list[float]:
        """How many rounds (decayed) kept each position."""
        return [count / self._scale for count in self._accepted_at]

    @property
    def alpha(self) -> float:
        total = self.accepted + self.rejections
        return self.accepted / total if total else 1.0

    def update(self, drafted: int, accepted: int) -> None:
        """A round kept `accepted` of `drafted` tokens."""
        self._grow(drafted)
        decay, reached_to = self.decay, min(accepted + 1, drafted)  # positions drafted with every earlier one kept
        self.accepted = self.accepted * decay + accepted
        self.rejections = self.rejections * decay + (accepted < drafted)
        if decay != 1.0:
            self._scale /= decay
            if self._scale > RESCALE:
                self.forget(1.0)
        scale, reached, kept = self._scale, self._reached, self._accepted_at
        for i in range(reached_to):
            reached[i] += scale
        for i in range(accepted):
            kept[i] += scale
        self._cached = None
        if self.pooled is not None:
            self.pooled.update(drafted, accepted)

    def new_text(self, rounds: float) -> None:
        """A new text starts again from the acceptance pooled over every text (`pooled`), worth at most `rounds`
        rounds. The last text's is a prior, not this one's rate: the demo pair's draft model keeps 0.97 of its
        drafts on code and 0.78 on a rewrite (where it drafts what the lookup could not), and an answer that began
        from the rewrite's priced the model below the target alone on code, where it was then never tried."""
        if self.pooled is not None and self.pooled.every.measured:
            self.seed(self.pooled.every.as_counts(), rounds)

    def as_counts(self) -> dict[str, float | list[float]]:
        """The counts, as a cost book keeps them."""
        return {"accepted": self.accepted, "rejections": self.rejections, "reached": self.reached,
                "accepted_at": self.accepted_at}

    def seed(self, counts: dict[str, float | list[float]], rounds: float) -> None:
        """Start from counts learnt before (`as_counts`'s), worth at most `rounds` rounds: a prior that the
        rounds measured now soon outweigh."""
        reached, accepted_at = list(counts["reached"]), list(counts["accepted_at"])  # type: ignore[arg-type]
        self._reached = [float(x) for x in reached]
        self._accepted_at = [float(x) for x in accepted_at] + [0.0] * (len(reached) - len(accepted_at))
        self._scale = 1.0
        self.accepted = float(counts["accepted"])  # type: ignore[arg-type]
        self.rejections = float(counts["rejections"])  # type: ignore[arg-type]
        self._cached = None
        self.cap(rounds)

    @property
    def measured(self) -> float:
        """How many rounds' worth the counts hold (decayed): rounds that drafted a first token."""
        return self._reached[0] / self._scale if self._reached else 0.0

    def forget(self, keep: float) -> None:
        """Scale every count by `keep`: what was learnt weighs less against what comes next (the positions' counts
        brought back to real rounds as well)."""
        self.accepted, self.rejections = self.accepted * keep, self.rejections * keep
        factor = keep / self._scale
        self._reached = [count * factor for count in self._reached]
        self._accepted_at = [count * factor for count in self._accepted_at]
        self._scale = 1.0
        self._cached = None

    def cap(self, rounds: float) -> None:
        """What was learnt weighs at most `rounds` rounds: a prior that the rounds measured next soon outweigh."""
        if self.measured > rounds:
            self.forget(rounds / self.measured)

    def _grow(self, k: int) -> None:
        if k > len(self._reached):
            self._reached += [0.0] * (k - len(self._reached))
            self._accepted_at += [0.0] * (k - len(self._accepted_at))
        self._cached = None

    def _rates(self, k: int) -> list[float]:
        """a_1..a_k, each position's counts shrunk towards α̂ by `prior_weight` pseudo-rounds: a position
        reached three times is mostly α̂, one reached fifty times is its own (a single early rejection at
        position 3 used to pull K down for a whole generation)."""
        w, alpha, scale = self.prior_weight, self.alpha, self._scale
        prior = w * alpha
        w_s, prior_s = w * scale, prior * scale  # the counts are kept × scale
        rates = [(accepted + prior_s) / max(reached + w_s, 1e-9 * scale) if reached + w_s > 0 else alpha
                 for reached, accepted in zip(self._reached[:k], self._accepted_at)]
        unseen = prior / max(w, 1e-9) if w > 0 else alpha  # a position never reached
        return rates + [unseen] * (k - len(rates))

    def _table(self, k: int) -> tuple[list[float], list[float], list[float]]:
        """(a_1..a_n, E[tokens](0..n), P(all accepted)(0..n)) for n ≥ k, from the cache while the counts stand."""
        if self._cached is None or len(self._cached[0]) < k:
            rates = self._rates(max(k, AUTO_K_MAX))
            all_accepted = list(accumulate(rates, mul, initial=1.0))
            self._cached = (rates, list(accumulate(all_accepted, add)), all_accepted)
        return self._cached

    def rates(self, k: int) -> list[float]:
        """a_1..a_k (`_rates`)."""
        return self._table(k)[0][:k]

    def gains(self, k: int) -> list[float]:
        """g_1..g_k, g_i = a_1·…·a_i: the chance each draft position is kept (what the goodput choice reads)."""
        return self._table(k)[2][1:k + 1]

    def expected_tokens(self, k: int) -> float:
        return self._table(k)[1][k]

    def all_accepted(self, k: int) -> float:
        return self._table(k)[2][k]


class Pool:
    """An own drafter's acceptance over every text (`every`, decayed by `decay` a round), and each of the last texts'
    it drafted in (`texts`, each its own rounds): the spread of its acceptance from text to text, which a trial on a
    new text is weighed against (the default drafting's `HybridDrafter._trial`). Every controller of the drafter adds
    its rounds here (`PositionAcceptance.pooled`)."""

    def __init__(self, decay: float, shared: Pool | None = None) -> None:
        """`shared`: another sequence's pool of the same drafter (a slot of `--parallel` shares its pair's), whose
        acceptance over every text and last texts this one adds to and reads: a drafter keeps about as much of its
        drafts on one sequence as on another, and a batch learns it from all of them at once."""
        self.every = shared.every if shared is not None else PositionAcceptance(decay)
        self.text = PositionAcceptance()  # this sequence's text's rounds, plain counts
        self.texts: deque[PositionAcceptance] = shared.texts if shared is not None else deque(maxlen=TEXTS_KEPT)

    def update(self, drafted: int, accepted: int) -> None:
        self.every.update(drafted, accepted)
        self.text.update(drafted, accepted)

    def new_text(self) -> None:
        """The text drafted in so far ends: its acceptance is kept where it drafted `TEXT_ROUNDS` rounds or more."""
        if self._text_kept:
            self.texts.append(self.text)
        if self.text.measured:
            self.text = PositionAcceptance()

    @property
    def known(self) -> bool:
        """Whether some text's acceptance is known: one kept, or this text's rounds enough to be kept."""
        return bool(self.texts) or self._text_kept

    @property
    def _text_kept(self) -> bool:
        """Whether the text drafted in so far would be kept if it ended now (`TEXT_ROUNDS`)."""
        return self.text.measured >= TEXT_ROUNDS

    def kept(self) -> list[PositionAcceptance]:
        """The last texts' acceptance, the one drafted in so far among them where it would be kept if it ended now."""
        return [*self.texts, self.text][-TEXTS_KEPT:] if self._text_kept else list(self.texts)


class DraftLength(Protocol):
    k_max: int
    """The most tokens a round may draft."""
    acceptance: PositionAcceptance
    """What rounds drafted at this controller's K kept; a hybrid drafter compares drafters by it."""

    def next_k(self) -> int:
        """K for the next round (the engine still shrinks it to fit max_tokens and the context)."""

    def update(self, drafted: int, accepted: int) -> None:
        """Learn from a finished round: `accepted` of `drafted` kept."""

    def seed(self, counts: dict[str, float | list[float]], rounds: float) -> None:
        """Start from acceptance learnt before (a cost book's), worth at most `rounds` rounds."""


class FixedK:
    def __init__(self, k: int, decay: float = 0.98) -> None:
        self.k_max = k
        self.acceptance = PositionAcceptance(decay)

    def seed(self, counts: dict[str, float | list[float]], rounds: float) -> None:
        self.acceptance.seed(counts, rounds)

    def next_k(self) -> int:
        return self.k_max

    def update(self, drafted: int, accepted: int) -> None:
        if drafted:
            self.acceptance.update(drafted, accepted)


class AdaptiveK:
    """K under `-k auto` for a drafter of one way: the planner chooses it each round (`planner`, `goodput`) from this
    controller's acceptance and its drafter's book (`costs`, which knows the drafter's cost shape), K = 0 and the
    probes of an idle drafter included. Until the acceptance is measured (`warmup_rounds` rounds, or a cost book's
    seeded), the drafter is tried at the K of the transformers heuristic (`next_k`), which also explores K.
    """

    def __init__(self, costs: LoopCosts, k_max: int, k_start: int = 4, warmup_rounds: int = 3,
                 decay: float = 0.98) -> None:
        self.costs = costs
        self.k_max = k_max
        self.k = min(k_start, k_max)
        self.warmup_rounds = warmup_rounds
        self.rounds = 0
        self.acceptance = PositionAcceptance(decay)

    @property
    def priced(self) -> bool:
        """Whether the acceptance is measured enough for the planner to price this drafter's rounds."""
        return self.rounds >= self.warmup_rounds

    def seed(self, counts: dict[str, float | list[float]], rounds: float) -> None:
        """Start from acceptance learnt before (a cost book's): priced at once, where the book has the costs too."""
        self.acceptance.seed(counts, rounds)
        if self.costs.round_seconds(1, self.acceptance) is not None:
            self.rounds = self.warmup_rounds

    def next_k(self) -> int:
        """The warm-up's K: +2 after a fully accepted round, −1 otherwise."""
        return self.k

    def update(self, drafted: int, accepted: int) -> None:
        if drafted == 0:
            return
        self.rounds += 1
        self.acceptance.update(drafted, accepted)
        if not self.priced:
            self.k = min(self.k_max, self.k + 2) if accepted == drafted else max(1, self.k - 1)
