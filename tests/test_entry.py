"""When the default drafting enters an own drafter's regime (`drafting.entry`): the ski-rental wait, the pay-back over
the tokens an answer still emits, a trial on a new text; on a synthetic machine with stand-in drafters."""

from __future__ import annotations

import numpy as np
import pytest

from spec_cli.decoding.draft_length import Pool
from spec_cli.decoding.drafter import Terms
from spec_cli.drafting.entry import OUT, SETTLE_ROUNDS, TRIAL_PRIOR, TRIAL_ROUNDS, TRIAL_TEXTS
from spec_cli.drafting.hybrid import HybridDrafter
from spec_cli.decoding.costs import LoopCosts
from support.hybrids import GREEDY, MATCH, NO_MATCH, choice, hybrid, machine


def rounds_out(drafter: HybridDrafter, terms: Terms) -> None:
    """A new text's first `SETTLE_ROUNDS` rounds, which run out of every regime: its rates are not its own yet."""
    for _ in range(SETTLE_ROUNDS):
        drafter.offer(NO_MATCH, terms, GREEDY, np.random.default_rng(0))
        drafter.propose(NO_MATCH, 8, GREEDY, np.random.default_rng(0))
        drafter.update(0, 0)
        assert drafter.state.in_use == OUT


def texts_kept(drafter: HybridDrafter, kept: int) -> None:
    """The draft model drafted 4 tokens 10 rounds on each of the last `TRIAL_TEXTS` texts, keeping `kept` of them; a new
    sequence follows."""
    pool = drafter.state.lengths["model"].acceptance.pooled = Pool(0.995)
    for _ in range(TRIAL_TEXTS):
        for _ in range(10):
            pool.update(4, kept)
        pool.new_text()
    drafter.rewind(1)


def test_a_large_backlog_defers_the_model_until_the_regret_reaches_its_price() -> None:
    """Ski rental: out of the model's regime, each round that regime would have done better adds the time lost
    to the regret; the model pays its backlog once the regret reaches that backlog's price when deferring
    began."""
    drafter, model = hybrid(model_accepts=4, pending=40)
    price = drafter.books["model"].draft.seconds(40) - drafter.books["model"].draft.seconds(2)
    deferred, regrets = 0, []
    while choice(drafter, NO_MATCH) == "none":
        deferred += 1
        regrets.append(drafter.state.regret_s)
        drafter.update(0, 0)
        assert deferred < 100
    assert deferred >= 2 and regrets[-1] < price and drafter.state.in_use == "model"
    assert drafter.state.price_s == pytest.approx(price)  # fixed when deferring began, though the backlog grew
    assert regrets == sorted(regrets) and drafter.state.regret_s == 0.0
    # A backlog of 3 costs less than one round of deferring: the model catches up at once.
    drafter, model = hybrid(model_accepts=4, pending=3)
    assert choice(drafter, NO_MATCH) == "model"


def test_a_clearly_better_regime_is_entered_at_once_where_the_answer_has_room_to_pay_it_back() -> None:
    """Out of the model's regime, with a 40-token backlog to pay on entering, once the text's first rounds have made
    the rates its own: told that the generation may emit 1000 more tokens, the hybrid enters at once (the model's rate
    pays the backlog back within them); told 10, or not told (the ski-rental wait), it stays out this round."""
    entered = []
    for left in (1000, 10, None):
        drafter, _model = hybrid(model_accepts=4, ngram_accepts=0, pending=40)
        rounds_out(drafter, Terms(8, 64, False, 10))
        drafter.rewind(1)
        if left is None:
            drafter.propose(NO_MATCH, 8, GREEDY, np.random.default_rng(0))
        else:
            drafter.offer(NO_MATCH, Terms(8, 64, False, left), GREEDY, np.random.default_rng(0))
        entered.append(drafter.state.in_use)
    assert entered == ["model", OUT, OUT]


def test_under_a_fixed_k_the_terms_the_loop_tells_weigh_the_pay_back_as_an_offers_do() -> None:
    """Under a fixed K no offer is asked for and the round's terms come with `expect`: told that the generation may emit
    1000 more tokens, the round `propose` chooses enters the model's regime at once, as an offer's would; told 10, it
    stays out."""
    entered = []
    for left in (1000, 10):
        drafter, _model = hybrid(model_accepts=4, ngram_accepts=0, pending=40)
        rounds_out(drafter, Terms(8, 64, False, 10))
        drafter.rewind(1)
        drafter.expect(Terms(8, 64, False, left))
        drafter.propose(NO_MATCH, 8, GREEDY, np.random.default_rng(0))
        entered.append(drafter.state.in_use)
    assert entered == ["model", OUT]


