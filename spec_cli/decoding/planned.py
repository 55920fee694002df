"""A sequence as the planner sees it (`Planned`): how long its drafter has sat out, when it is due a probe, whether
the planner chooses its K at all, and the most it may draft next round. The planner (`planner`) and the choices that
stand over several of its steps read them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from spec_cli.decoding.costs import PROBE_ROUNDS
from spec_cli.decoding.draft_length import AdaptiveK

if TYPE_CHECKING:
    from spec_cli.decoding.engine import Generation


@dataclass(eq=False)  # one sequence, equal only to itself: the quiet rule compares lists of them every step
class Planned:
    """A generation the planner plans for: how long its drafter has been idle (K = 0) and may stay so before the next
    probe (`probe_after`, and `priced_after`: the idle rounds its probe's price needs, as last read, so that an idle
    step does not price it again)."""

    generation: Generation
    idle: int = 0
    probe_after: int = PROBE_ROUNDS
    priced_after: int = 0
    probing: bool = False
    offers: list[str] = field(default_factory=list)  # the ways its drafter offered this step, its preferred first
    moot: bool = False  # whether its drafter's preferred way, when last asked, was no draft: nothing to probe
    adaptive: bool = field(init=False)  # whether the planner chooses its K (`chooses_k`), for its whole life

    def __post_init__(self) -> None:
        self.adaptive = chooses_k(self.generation)

    @property
    def probe_may_be_due(self) -> bool:
        """Whether its drafter has sat out the rounds a probe waits for, and those its price needed when last read. A
        drafter of several ways whose own choice was no draft has no probe to make: a probe drafts the way it prefers,
        and each step that chooses asks it afresh (on a tiny model such probes, drafting nothing, cut every streak of
        quiet steps at `PROBE_ROUNDS` and made a full choice every ~30 steps, 3% of the target alone's speed)."""
        return self.adaptive and not self.moot and self.idle >= max(self.probe_after, self.priced_after)


def probes_after(generating: list[Planned]) -> list[int]:
    """The steps until each drafter may be due a probe (`Planned.probe_may_be_due`)."""
    return [max(r.probe_after, r.priced_after) - r.idle for r in generating if r.adaptive and not r.moot]


def draft_cap(generation: Generation) -> int:
    """The most `generation` may draft next round: its controller's largest K, within the tokens it has room for."""
    return max(0, min(generation.draft_length.k_max, generation.room() - 1))


def chooses_k(generation: Generation) -> bool:
    """Whether the planner chooses this generation's K: under `-k auto`, for a drafter of one way (its controller of K
    only keeps its acceptance) or of several (`Drafter.chooses_ways`: each way it offers is priced here); a fixed K is
    the request's."""
    if generation.drafter is None:
        return False
    return isinstance(generation.draft_length, AdaptiveK) or (
        generation.stats.adaptive and generation.drafter.chooses_ways)
