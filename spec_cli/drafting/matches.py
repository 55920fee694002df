"""A lookup's acceptance by the length of the match its proposal follows.

A lookup (the memory, n-gram lookup) proposes what followed the longest suffix of the sequence it found before:
the longer that match m, the likelier the continuation is the target's. On the demo pair the memory's proposals
after m ≥ 8 matching tokens kept 4.4 tokens each (a_1 = 0.90), after 4–7 tokens 1.4 (0.71), after 2–3 tokens 0.6
(0.35). One acceptance for them all priced an isolated 3-token match like a stretch of copied code, and a copy
stretch like a chance match: the default drafted chance matches on prose and sat out copied code on a busy machine.
So each band of m keeps its own acceptance by position, which the default drafting prices a proposal by.
"""

from __future__ import annotations

from spec_cli.decoding.draft_length import PositionAcceptance
from spec_cli.drafting.suffix import KEYS

BANDS = KEYS  # the shortest match of each band: the suffix index's n-gram lengths
FIRST_ROUNDS = 2.0  # rounds' worth of the lookup's acceptance over every match that a new band starts from


# `band` of each match shorter than the longest band's start: asked several times a round, read off a table.
_BAND_OF = [max((start for start in BANDS if match >= start), default=BANDS[0]) for match in range(BANDS[-1])]


def band(match: int) -> int:
    """The band of a match of `match` tokens: the longest of `BANDS` it reaches (a shorter one counts as the first)."""
    return _BAND_OF[match] if match < len(_BAND_OF) else BANDS[-1]


class MatchAcceptance:
    """The acceptance of a lookup's proposals, by band of match length (`band`), each decayed by `decay` a round."""

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self.bands: dict[int, PositionAcceptance] = {}

    def of(self, match: int, every: PositionAcceptance) -> PositionAcceptance:
        """The acceptance of proposals after a match of `match` tokens; a band not seen yet starts from `every` (the
        lookup's over all its proposals), worth `FIRST_ROUNDS` rounds."""
        key = band(match)
        if key not in self.bands:
            acceptance = PositionAcceptance(self.decay)
            if every.measured:
                acceptance.seed(every.as_counts(), FIRST_ROUNDS)
            self.bands[key] = acceptance
        return self.bands[key]

    def forget(self, keep: float) -> None:
        """A new text: what each band learnt weighs `keep` of what it did."""
        for acceptance in self.bands.values():
            acceptance.forget(keep)
