"""The loop's clock: what each step of a round took, in wall time and inside llama.cpp, written into `Stats`,
and each round's costs into the cost books (`LoopCosts`) that `-k auto` and the hybrid drafter price rounds
with. Kept apart from the loop so that the loop reads as its algorithm."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator, Protocol, Sequence

from spec_cli.decoding.costs import LoopCosts
from spec_cli.decoding.stats import Stats


class InLlama(Protocol):
    """What spends time in llama.cpp and counts it: a context, a head (a drafter's `clocks`)."""

    busy_s: float
    rollback_s: float


class RoundTimer:
    """Times the prompt, then each round's steps. `parts` are what decodes (the target's context, the
    drafter's `clocks`); `running` the pair's running cost books, which outlive the generation, and which its rounds are
    recorded in besides its own (`stats.costs`): all but the verify pass, which the scheduler that ran it books there,
    once, by the rows of every sequence in it (`Planner.passed`), and the work on its rows apart.

    A step's wall time goes to its share (drafting, verification); the time in llama.cpp is read once a round, at
    its end (`end_round`): everything the parts decoded since the prompt was in or the last round ended, which is
    all the round's work (the verify pass a scheduler ran for it included, whatever step it fell in), as nothing
    decodes for a generation between its rounds."""

    def __init__(self, stats: Stats, parts: Sequence[InLlama], running: Sequence[LoopCosts]) -> None:
        self.stats, self.parts = stats, parts
        self.books = [stats.costs, *running]
        self._rollback_base = 0.0  # rollback counted before this generation's rounds (the prompt's snapshot)
        self._decode_start = self._round_start = self._prompt_start = time.perf_counter()
        self._busy_at = 0.0  # the parts' seconds in llama.cpp when the prompt was in or the last round ended
        self._verify_s = 0.0
        self._pass_s = 0.0  # the verify pass alone, as the scheduler timed it
        self._step_start = 0.0

    def _in_llama(self) -> tuple[float, float]:
        """(all seconds in llama.cpp, the part spent on rollback) so far."""
        busy = rollback = 0.0
        for part in self.parts:
            busy, rollback = busy + part.busy_s, rollback + part.rollback_s
        return busy, rollback

    def prompt_started(self) -> None:
        """Taking in the prompt begins; it lasts until `prompt_done` (`prompt_s`), and decoding time starts after it."""
        self._prompt_start = time.perf_counter()
        self._rollback_base = self._in_llama()[1]  # the contexts count across generations

    def prompt_done(self, context: int) -> None:
        """The prompt is in: the first round follows its `context` tokens, where the books price it (`LoopCosts.at`)."""
        for book in self.books:
            book.at(context)
        self._busy_at, self._rollback_base = self._in_llama()
        self._decode_start = time.perf_counter()
        self.stats.prompt_s = self._decode_start - self._prompt_start

    def start_round(self) -> None:
        self._round_start = time.perf_counter()
        self._verify_s = self._pass_s = 0.0

    def verified(self, seconds: float) -> None:
        """The verify pass a scheduler ran for this round (with other sequences'): its wall time."""
        self.stats.verify_s += seconds
        self._verify_s += seconds
        self._pass_s += seconds

    @contextmanager
    def step(self, share: str) -> Iterator[None]:
        """One step of a round: its wall time into `share` ("draft_s", "verify_s")."""
        self.begin_step()
        yield
        self.end_step(share)

    def begin_step(self) -> None:
        """A step that `end_step` ends (a scheduler's drafting, which spans its other sequences' steps)."""
        self._step_start = time.perf_counter()

    def end_step(self, share: str) -> None:
        elapsed = time.perf_counter() - self._step_start
        setattr(self.stats, share, getattr(self.stats, share) + elapsed)
        if share == "verify_s":
            self._verify_s += elapsed

    def tick(self) -> None:
        """Decoding time so far, as live views read it."""
        self.stats.decode_s = time.perf_counter() - self._decode_start

    def caught_up(self, steps: list[tuple[int, float]], context: int) -> None:
        """The drafter's decodes of a chunk of its catch-up between rounds (large sizes), up to `context` tokens,
        for the cost books."""
        for book in self.books:
            book.record_draft(steps, context)

    def end_round(self, steps: list[tuple[int, float]], drafted: int, emitted: int, context: int) -> None:
        """Book the round, which followed `context` tokens: its time in llama.cpp, its draft steps, its verify pass
        over `drafted` + 1 tokens, all it took."""
        self.tick()
        busy, rollback = self._in_llama()
        self.stats.llama_s += busy - self._busy_at
        self._busy_at = busy
        self.stats.rollback_s = rollback - self._rollback_base
        round_s = time.perf_counter() - self._round_start
        for book in self.books:
            pass_s = None if book is self.stats.costs else self._pass_s  # the scheduler books the pass there
            book.record_round(steps, drafted, self._verify_s, round_s, emitted, context, pass_s)
            book.at(context + emitted)
