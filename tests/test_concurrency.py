"""`spec bench --concurrency`: clients that send every prompt back to back (`bench.concurrency.run_batch`), and the
figures (`bench.concurrency.report`): each side over the target alone, over the best side, and over the best of the
others held out."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from spec_cli import GenerationRequest, Pair
from spec_cli.bench import concurrency
from spec_cli.bench.concurrency import Batch, report, run_batch
from spec_cli.decoding.engine import Generation, TokenEvent
from spec_cli.decoding.scheduler import Scheduler


class Joins(Scheduler):
    """A scheduler that keeps the generations in the order they joined, the most it ran at once, and its steps: the
    clock of a batch run on it (`time.perf_counter` as `bench.concurrency` reads it)."""

    def __init__(self) -> None:
        super().__init__()
        self.joined: list[Generation] = []
        self.most = 0
        self.steps = 0

    def join(self, generation: Generation) -> None:
        super().join(generation)
        self.joined.append(generation)
        self.most = max(self.most, len(self))

    def step(self) -> list[tuple[Generation, list[TokenEvent]]]:
        self.steps += 1
        return super().step()


def test_clients_send_every_prompt_each_as_soon_as_their_last_answer_is_in(alone: Pair,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Two clients, five requests: client 0 sends requests 0, 2, 4 and client 1 requests 1, 3, each the moment its
    last has finished. Request 1 is the longest, so client 0 sends 2 and 4 before client 1 sends 3; never more than
    two run at once, and each request's first token is timed from its own sending (counted in steps: every request
    waits as long as the first, where timed from the batch's start request 3 would wait for request 1's twelve)."""
    lengths = [3, 12, 4, 5, 2]
    prompts = [alone.prompt_tokens(f"the {word}", raw=True) for word in ("cat", "dog", "sun", "sea", "sky")]
    requests = [GenerationRequest(max_tokens=n, draft_max=0, draft_mode="none", seed=j) for j, n in enumerate(lengths)]
    scheduler, batch = Joins(), Batch(2, "none")
    monkeypatch.setattr(concurrency, "time", SimpleNamespace(perf_counter=lambda: float(scheduler.steps)))
    run_batch(scheduler, alone.slots(2, 32), prompts, requests, batch)
    assert [g.prompt for g in scheduler.joined] == [prompts[j] for j in (0, 1, 2, 4, 3)]
    assert [len(g.token_ids) for g in scheduler.joined] == [lengths[j] for j in (0, 1, 2, 4, 3)]
    assert scheduler.most == 2 and len(scheduler) == 0
    assert batch.tokens == [sum(lengths)] and batch.wall_s == [scheduler.steps]
    assert batch.first_token_s == [batch.first_token_s[0]] * 5 and batch.first_token_s[0] <= 2  # its prompt, a token


def batch(mode: str, rates: list[float]) -> Batch:
    """A side whose batches, one a round, each ran 1 s at `rates` tokens/s."""
    return Batch(2, mode, wall_s=[1.0] * len(rates), tokens=[int(rate) for rate in rates])


def test_each_side_over_the_best_of_the_others_held_out() -> None:
    """Two rounds: the best other side is chosen on one and read on the other, both ways; the target alone and the
    best side keep their plain ratios beside it."""
    sides = [batch("hybrid", [50, 60]), batch("memory", [55, 40]), batch("none", [45, 50])]
    [level] = report(sides)["concurrency"]
    figures = {side["draft_mode"]: side for side in level["sides"]}
    # the default: memory is best on round 0 (55), read on round 1 (60 / 40); none on round 1 (50), read on 0 (50 / 45)
    assert figures["hybrid"]["of_best_other_held_out"] == pytest.approx((60 / 40 + 50 / 45) / 2)
    # memory: the default is best of the others on both rounds
    assert figures["memory"]["of_best_other_held_out"] == pytest.approx((40 / 60 + 55 / 50) / 2)
    assert figures["hybrid"]["speedup"] == pytest.approx(55 / 47.5) and figures["hybrid"]["of_best"] == 1.0
    [level] = report([batch("hybrid", [50]), batch("none", [45])])["concurrency"]
    assert all(side["of_best_other_held_out"] is None for side in level["sides"])  # one round: nothing to hold out
