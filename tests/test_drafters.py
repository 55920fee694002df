"""The n-gram drafter's matching on hand-made sequences, its q for sampling, and the hybrid drafter's choices
on a synthetic machine."""

from __future__ import annotations

import numpy as np
import pytest

from spec_cli.decoding.costs import LoopCosts
from spec_cli.decoding.draft_length import FixedK
from spec_cli.decoding.drafter import Draft
from spec_cli.decoding.sampling import SamplingParams
from spec_cli.drafting.hybrid import HybridDrafter, HybridState
from spec_cli.drafting.ngram import NgramDrafter
from spec_cli.llama.grammar import Grammar

GREEDY = SamplingParams()


def propose(tokens: list[int], k: int, n_max: int = 4, n_min: int = 2) -> list[int]:
    drafter = NgramDrafter(n_vocab=100, n_max=n_max, n_min=n_min)
    drafter.prefill(tokens[:1])
    return drafter.propose(tokens, k, GREEDY, np.random.default_rng(0)).tokens


def test_proposes_what_followed_the_earlier_occurrence() -> None:
    assert propose([1, 2, 3, 4, 5, 6, 9, 2, 3], k=3) == [4, 5, 6]


def test_continuation_is_cut_at_k_and_at_the_sequence_end() -> None:
    assert propose([1, 2, 3, 4, 5, 6, 9, 2, 3], k=2) == [4, 5]
    assert propose([7, 8, 7, 8], k=5) == [7, 8]


def test_latest_occurrence_wins() -> None:
    assert propose([1, 2, 10, 1, 2, 20, 1, 2], k=1) == [20]


def test_longest_suffix_match_wins_over_a_later_shorter_one() -> None:
    # Suffix [5, 1, 2] occurs once (followed by 30); [1, 2] alone occurs later (followed by 40).
    assert propose([5, 1, 2, 30, 7, 1, 2, 40, 5, 1, 2], k=1) == [30]


def test_no_match_proposes_nothing() -> None:
    assert propose([1, 2, 3, 4, 5], k=4) == []
    assert propose([1, 2, 3, 1], k=4) == []  # a 1-gram match is below n_min


def test_incremental_index_equals_a_fresh_one() -> None:
    sequence = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 1, 4, 1, 5]
    growing = NgramDrafter(n_vocab=10)
    growing.prefill(sequence[:3])
    for end in range(4, len(sequence) + 1):
        grown = growing.propose(sequence[:end], 5, GREEDY, np.random.default_rng(0)).tokens
        assert grown == propose(sequence[:end], 5)


def test_rewind_forgets_dropped_tokens() -> None:
    drafter = NgramDrafter(n_vocab=100)
    drafter.prefill([1, 2, 3, 9, 1, 2, 7])
    drafter.rewind(6)  # the 7 was rejected: [1, 2] must point at its first occurrence again
    assert drafter.propose([1, 2, 3, 9, 1, 2], 2, GREEDY, np.random.default_rng(0)).tokens == [3, 9]


def test_sampling_proposals_carry_one_hot_q() -> None:
    drafter = NgramDrafter(n_vocab=50)
    drafter.prefill([1, 2, 3, 1, 2])
    draft = drafter.propose([1, 2, 3, 1, 2], 2, SamplingParams(temperature=1.0), np.random.default_rng(0))
    assert draft.tokens == [3, 1]
    assert len(draft.q) == 2
    for token, q in zip(draft.tokens, draft.q):
        dense = np.asarray(q)
        assert dense.shape == (50,) and dense[token] == 1.0 and dense.sum() == 1.0


class FakeModel:
    """A draft model whose catch-up backlog is set by the test; it proposes k copies of token 9."""

    busy_s = rollback_s = 0.0

    def __init__(self, pending: int = 1) -> None:
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

    def rewind(self, _n_keep: int) -> None:
        pass


MATCH, NO_MATCH = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3], [1, 2, 3, 4, 5, 6]


def machine() -> LoopCosts:
    """Verify 25 ms + 4 ms a drafted token; draft steps 12 ms, a catch-up of n tokens 12 + 4 (n − 1) ms."""
    costs = LoopCosts()
    for k in range(9):
        costs.verify.record(k, 0.025 + 0.004 * k)
    for n in (1, 2, 10, 40):
        costs.draft.record(n, 0.012 + 0.004 * (n - 1))
    return costs


def hybrid(model_accepts: int, ngram_accepts: int = 4, pending: int = 1, k: int = 4,
           model_share: float = 1.0) -> tuple[HybridDrafter, FakeModel]:
    """A hybrid past its warm-up: each drafter has drafted k tokens 8 times, keeping the number given; the
    model drafted `model_share` of the recent rounds."""
    state = HybridState({"ngram": FixedK(k), "model": FixedK(k)})
    model = FakeModel(pending)
    drafter = HybridDrafter(NgramDrafter(n_vocab=100), model, machine(), state)
    drafter.prefill(MATCH[:1])
    for name, accepted in (("ngram", ngram_accepts), ("model", model_accepts)):
        for _ in range(state.warmup_rounds):
            state.lengths[name].update(k, accepted)
        state.tried[name] = state.warmup_rounds
    state.model_share = model_share  # a prompt starts with the model in use; the test says how much since
    return drafter, model


