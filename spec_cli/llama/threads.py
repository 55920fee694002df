"""How many threads a context's passes run on (the target's, a draft model's, a head's): every CPU the process may
run on (`kernels.cpu_threads`, or `--threads`), or fewer where fewer decode faster.

llama.cpp's threads meet at a barrier after each step of a pass and spin while they wait. Where another process
holds one of the cores, the thread that shares it waits for its turn while the others spin: on a 2-core machine
beside a process spinning on one core, the demo target decoded 14–16 tokens a second on two threads and 27–33 on
one (47–48 and 27–28 on the quiet machine), and its one-row passes took anywhere from 35 to 220 ms.

So the count is chosen from the passes measured, as the drafting is: while a context's passes take about the same
time as the latest of their shape (a quiet machine) nothing is tried at the most threads; where they spread
(another process takes turns on the cores), a few passes try one thread fewer, and below the most, every so often,
one more (the load may have gone); the count whose passes are faster stays. At the most, a trial that changes
nothing waits twice as long for the next. Passes shorter than the OS scheduler's tick are not read.
"""

from __future__ import annotations

from collections import deque
from statistics import fmean
from typing import Sequence

import llama_cpp

SPREAD = 0.5  # (upper quartile − lower quartile) / median of the latest passes' ratios past which a trial is due
# (at 0.3, 128-token runs on a quiet machine of two cores tried one thread fewer once or twice, ~3% each)
KEPT = 9  # the latest passes of each shape kept, and the latest ratios the spread reads
SHAPES = 64  # the shapes whose latest passes are kept, the oldest seen dropped first (a server's prompt chunks come
# in every size, and each would stay for the process's life)
TRIAL = 6  # passes a trial runs at the other count
WIN = 0.8  # the trial's passes over the current count's (means), at most, for fewer threads to stay
BACK = 0.95  # the same for more threads, back towards the most (the count a quiet machine runs best on)
SHORT = 0.001  # seconds under which a pass is not read: the OS scheduler's ticks are about that, and on the tiny test
# models (0.1–0.3 ms a pass) reading them went to one thread where two ran batches 30% faster
REST = 16  # passes before the first trial may start (a short answer is over in a few hundred)
SETTLED = 128  # passes after a trial that changed the count before the next may start (a trial of a count that
# loses costs its passes: six at twice the time is ~5% of 128)
REST_MAX = 4096  # each trial at the most that changed nothing doubles the wait for the next, up to this; below the
# most the next comes after `SETTLED` passes still, so that a count chosen on a burst of load is not kept long after


class Threads:
    """The thread count of one llama.cpp context (every sequence of it shares this), at most `most`: `count`, or the
    count on trial while one runs (`next`); `passed` books each pass.

    Passes differ in shape (a verify pass's rows, a prompt's chunk), so each is read against the latest passes of its
    own shape at `count`: its time over their mean. Those ratios' spread says whether the machine is busy, and a
    trial's mean ratio whether the count tried is faster."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.count = most
        self._recent: dict[tuple[int, ...], deque[float]] = {}  # by shape, the latest passes' seconds at `count`
        self._ratios: deque[float] = deque(maxlen=KEPT)  # the latest passes at `count`, each over its shape's mean
        self._tried: list[float] = []  # the trial's passes, each over its shape's mean at `count`
        self._trying: int | None = None
        self._left = 0  # passes the trial still runs
        self._rest = REST
        self._since = 0  # passes since the last trial ended
        self._upward = False  # whether the next trial below the most tries one more (else one fewer, where it can)
        self._applied = most  # what llama.cpp was last told (a context is made with the most)

    @property
    def next(self) -> int:
        """The count the next pass runs on."""
        return self._trying if self._trying is not None else self.count

    def apply(self, handle: llama_cpp.llama_context_p) -> None:
        """Tell llama.cpp the count for the next pass, where it changed."""
        n = self.next
        if n != self._applied:
            llama_cpp.llama_set_n_threads(handle, n, n)
            self._applied = n

    def passed(self, shape: tuple[int, ...], seconds: float) -> None:
        """A pass of `shape` (what makes two passes' times comparable: its tokens, the rows with logits…) took
        `seconds` on `next` threads."""
        if seconds < SHORT and self._trying is None:
            return
        recent = self._recent.get(shape)
        ratio = seconds / max(fmean(recent), 1e-9) if recent is not None and len(recent) >= 2 else None
        if self._trying is not None:
            if ratio is not None:
                self._tried.append(ratio)
            self._left -= 1
            if not self._left:
                self._judge()
            return
        if recent is None:
            if len(self._recent) >= SHAPES:
                del self._recent[next(iter(self._recent))]
            recent = self._recent[shape] = deque(maxlen=KEPT)
        recent.append(seconds)
        if ratio is not None:
            self._ratios.append(ratio)
        self._since += 1
        if self.most > 1 and self._since >= self._rest and (self.count < self.most or _spread(self._ratios) > SPREAD):
            self._try()

    def _try(self) -> None:
        """Start a trial of one thread fewer or, below the most, every other time one more."""
        up = self.count < self.most and (self.count == 1 or self._upward)
        self._upward = not self._upward
        self._trying, self._left, self._tried = self.count + 1 if up else self.count - 1, TRIAL, []

    def _judge(self) -> None:
        """The trial's count stays where its passes took at most `WIN` (`BACK` for more threads) of the current
        count's, on average: the mean, not the middle, as a pass's time is what a rate pays, and spinning threads make
        long tails (two threads' one-row passes beside another process: a middle of 42 ms, a mean of 68). The new
        count's passes are then measured afresh."""
        trying, self._trying, self._since = self._trying, None, 0
        assert trying is not None
        if self._tried and fmean(self._tried) <= (BACK if trying > self.count else WIN):
            self.count, self._rest = trying, SETTLED
            self._recent.clear()
            self._ratios.clear()
        else:
            self._rest = SETTLED if self.count < self.most else min(REST_MAX, 2 * self._rest)


def _spread(values: Sequence[float]) -> float:
    """(upper quartile − lower quartile) / median of `values` (0 for fewer than `KEPT` // 2 + 1 of them)."""
    if len(values) <= KEPT // 2:
        return 0.0
    ordered = sorted(values)
    n = len(ordered)
    return (ordered[(3 * n) // 4] - ordered[n // 4]) / max(ordered[n // 2], 1e-9)