def test_a_regime_is_not_entered_for_its_pay_back_in_a_round_the_lookup_proposes() -> None:
    """The rate out moves on the prices of the lookup's first proposals on a text, whose acceptance there is not known
    yet: in a round the lookup proposes, the model's regime is not entered for its pay-back; in the next, which it
    does not, it is."""
    drafter, _model = hybrid(model_accepts=4, ngram_accepts=0, pending=40)
    rounds_out(drafter, Terms(8, 64, False, 10))
    drafter.rewind(1)
    offers = drafter.offer(MATCH, Terms(8, 64, False, 1000), GREEDY, np.random.default_rng(0))
    assert "ngram" in [offer.way for offer in offers] and drafter.state.in_use == OUT
    drafter.update(0, 0)
    offers = drafter.offer([*MATCH, 20], Terms(8, 64, False, 1000), GREEDY, np.random.default_rng(0))
    assert "ngram" not in [offer.way for offer in offers] and drafter.state.in_use == "model"


def test_a_new_text_is_entered_for_its_pay_back_only_once_its_rates_are_its_own() -> None:
    """In a new text's first `SETTLE_ROUNDS` rounds the regimes' rates are the last text's: the model's regime is not
    entered for its pay-back though the 1000 tokens the answer may emit would pay its backlog back at those rates;
    the round after, it is."""
    drafter, _model = hybrid(model_accepts=4, ngram_accepts=0, pending=40)
    rounds_out(drafter, Terms(8, 64, False, 1000))
    drafter.offer(NO_MATCH, Terms(8, 64, False, 1000), GREEDY, np.random.default_rng(0))
    assert drafter.state.in_use == "model"


def test_the_tokens_an_answer_still_emits_follow_the_answers_that_ended_before() -> None:
    """The same request (1000 tokens left, 10 emitted) and backlog: with no answer ended yet, half the limit pays the
    backlog back and the model's regime is entered; after answers that ended on their own at 30 tokens (20 more
    expected) it is not; an answer already longer than all of them goes by its limit again. Answers cut at a limit
    say nothing."""
    entered = []
    for answers, ended in (([], True), ([30] * 3, True), ([8] * 3, True), ([30] * 3, False)):
        drafter, _model = hybrid(model_accepts=4, ngram_accepts=0, pending=40)
        for n in answers:
            drafter.done([1] * (4 + n), 4, ended=ended)
        rounds_out(drafter, Terms(8, 64, False, 10))
        drafter.rewind(1)
        drafter.offer(NO_MATCH, Terms(8, 64, False, 1000, emitted=10), GREEDY, np.random.default_rng(0))
        entered.append(drafter.state.in_use)
    assert entered == ["model", OUT, "model", "model"]


def test_a_new_text_tries_an_own_drafter_whose_acceptance_on_other_texts_says_it_may_pay() -> None:
    """A draft model that kept 1 of 4 of late stays out of use, unless on the last texts it drafted on it kept every
    draft: over those the trial's expected saving pays its entry (a 10-token catch-up) many times over. On trial it
    drafts `TRIAL_ROUNDS` rounds whatever they keep, and is then left as any regime is. (One whose pool knows no
    text is tried as not priced yet: `test_hybrid`.)"""
    outcomes = []
    for kept in (0, 4):  # texts where it kept nothing, texts where it kept all
        drafter, _model = hybrid(model_accepts=1, ngram_accepts=0, pending=10)
        texts_kept(drafter, kept)
        rounds_out(drafter, Terms(8, 64, False, 1000))
        drafter.offer(NO_MATCH, Terms(8, 64, False, 1000), GREEDY, np.random.default_rng(0))
        outcomes.append(drafter.state.in_use)
    assert outcomes == [OUT, "model"]
    assert drafter.state.lengths["model"].acceptance.measured == pytest.approx(TRIAL_PRIOR)  # the text decides soon
    drafter.propose(NO_MATCH, 8, GREEDY, np.random.default_rng(0))  # the round the offer chose
    drafter.update(4, 0)  # the trial's first round keeps nothing
    assert choice(drafter, NO_MATCH) == "model" and TRIAL_ROUNDS == 2
    drafter.update(4, 0)
    choice(drafter, NO_MATCH)
    assert drafter.state.in_use == OUT


def test_a_trial_ends_after_its_rounds_though_the_planner_drafted_none_of_them() -> None:
    """Rounds of a trial the planner gives K = 0 (it priced the drafter below a plain step) are the trial's rounds too:
    counted by what they kept, the trial never ended and held the loop in the drafter's regime for good."""
    drafter, _model = hybrid(model_accepts=1, ngram_accepts=0, pending=10)
    texts_kept(drafter, 4)
    terms = Terms(8, 64, False, 1000)
    rounds_out(drafter, terms)
    emitted = [*NO_MATCH]
    for _ in range(TRIAL_ROUNDS):
        drafter.offer(emitted, terms, GREEDY, np.random.default_rng(0))
        assert drafter.state.in_use == "model" and drafter.chosen is not None and drafter.chosen[0] == "model"
        drafter.update(0, 0)  # the planner drafted nothing this round: a plain step emitted one token
        emitted.append(20 + len(emitted))
    drafter.offer(emitted, terms, GREEDY, np.random.default_rng(0))
    assert drafter.state.in_use == OUT