def choice(drafter: HybridDrafter, tokens: list[int]) -> str:
    drafter.rewind(1)  # a new sequence for the n-gram index
    drafter.propose(tokens, 4, GREEDY, np.random.default_rng(0))
    return drafter.chosen[0]


def test_hybrid_tries_each_drafter_before_weighing_them() -> None:
    state = HybridState({"ngram": FixedK(4), "model": FixedK(4)})
    drafter = HybridDrafter(NgramDrafter(n_vocab=100), FakeModel(), machine(), state)
    drafter.prefill(MATCH[:1])
    for _ in range(state.warmup_rounds):
        assert choice(drafter, MATCH) == "ngram"
        drafter.update(4, 0)  # a useless n-gram, still tried as often as the warm-up says
    assert choice(drafter, NO_MATCH) == "model"
    assert choice(drafter, MATCH) == "model"  # the model's warm-up comes next; the n-gram's is over


def test_hybrid_takes_the_drafter_that_serves_the_rate_best() -> None:
    # A perfect n-gram costs no draft steps: it wins where it matches; the model wins where it does not.
    drafter, _ = hybrid(model_accepts=4, ngram_accepts=4)
    assert choice(drafter, MATCH) == "ngram"
    assert choice(drafter, NO_MATCH) == "model"
    # A draft model that is never right costs more than it yields: plain target steps instead.
    drafter, model = hybrid(model_accepts=0, ngram_accepts=0)
    assert [choice(drafter, tokens) for tokens in (MATCH, NO_MATCH)] == ["none", "none"]
    assert model.proposed == 0


def test_a_large_backlog_defers_the_model_until_the_regret_reaches_its_price() -> None:
    """Ski rental: while deferring, the regret grows by the surplus lost and the backlog's growth; the model
    pays the backlog once that regret reaches the backlog's price when deferring began, weighed by the
    share of rounds the model sat out."""
    drafter, model = hybrid(model_accepts=4, pending=40, model_share=0.2)
    price = 0.8 * (drafter.costs.draft.seconds(40) - drafter.costs.draft.seconds(2))
    deferred = 0
    while choice(drafter, NO_MATCH) == "none":
        deferred += 1
        model.backlog += 1
        drafter.update(0, 0)
        assert deferred < 100
    assert deferred >= 2
    assert drafter.state.regret_s == 0.0 and drafter.state.backlog_s == pytest.approx(price)
    # A backlog of 3 costs less than one round of deferring: the model catches up at once.
    drafter, model = hybrid(model_accepts=4, pending=3, model_share=0.2)
    assert choice(drafter, NO_MATCH) == "model"
    # A model in use all along will be needed again: deferring saves nothing.
    drafter, model = hybrid(model_accepts=4, pending=40, model_share=1.0)
    assert choice(drafter, NO_MATCH) == "model"


def test_a_new_prompt_starts_afresh() -> None:
    """The prompt's prefill catches the model up: no deferral carries over, the model counts as in use, and
    the rate learnt on the last text weighs about two rounds."""
    drafter, _ = hybrid(model_accepts=4, pending=40, model_share=0.2)
    assert choice(drafter, NO_MATCH) == "none" and drafter.state.regret_s > 0
    drafter.state.record("ngram", 20, 0.1)
    rho = drafter.state.rho
    drafter.prefill(MATCH[:1])
    assert drafter.state.regret_s == 0.0 and drafter.state.model_share == 1.0
    assert drafter.state.rho == pytest.approx(rho)
    drafter.state.record("none", 1, 0.025)
    assert drafter.state.rho < 0.5 * rho


def test_an_ngram_stretch_prices_the_backlog_afresh() -> None:
    drafter, model = hybrid(model_accepts=4, pending=40, model_share=0.2)
    assert choice(drafter, NO_MATCH) == "none" and drafter.state.regret_s > 0
    assert choice(drafter, MATCH) == "ngram"
    assert drafter.state.regret_s == 0.0


def test_an_ngram_sitting_out_is_scored_in_hindsight() -> None:
    """Learnt on other text, the n-gram looks useless and sits out; its proposals, scored against what each
    round emitted, bring it back once the text repeats itself."""
    drafter, _ = hybrid(model_accepts=0, ngram_accepts=0)
    sequence = [1, 2, 3, 4, 5, 6, 7, 8] * 20
    drafter.rewind(1)
    length, chosen = 11, []
    while len(chosen) < 60 and "ngram" not in chosen:
        drafter.propose(sequence[:length], 4, GREEDY, np.random.default_rng(0))
        chosen.append(drafter.chosen[0])
        length += 1  # a plain target step emitted one token: the one the n-gram proposed first
    assert chosen[0] == "none" and chosen[-1] == "ngram"


def test_the_backlog_an_ngram_round_leaves_is_charged_while_the_model_is_in_use() -> None:
    """A half-right n-gram (3 tokens for a 41 ms verify) beats a perfect model (5 for 93 ms) only when the
    model is out of use; in use, it would catch up on those 3 tokens later (12 ms)."""
    in_use, _ = hybrid(model_accepts=4, ngram_accepts=2, model_share=1.0)
    out_of_use, _ = hybrid(model_accepts=4, ngram_accepts=2, model_share=0.0)
    assert choice(in_use, MATCH) == "model" and choice(out_of_use, MATCH) == "ngram"
