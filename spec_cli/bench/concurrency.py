"""`spec bench --concurrency`: N clients at once through the scheduler, each way of drafting side by side in one
run (the default beside every mode it chooses among, and the target alone): aggregate tokens per second, its ratio
to the target alone and to the best side, each request's time to first token and time per token after it (p50 and
p95), mean K and acceptance. A server sees this when N clients send requests back to back.

A batch is every prompt once, by N clients: client c, on slot c, sends prompts c, c + N, c + 2N, … each as soon as
its last answer is in. Clients held to start together, each batch only N requests, measured the time to the
longest answer: on the demo pair at 4 the default's drafts shortened some answers and no batch (257 steps against
the target alone's 256 over four batches, each step dearer for the rows drafted: 0.95× the target alone), where
four clients sending back to back ran 1.09× (one client's answer in sooner is its next request begun).

At each concurrency the sides alternate `repeat` times over the same prompts, on the same slots and one scheduler,
so that all run on a machine in the same state. A batch of each side first warms the weights, the prompt caches and
the scheduler's cost books, uncounted, as a server's first requests would. Each batch starts from an empty memory
of earlier outputs: every request is a first encounter (with fewer prompts than clients, prompts are taken in turn).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from spec_cli.bench.held_out import held_out_ratio
from spec_cli.decoding.engine import Generation
from spec_cli.decoding.scheduler import Scheduler
from spec_cli.decoding.stats import Stats
from spec_cli.pair import Pair, Slot
from spec_cli.request import GenerationRequest


@dataclass
class Batch:
    """The runs of one side (a drafting mode, "none" for the target alone) at one concurrency: wall seconds of each
    batch, and each request's figures."""

    concurrency: int
    mode: str
    wall_s: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    first_token_s: list[float] = field(default_factory=list)
    per_token_s: list[float] = field(default_factory=list)
    totals: Stats = field(default_factory=lambda: Stats(draft_max=0))

    @property
    def rounds(self) -> list[list[float]]:
        """Each batch's tokens per second, a round each."""
        return [[n / s] for n, s in zip(self.tokens, self.wall_s) if s > 0]

    @property
    def tokens_per_second(self) -> float:
        """Every request's tokens over the wall time of the batches (median of the batches' rates)."""
        return statistics.median(rate for (rate,) in self.rounds)

    def as_dict(self) -> dict[str, object]:
        t = self.totals
        return {"concurrency": self.concurrency, "draft_mode": self.mode,
                "tokens_per_second": self.tokens_per_second,
                "first_token_s": _percentiles(self.first_token_s), "per_token_s": _percentiles(self.per_token_s),
                "mean_k": t.drafted / t.rounds if t.rounds else 0.0, "acceptance": t.acceptance_rate,
                "batch_size": t.batch_size, "requests": len(self.first_token_s)}


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {"p50": 0.0, "p95": 0.0}
    return {"p50": statistics.median(ordered), "p95": ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]}


def run_batch(scheduler: Scheduler, slots: Sequence[Slot], prompts: Sequence[list[int]],
              requests: Sequence[GenerationRequest], batch: Batch) -> None:
    """Every prompt with its request, by as many clients as `slots`: request j on slot j mod N, each client's next
    sent as soon as its last has finished; add the figures to `batch` (each request's first token timed from its
    sending, the wall time to the last answer)."""
    slots[0].pair.output_memory.forget()  # the last batch's answers to these very prompts
    clients = len(slots)
    started = time.perf_counter()
    generations: list[Generation] = []
    sent: dict[int, float] = {}
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    index: dict[int, int] = {}

    def send(j: int) -> None:
        generation = slots[j % clients].generate(prompts[j], requests[j])
        generations.append(generation)
        key = id(generation)
        sent[key], index[key] = time.perf_counter(), j
        scheduler.join(generation)

    for j in range(min(clients, len(prompts))):
        send(j)
    while len(scheduler):
        for generation, events in scheduler.step():
            key = id(generation)
            if events:
                now = time.perf_counter()
                first.setdefault(key, now)
                last[key] = now
            following = index[key] + clients
            if generation.finish_reason is not None and following < len(prompts):
                send(following)
    batch.wall_s.append(time.perf_counter() - started)
    batch.tokens.append(sum(len(g.token_ids) for g in generations))
    for generation in generations:
        n, key = len(generation.token_ids), id(generation)
        if key in first:
            batch.first_token_s.append(first[key] - sent[key])
        if n > 1:
            batch.per_token_s.append((last[key] - first[key]) / (n - 1))
        batch.totals.merge(generation.stats)


def compare_concurrency(pair: Pair, prompts: Sequence[list[int]], levels: Sequence[int],
                        sides: Sequence[GenerationRequest], repeat: int = 1,
                        progress: Callable[[str], None] = lambda _label: None) -> list[Batch]:
    """For each concurrency in `levels`, `repeat` batches of every prompt (at least that many requests, the prompts
    taken in turn) by that many clients for each of `sides` (requests that differ in their drafting), alternating.
    Request j of a batch takes prompt j mod len(prompts) and seed j."""
    slots = pair.slots(max(levels), max(map(len, prompts)) + max(side.max_tokens for side in sides))
    scheduler = Scheduler()

    def batch_of(level: int, side: GenerationRequest) -> tuple[list[list[int]], list[GenerationRequest]]:
        count = max(level, len(prompts))
        return [prompts[j % len(prompts)] for j in range(count)], [replace(side, seed=j) for j in range(count)]

    for warm_up in sides:  # weights into memory, costs booked
        progress("warming up")
        run_batch(scheduler, slots, *batch_of(len(slots), warm_up), Batch(len(slots), _mode(pair, warm_up)))
    batches = []
    for level in levels:
        level_batches = [Batch(level, _mode(pair, side)) for side in sides]
        for _round in range(repeat):
            for side, batch in zip(sides, level_batches):
                progress(f"{level} at once, {batch.mode}")
                run_batch(scheduler, slots[:level], *batch_of(level, side), batch)
        batches += level_batches
    return batches


def _mode(pair: Pair, request: GenerationRequest) -> str:
    return request.draft_mode or pair.default_draft_mode


def report(batches: Sequence[Batch]) -> dict[str, object]:
    """At each concurrency every side, with its tokens per second over the target alone's (`speedup`), over the
    best side's (`of_best`), and with two batches of each side or more over the best of the others' held out
    (`of_best_other_held_out`: without the best one's luck, `held_out.held_out_ratio`)."""
    levels = []
    for level in dict.fromkeys(batch.concurrency for batch in batches):
        sides = [batch for batch in batches if batch.concurrency == level]
        best = max(batch.tokens_per_second for batch in sides)
        alone = next((batch.tokens_per_second for batch in sides if batch.mode == "none"), None)
        levels.append({"concurrency": level, "sides": [
            {**batch.as_dict(), "speedup": batch.tokens_per_second / alone if alone else None,
             "of_best": batch.tokens_per_second / best,
             "of_best_other_held_out": held_out_ratio(batch.rounds, [other.rounds for other in sides
                                                                      if other is not batch])}
            for batch in sides]})
    return {"concurrency": levels}