def test_an_answer_cut_at_its_limit_counts_where_it_went_as_far_as_this_one_may() -> None:
    """The tokens an answer still emits: answers cut at 64 tokens, when this one may go to 64 too, had all that was left
    (a benchmark's answers all run to their limit); cut at 30, they say nothing of the 54 left here (half of it, as
    before any answer); one that ended on its own at 40 had 30 left."""
    expected = []
    for answers in ([(64, False)] * 3, [(30, False)] * 3, [(40, True), (64, False)]):
        drafter, _ = hybrid(model_accepts=4)
        for n, ended in answers:
            drafter.done([1] * (4 + n), 4, ended=ended)
        drafter.entry.terms = Terms(8, 64, False, 54, emitted=10)
        expected.append(drafter.entry.ahead())
    assert expected == [54, 27, 42]


def test_a_new_text_weighs_a_trial_though_the_drafters_regime_looks_best_without_paying_its_entry() -> None:
    """A draft model right 3 times in 4 on average, its regime a little better than the target alone's (42 tokens a
    second to 40) but its 40-token entry not paid back over the 50 tokens expected: on the last texts it kept every
    draft, so a trial pays, and it is entered for `TRIAL_ROUNDS` rounds."""
    drafter, _model = hybrid(model_accepts=3, ngram_accepts=0, pending=40)
    texts_kept(drafter, 4)
    rounds_out(drafter, Terms(8, 64, False, 100))
    drafter.offer(NO_MATCH, Terms(8, 64, False, 100), GREEDY, np.random.default_rng(0))
    rates = {name: regime.rate for name, regime in drafter.state.regimes.items()}
    assert rates["model"] > rates[OUT] and drafter.state.in_use == "model" and drafter.entry._trying == "model"


def test_beside_other_sequences_a_regime_whose_drafter_is_behind_is_the_batchs_to_enter() -> None:
    """Where other sequences share the pass, the model's catch-up holds them all up: the regime the pay-back enters
    alone is offered to the batch beside this round's choice, with all the model lacks, and entered only where the
    batch takes it; no regret runs up meanwhile (it entered the regime at once when the others ended, for an answer's
    last rounds)."""
    rng = np.random.default_rng(0)
    drafter, _model = hybrid(model_accepts=4, ngram_accepts=0, pending=40)
    rounds_out(drafter, Terms(8, 64, True, 1000))
    offers = drafter.offer(NO_MATCH, Terms(8, 64, True, 1000), GREEDY, rng)
    assert [offer.way for offer in offers] == ["none", "model"] and offers[1].backlog == 40
    assert drafter.state.in_use == OUT and drafter.state.regret_s == 0.0
    drafter.take("model", 4)
    assert drafter.state.in_use == "model"


def test_a_regime_whose_drafter_the_batch_passes_over_is_left() -> None:
    """In the model's regime beside other sequences, the model 40 tokens behind: a batch that gives it no K has not
    paid its catch-up, and the regime is left (its lookup proposals would carry a catch-up nobody pays); one a steady
    round behind keeps it."""
    rng = np.random.default_rng(0)
    for pending, kept in ((40, OUT), (2, "model")):
        drafter, _model = hybrid(model_accepts=4, ngram_accepts=0, pending=pending, in_use="model")
        drafter.rewind(1)
        [offer] = drafter.offer(NO_MATCH, Terms(8, 64, True, 1000), GREEDY, rng)
        assert offer.way == "model" and offer.backlog == pending
        drafter.update(0, 0)  # the round drafted nothing
        assert drafter.state.in_use == kept


def kept_rounds(drafter: HybridDrafter, emitted: list[int], terms: Terms, rng: np.random.Generator, n: int,
                copying: bool = False) -> list[str]:
    """`n` rounds whose 4 drafts are all kept, each adding 5 tokens to `emitted`: new ones, or (`copying`) the text's
    own repeated, which the n-gram finds; the regime in use after each."""
    in_use = []
    for _ in range(n):
        drafter.offer(emitted, terms, GREEDY, rng)
        drafter.update(4, 4)
        emitted.extend(emitted[-8:-3] if copying else [20 + len(emitted) + i for i in range(5)])
        in_use.append(drafter.state.in_use)
    return in_use


