"""Which tokens of a sequence a draft model's memory holds: all of them, or, where taking in a long backlog (a
prompt, a stretch drafted another way) would cost more than its share of the target's own prefill, the first
`SINKS` and the latest ones.

A draft's catch-up is a prefill: it should cost at most its share of the target's prefill of the same tokens,
β = the draft's weights over the target's (the cost of a pass that reads the weights once). Where its kernels
make it dearer than that (a quantized draft whose batches run slower per byte than the target's F16/F32
batches, or a draft that decodes one token at a time: `kernels`), it takes in only as many of the latest
tokens as that budget buys, and the first `SINKS` (attention sinks: StreamingLLM, Xiao et al. 2023, keeps a
model's attention well-formed over a window so). The target's tokens are the only truth, so a draft that
reads less of them can only draft less well, never wrongly.
"""

from __future__ import annotations

import time
from typing import Sequence

from spec_cli.llama.context import Context, common_prefix
from spec_cli.llama.vision import image_end

SINKS = 4  # the sequence's first tokens, always held
MIN_WINDOW = 64  # the fewest latest tokens a window holds
MAX_SHARE = 0.5  # β is the draft's share of the weights, at most this


def prefill_share(draft: Context, target: Context) -> float:
    """β: the draft's weights over the target's (its share of a pass that reads them once), at most `MAX_SHARE`."""
    return min(MAX_SHARE, draft.model.size / max(target.model.size, 1))


def window_length(backlog: int, share: float, own_rate: float | None, target_rate: float | None) -> int:
    """How many of the latest `backlog` tokens a draft takes in: all where that costs at most `share` of the target's
    prefill of them, else what that budget buys, at least `MIN_WINDOW`; the rates are seconds per token taken in
    (`Throughput`), all of them while one is unknown."""
    if backlog <= MIN_WINDOW or own_rate is None or target_rate is None:
        return backlog
    return min(backlog, max(MIN_WINDOW, int(share * target_rate * backlog / own_rate)))


class Window:
    """The first `SINKS` tokens of the sequence and those from `start` on (all of them while `start` is 0), which a
    draft's memory holds in that order at its own positions (relative distances within the window kept).

    Held index h stands for sequence index h below `SINKS`, and for `start` + h − `SINKS` from there on. A new
    sequence keeps the window only where its tokens up to `start` are those the window skipped."""

    def __init__(self) -> None:
        self.start = 0
        self._skipped: list[int] = []

    def held(self, n: int) -> int:
        """How many held tokens stand for the first `n` of the sequence."""
        if not self.start or n <= SINKS:
            return n
        return SINKS + max(0, n - self.start)

    def covered(self, held: int) -> int:
        """How many tokens of the sequence the first `held` held tokens stand for (the skipped ones counted)."""
        return held if not self.start or held < SINKS else self.start + held - SINKS

    def tail(self, tokens: Sequence[int], held_from: int) -> list[int]:
        """The held tokens of `tokens` from held index `held_from` on."""
        if not self.start:
            return list(tokens[held_from:])
        sinks = list(tokens[held_from:SINKS]) if held_from < SINKS else []
        return [*sinks, *tokens[self.start + max(0, held_from - SINKS):]]

    def place(self, tokens: Sequence[int], keep: int) -> None:
        """Hold the last `keep` of `tokens` after the sinks (moved past an image the window would cut into); a
        window of nearly all of them is none."""
        start = len(tokens) - keep
        while 0 < start < len(tokens) and tokens[start] < 0:
            start += 1
        if start <= SINKS + 1 or any(token < 0 for token in tokens[:SINKS]):
            self.reset()
            return
        self.start, self._skipped = start, list(tokens[SINKS:start])

    def fits(self, tokens: Sequence[int]) -> bool:
        """Whether `tokens` skip what this window skipped (so that what the memory holds is still theirs)."""
        return not self.start or (len(tokens) >= self.start and list(tokens[SINKS:self.start]) == self._skipped)

    def reset(self) -> None:
        self.start, self._skipped = 0, []


class DraftMemory:
    """What a draft model's context holds of a sequence (its `window`), and the catch-up that brings it up to date:
    with `target`, the target's context, a catch-up costs at most β (`share`) of the target's prefill of the same
    tokens; without, the memory holds every token. Every method takes the sequence in the context's vocabulary (the
    target's tokens for a draft on the target's ids, the draft's spelling of them for a draft through text)."""

    def __init__(self, context: Context, target: Context | None = None) -> None:
        self.context, self.target = context, target
        self.share = prefill_share(context, target) if target is not None else 0.0
        self.window = Window()
        self._planned = 0  # held tokens the catch-up under way reaches: no window is placed before then

    def keep(self, sequence: Sequence[int]) -> None:
        """A new sequence: keep what the memory holds of it (its window too, where it skips what the window did)."""
        if not self.window.fits(sequence):
            self.window.reset()
        self.context.trim(common_prefix(self.context.tokens, self.window.tail(sequence, 0)))
        self._planned = 0

    def lacking(self, sequence: Sequence[int]) -> int:
        """How many held tokens of `sequence` the memory lacks, once the window for them is placed."""
        self._plan(sequence)
        return self.window.held(len(sequence)) - self.context.n_past

    def backlog(self, sequence: Sequence[int]) -> list[int]:
        """The held tokens of `sequence` the memory lacks, once the window for them is placed."""
        self._plan(sequence)
        return self.window.tail(sequence, self.context.n_past)

    def feed(self, sequence: Sequence[int], n: int) -> list[tuple[int, float]]:
        """Take in the next `n` of the backlog (an image they end inside whole); return the decode, (tokens, s)."""
        backlog = self.backlog(sequence)
        fed = backlog[:image_end(backlog, n)]
        if not fed:
            return []
        started = time.perf_counter()
        self.context.decode(fed, 0)
        return [(len(fed), time.perf_counter() - started)]

    def narrow(self, sequence: Sequence[int]) -> None:
        """Hold the sinks and the latest `MIN_WINDOW` of `sequence`, where the memory lacks more of it: the cheapest
        catch-up that drafts."""
        if self.window.held(len(sequence)) - self.context.n_past > MIN_WINDOW:
            self.window.place(sequence, MIN_WINDOW)
            self.context.trim(min(self.context.n_past, SINKS))
            self._planned = self.window.held(len(sequence))

    def rewind(self, n_keep: int) -> None:
        """Only the first `n_keep` tokens of the sequence are still valid."""
        if self.window.start and n_keep < self.window.start:
            self.window.reset()
            self._planned = 0
            self.context.trim(min(n_keep, SINKS))
        else:
            self.context.trim(self.window.held(n_keep))

    def _plan(self, sequence: Sequence[int]) -> None:
        """Where a catch-up over `sequence` begins that would cost more than β of the target's prefill of it, hold
        only the sinks and the latest tokens that budget buys; a catch-up under way keeps its plan. Before the
        draft's rate is known (a new machine), its first `MIN_WINDOW` tokens measure it and the plan follows."""
        held = self.context.n_past
        if self.target is None or held < self._planned:
            return
        n = len(sequence)
        lacking = self.window.held(n) - held
        own, target = self.context.throughput.per_token, self.target.throughput.per_token
        if own is None and lacking > MIN_WINDOW:
            self._planned = held + MIN_WINDOW
            return
        keep = window_length(n - self.window.covered(held), self.share, own, target)
        if keep < lacking:
            self.window.place(sequence, keep)
            self.context.trim(min(held, SINKS))
        self._planned = self.window.held(n)
