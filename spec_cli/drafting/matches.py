"""A lookup's acceptance by the length of the match its proposal follows.

A lookup (the memory, n-gram lookup) proposes what followed the longest suffix of the sequence it found before:
the longer that match m, the likelier the continuation is the target's. On the demo pair the memory's proposals
after m ≥ 8 matching tokens kept 4.4 tokens each (a_1 = 0.90), after 4–7 tokens 1.4 (0.71), after 2–3 tokens 0.6
(0.35). One acceptance for them all priced an isolated 3-token match like a stretch of copied code, and a copy
stretch like a chance match: the default drafted chance matches on prose and sat out copied code on a busy machine.
So each band of m keeps its own acceptance by position, which the default drafting prices a proposal by.

A text's few proposals teach a band little: each band also learns over every text (`MatchPools`, a `Pool` a band,
which a pair's sequences share and the cost book keeps), and a new text's band starts from that. Kept only as the
last text's, decayed to a share at each new one, a band was mostly its prior: four slots of the demo pair at
`--parallel 4` read the same memory's first position at 0.02 to 0.89 and passed over a third of its proposals, which
kept as many of their tokens as the ones taken.
"""

from __future__ import annotations

from spec_cli.decoding.draft_length import Pool, PositionAcceptance
from spec_cli.drafting.suffix import KEYS

BANDS = KEYS  # the shortest match of each band: the suffix index's n-gram lengths
FIRST_ROUNDS = 2.0  # rounds' worth of the lookup's acceptance over every match that a new band starts from


# `band` of each match shorter than the longest band's start: asked several times a round, read off a table.
_BAND_OF = [max((start for start in BANDS if match >= start), default=BANDS[0]) for match in range(BANDS[-1])]


def band(match: int) -> int:
    """The band of a match of `match` tokens: the longest of `BANDS` it reaches (a shorter one counts as the first)."""
    return _BAND_OF[match] if match < len(_BAND_OF) else BANDS[-1]


class MatchPools:
    """Each band's acceptance over every text, a `Pool` a band (decayed by `decay` a round): a pair's, which each of its
    sequences adds to and reads (`shared`: the pair's, for a slot's), and which the cost book keeps."""

    def __init__(self, decay: float, shared: MatchPools | None = None) -> None:
        self.decay, self._shared = decay, shared
        self.pools: dict[int, Pool] = {}

    def of(self, key: int) -> Pool:
        """The pool of band `key`."""
        if key not in self.pools:
            self.pools[key] = Pool(self.decay, shared=self._shared.of(key) if self._shared is not None else None)
        return self.pools[key]


class MatchAcceptance:
    """The acceptance of a lookup's proposals on this text, by band of match length (`band`), each decayed by `decay` a
    round; each band's rounds join its acceptance over every text (`pools`), which it starts from at a new text."""

    def __init__(self, decay: float, pools: MatchPools) -> None:
        self.decay = decay
        self.pools = pools
        self.bands: dict[int, PositionAcceptance] = {}

    def of(self, match: int, every: PositionAcceptance) -> PositionAcceptance:
        """The acceptance of proposals after a match of `match` tokens; a band not seen yet starts from its acceptance
        over every text, or where it has none from `every` (the lookup's over all its proposals), worth `FIRST_ROUNDS`
        rounds."""
        key = band(match)
        if key not in self.bands:
            acceptance = PositionAcceptance(self.decay)
            acceptance.pooled = self.pools.of(key)
            acceptance.new_text(FIRST_ROUNDS)
            if not acceptance.measured and every.measured:
                acceptance.seed(every.as_counts(), FIRST_ROUNDS)
            self.bands[key] = acceptance
        return self.bands[key]

    def new_text(self) -> None:
        """A new text: each band starts again from its acceptance over every text, worth `FIRST_ROUNDS` rounds."""
        for acceptance in self.bands.values():
            acceptance.new_text(FIRST_ROUNDS)
