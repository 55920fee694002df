"""What the default drafting learns and keeps across generations (`HybridState`): each way's acceptance, the K the
planner last gave each, every regime's rate (`DecayedRate`), the regime in use and the wait to enter a better one,
and the lengths of the last answers."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from spec_cli.decoding.draft_length import POOLED_DECAY, DraftLength, PositionAcceptance
from spec_cli.drafting.entry import OUT
from spec_cli.drafting.matches import MatchAcceptance, MatchPools

CARRIED = 0.3  # of decayed yields worth ~5 rounds, what a new prompt keeps: about two rounds
LASTING_DECAY = 0.95  # of the regimes' lasting rates (`HybridState.lasting`): ~20 rounds, most of an answer
ANSWERS_KEPT = 16  # the lengths of the last answers (and whether each ended on its own): what an answer still emits
NGRAM = "ngram"
MEMORY = "memory"  # the lookup where the pair keeps a memory of earlier outputs (`Drafting.hybrid_state`)
# What the lookup's acceptance starts from before any proposal: one of two kept (a_1 = α̂ = 0.5), worth two rounds. An
# acceptance never measured reads as 1, the optimism that gets a drafter tried, which the lookup does not need (a
# proposal not taken is scored in hindsight): a fresh process's first chat answer priced the memory's first proposals
# at 3 to 6 tokens where they kept 1 to 2, their burst lifted the rate out of the draft model's regime above it, and
# the answer, left by the model, ran 20 to 80 plain rounds of its 134 tokens (the process's later answers: 2 to 8).
LOOKUP_PRIOR: dict[str, float | list[float]] = {"accepted": 1.0, "rejections": 1.0, "reached": [2.0],
                                                 "accepted_at": [1.0]}


@dataclass
class DecayedRate:
    """Tokens and seconds of rounds, older ones weighing `decay`× less at each new one: a rate that follows
    the text."""

    tokens: float = 0.0
    seconds: float = 0.0

    def add(self, tokens: float, seconds: float, decay: float, rounds: int = 1) -> None:
        """A round of `tokens` in `seconds`, or `rounds` such rounds one after another."""
        keep = decay ** rounds
        added = (1.0 - keep) / (1.0 - decay) if decay < 1.0 else float(rounds)
        self.tokens = self.tokens * keep + tokens * added
        self.seconds = self.seconds * keep + seconds * added

    def scale(self, keep: float) -> None:
        self.tokens, self.seconds = self.tokens * keep, self.seconds * keep

    @property
    def rate(self) -> float | None:
        return self.tokens / self.seconds if self.seconds else None


@dataclass
class HybridState:
    """What a hybrid drafter learns, kept across generations: a K controller (with its acceptance) for
    n-gram lookup and for each own drafter, and the lookup's acceptance by the length of its match (`matches`, which
    prices its proposals); under auto (`ks`), the K the planner last gave each way, which the
    regimes price it at (the planner owns K: the controllers only keep acceptance); for each regime (one own
    drafter in use, or none: `OUT`) the rate its choices would have yielded; the regime in use, the seconds lost
    so far by staying in it while another looked better, and that other's entry price when they began (a backlog
    grows while its drafter waits: a price fixed at the start keeps the rule from chasing it); the lengths of the
    last answers and whether each ended on its own (`answers`: what an entry is expected to pay back over)."""

    lengths: dict[str, DraftLength]
    lookup: str = NGRAM  # the name of the drafter that costs no decode (n-gram lookup, or the memory)
    ks: dict[str, int] = field(default_factory=dict)  # empty under a fixed K: each way's controller's K
    # A regime's yield is priced by the cost model, not measured, so it is smooth: a short memory (~5 rounds)
    # follows the text (a stretch of copied code, then prose) without chasing noise.
    decay: float = 0.8
    regimes: dict[str, DecayedRate] = field(default_factory=dict)
    # The same rates over ~20 rounds, carried whole into a new text: what leaving a drafter's regime saves a token over
    # the rest of an answer, which a burst of a few lookups' rounds does not last for (`RegimeEntry`). A text's first
    # rounds say little of that: scaled at a new text as the short rates are, two of the memory's proposals at a
    # story's second and third rounds (6 tokens for 36 ms each) left the draft model's regime for 15 plain rounds.
    lasting: dict[str, DecayedRate] = field(default_factory=dict)
    answers: deque[tuple[int, bool]] = field(default_factory=lambda: deque(maxlen=ANSWERS_KEPT))  # (length, ended)
    in_use: str = OUT
    regret_s: float = 0.0
    price_s: float = 0.0  # what entering the better regime costs, fixed when staying out began
    pools: MatchPools = field(default_factory=lambda: MatchPools(POOLED_DECAY))  # the lookup's bands over every text
    matches: MatchAcceptance = field(init=False)

    def __post_init__(self) -> None:
        acceptance = self.lengths[self.lookup].acceptance
        if not acceptance.measured:
            acceptance.seed(LOOKUP_PRIOR, float("inf"))
        self.matches = MatchAcceptance(acceptance.decay, self.pools)

    def new_text(self) -> None:
        """A new prompt: the regimes' rates, learnt on other text, count for about two rounds, and so does the
        n-gram's acceptance (a lookup right on copied code is wrong on prose, and the reverse); each band of its
        matches starts again from its acceptance over every text (`MatchAcceptance.new_text`). The own drafters' start
        again from their acceptance over every text (`Drafting.build`)."""
        self.regret_s = 0.0
        for regime in self.regimes.values():
            regime.scale(CARRIED)
        self.lengths[self.lookup].acceptance.forget(CARRIED)
        self.matches.new_text()

    def lookup_acceptance(self, match: int) -> PositionAcceptance:
        """What the lookup's proposals after a match of `match` tokens keep (`MatchAcceptance`)."""
        return self.matches.of(match, self.lengths[self.lookup].acceptance)
