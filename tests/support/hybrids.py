"""A hybrid drafter on a synthetic machine with stand-in drafters, for the tests of the default drafting's choices."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from spec_cli.decoding.costs import HOST, LoopCosts
from spec_cli.decoding.draft_length import FixedK
from spec_cli.decoding.drafter import CatchUp, Draft
from spec_cli.decoding.sampling import SamplingParams
from spec_cli.drafting.entry import OUT
from spec_cli.drafting.hybrid import HybridDrafter
from spec_cli.drafting.hybrid_state import HybridState
from spec_cli.drafting.ngram import NgramDrafter
from spec_cli.llama.grammar import Grammar

GREEDY = SamplingParams()


class FakeModel:
    """A draft model whose catch-up backlog is set by the test; it proposes k copies of token 9."""

    def __init__(self, pending: int = 1) -> None:
        self.clocks = (SimpleNamespace(busy_s=0.0, rollback_s=0.0),)  # its context, as the round timer reads it
        self.backlog = pending
        self.proposed = 0

    def pending(self, _tokens: list[int]) -> int:
        return self.backlog

    def propose(self, _tokens: list[int], k: int, _sampling: SamplingParams, _rng: np.random.Generator,
                _grammar: Grammar | None = None) -> Draft:
        self.proposed += 1
        return Draft(tokens=[9] * k)

    def prefill(self, _tokens: list[int]) -> list[tuple[int, float]]:
        return []

    def start(self, _tokens: list[int]) -> None:
        pass

    def rewind(self, _n_keep: int) -> None:
        pass

    def narrow(self, _tokens: list[int]) -> None:
        pass  # as a head's: no window

    def catch_up(self, _tokens: list[int], chunk: int) -> CatchUp | None:
        if self.backlog <= chunk:
            return None
        self.backlog -= chunk
        return CatchUp([(chunk, 0.004 * chunk)], self.backlog)


MATCH, NO_MATCH = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3], [1, 2, 3, 4, 5, 6]


def machine() -> LoopCosts:
    """Verify 25 ms + 4 ms a drafted token; draft steps 12 ms, a catch-up of n tokens 12 + 4 (n − 1) ms."""
    costs = LoopCosts()
    for k in range(9):
        costs.verify.record(k + 1, 0.025 + 0.004 * k)  # by rows: K + 1
    for n in (1, 2, 10, 40):
        costs.draft.record(n, 0.012 + 0.004 * (n - 1))
    return costs


def hybrid(model_accepts: int, ngram_accepts: int = 4, pending: int = 1, k: int = 4, in_use: str = OUT,
           own: dict[str, LoopCosts] | None = None) -> tuple[HybridDrafter, FakeModel]:
    """A hybrid whose drafters have each drafted k tokens 8 times, keeping the number given, running in regime
    `in_use`; `own`: its own drafters' books by name (the draft model alone on `machine()` by default)."""
    books = own or {"model": machine()}
    state = HybridState({"ngram": FixedK(k), **{name: FixedK(k) for name in books}}, in_use=in_use)
    model = FakeModel(pending)
    drafters = {name: model if name == "model" else FakeModel(pending) for name in books}
    first = next(iter(books.values()))
    lookups = LoopCosts.sharing(first.verify, 1.0, HOST, first.position)  # prices lookups and plain rounds
    drafter = HybridDrafter(NgramDrafter(n_vocab=100), drafters, books, lookups, state)
    drafter.start(MATCH[:1])
    for name, accepted in (("ngram", ngram_accepts), *((name, model_accepts) for name in books)):
        for _ in range(8):
            state.lengths[name].update(k, accepted)
    return drafter, model


def choice(drafter: HybridDrafter, tokens: list[int]) -> str:
    drafter.rewind(1)  # a new sequence for the n-gram index
    drafter.propose(tokens, 4, GREEDY, np.random.default_rng(0))
    assert drafter.chosen is not None
    return drafter.chosen[0]