def catch_up_by_the_batch() -> LoopCosts:
    """`machine()`, but a catch-up costs less a token the more it takes in at once (12 + 4 (n − 1) ms to 10 tokens, 3 ms
    a token after), as a batched decode does: a burst of lookups is charged dearer a token than its backlog costs."""
    costs = machine()
    for n in (20, 40, 200, 600):
        costs.draft.record(n, 0.048 + 0.003 * (n - 10))
    return costs


def test_a_burst_of_lookups_does_not_leave_a_regime_that_costs_more_a_token_to_come_back_to() -> None:
    """In the model's regime, the model keeping every draft: one round the n-gram proposes lifts the rate out of every
    regime above the model's, but the seconds a token that saves are fewer than the model's catch-up costs a token on
    the tokens left, so the regime is kept (it was left, and chat answers came back to it 10-60 tokens later at that
    price); an n-gram that keeps proposing, as over a rewrite, leaves it."""
    drafter, _model = hybrid(model_accepts=4, ngram_accepts=4, pending=2, in_use="model",
                             own={"model": catch_up_by_the_batch()})
    terms, rng = Terms(8, 64, False, 1000), np.random.default_rng(0)
    emitted = [*NO_MATCH]
    kept_rounds(drafter, emitted, terms, rng, 6)
    assert drafter.state.in_use == "model"
    emitted.extend(MATCH)  # from here the text repeats what it wrote, and the n-gram proposes its next 8 tokens
    rounds = 0
    while drafter.state.in_use == "model" and rounds < 20:
        ways = [offer.way for offer in drafter.offer(emitted, terms, GREEDY, rng)]
        rates = {name: regime.rate for name, regime in drafter.state.regimes.items()}
        if rounds == 0:
            assert ways[0] == "ngram" and rates[OUT] > rates["model"] and drafter.state.in_use == "model"
        drafter.update(4, 4)
        emitted.extend(emitted[-8:-3])
        rounds += 1
    assert 1 < rounds < 20 and drafter.state.in_use == OUT


def test_two_lookup_rounds_in_a_row_do_not_leave_a_regime_for_the_rest_of_the_answer() -> None:
    """In the model's regime, the model keeping every draft: two rounds in a row of the n-gram's proposals (a phrase a
    chat answer repeats) lift the rate out of every regime well above the model's, but the saving a token that leaving
    is weighed on is read off the lasting rates (~20 rounds, `HybridState.lasting`), which a burst hardly moves: the
    regime is kept through the burst and after it. Weighed on the short rates, the second round left it."""
    drafter, _model = hybrid(model_accepts=4, ngram_accepts=4, pending=2, in_use="model",
                             own={"model": catch_up_by_the_batch()})
    terms, rng = Terms(8, 64, False, 1000), np.random.default_rng(0)
    emitted = [*NO_MATCH]
    assert kept_rounds(drafter, emitted, terms, rng, 20) == ["model"] * 20
    emitted.extend(MATCH)  # the text repeats what it wrote for two rounds
    assert kept_rounds(drafter, emitted, terms, rng, 2, copying=True) == ["model"] * 2
    regimes = drafter.state.regimes
    assert regimes[OUT].rate > 1.25 * regimes["model"].rate
    assert kept_rounds(drafter, emitted, terms, rng, 10) == ["model"] * 10


def test_a_lookup_round_in_a_new_texts_first_rounds_does_not_leave_the_regime_it_began_in() -> None:
    """A new text that begins in the model's regime (the model lacks little of its prompt), the model keeping every
    draft: in its first `SETTLE_ROUNDS` rounds the rates, the lasting ones too, are mostly the last text's, and one round
    of the n-gram's proposal lifts the rate out above the model's by more than the model's catch-up costs a token. The
    regime is not left on it, as it is not entered for its pay-back in those rounds: left so, a 64-token story ran 11
    plain rounds before the model's regime was entered again."""
    drafter, _model = hybrid(model_accepts=4, ngram_accepts=4, pending=2, in_use="model",
                             own={"model": catch_up_by_the_batch()})
    terms, rng = Terms(8, 64, False, 1000), np.random.default_rng(0)
    emitted = [*NO_MATCH]
    kept_rounds(drafter, emitted, terms, rng, 20)  # the last text, drafted with the model
    drafter.start(emitted)
    assert drafter.catch_up(emitted, 64) is None and drafter.state.in_use == "model"
    drafter.offer(emitted, terms, GREEDY, rng)
    drafter.update(4, 4)
    emitted.extend(MATCH)  # the text's second round: the n-gram proposes its next 8 tokens
    [first, *_] = drafter.offer(emitted, terms, GREEDY, rng)
    regimes = drafter.state.regimes
    assert first.way == "ngram" and regimes[OUT].rate > 1.25 * regimes["model"].rate
    assert drafter.state.in_use == "model"
