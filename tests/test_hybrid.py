"""The default drafting (the hybrid): which way it takes and what it offers the planner, on a synthetic machine
with stand-in drafters."""

from __future__ import annotations

import time

import numpy as np
import pytest

from spec_cli.decoding.costs import HOST, LoopCosts
from spec_cli.decoding.draft_length import TEXT_ROUNDS, FixedK, Pool
from spec_cli.decoding.drafter import Draft, Terms
from spec_cli.decoding.sampling import SamplingParams
from spec_cli.drafting.entry import OUT
from spec_cli.drafting.hybrid import K_START, HybridDrafter
from spec_cli.drafting.hybrid_state import HybridState
from spec_cli.drafting.ngram import NgramDrafter
from spec_cli.llama.grammar import Grammar
from support.hybrids import GREEDY, MATCH, NO_MATCH, FakeModel, choice, hybrid, machine


def test_hybrid_tries_what_is_not_priced_yet() -> None:
    """Before any cost is measured (no cost book), each option is tried: the n-gram first, as it decodes
    nothing, then the model, then a plain step."""
    state = HybridState({"ngram": FixedK(4), "model": FixedK(4)})
    costs = LoopCosts()
    drafter = HybridDrafter(NgramDrafter(n_vocab=100), {"model": FakeModel()}, {"model": costs},
                            LoopCosts.sharing(costs.verify, 1.0, HOST, costs.position), state)
    drafter.prefill(MATCH[:1])
    assert choice(drafter, MATCH) == "ngram"
    assert choice(drafter, NO_MATCH) == "model"
    costs.draft.record(1, 0.012)
    costs.draft.record(2, 0.016)
    assert choice(drafter, NO_MATCH) == "model"  # its steps are priced, the target's pass over them is not
    costs.verify.record(5, 0.041)  # a pass over [last, d1..d4]
    choice(drafter, NO_MATCH)
    assert drafter.chosen is not None and drafter.chosen[1] > 0  # every option priced: a choice by rates


def test_hybrid_takes_the_drafter_that_serves_the_rate_best() -> None:
    # A perfect n-gram costs no draft steps: it wins on text that matches; the model on text that does not.
    drafter, _ = hybrid(model_accepts=4, ngram_accepts=4)
    assert choice(drafter, MATCH) == "ngram" and drafter.state.in_use == OUT
    drafter, _ = hybrid(model_accepts=4, ngram_accepts=4)
    assert choice(drafter, NO_MATCH) == "model" and drafter.state.in_use == "model"
    # A draft model that is never right costs more than it yields: plain target steps instead.
    drafter, model = hybrid(model_accepts=0, ngram_accepts=0)
    assert [choice(drafter, tokens) for tokens in (MATCH, NO_MATCH)] == ["none", "none"]
    assert model.proposed == 0


def test_the_cheapest_of_several_own_drafters_is_taken() -> None:
    """Two own drafters as good as each other (a draft model, an MTP head): the one whose steps cost less."""
    cheap = LoopCosts()
    for k in range(9):
        cheap.verify.record(k + 1, 0.025 + 0.004 * k)
    for n in (1, 2, 10, 40):
        cheap.draft.record(n, 0.002 * n)
    drafter, _ = hybrid(model_accepts=4, own={"model": machine(), "mtp": cheap})
    assert choice(drafter, NO_MATCH) == "mtp" and drafter.state.in_use == "mtp"


def test_leaving_a_drafters_regime_is_free() -> None:
    """A model that is never right, in use when the text turns to copying: the n-gram's regime takes over at
    once, as leaving costs nothing."""
    drafter, _ = hybrid(model_accepts=0, ngram_accepts=4, in_use="model")
    assert choice(drafter, MATCH) == "ngram" and drafter.state.in_use == OUT


def test_the_regime_in_use_charges_its_drafters_catch_up() -> None:
    """An n-gram right once in four (2 tokens for a 41 ms verify) beats a plain step, and a perfect model
    (5 for 93 ms) only out of the model's regime; in it, the model would catch up on those 2 tokens later
    (8 ms)."""
    choices = {}
    for regime, other in (("model", OUT), (OUT, "model")):
        drafter, _ = hybrid(model_accepts=4, ngram_accepts=1, in_use=regime)
        drafter.state.regimes[regime].add(50.0, 1.0, 1.0)  # 50 tokens a second lately
        drafter.state.regimes[other].add(40.0, 1.0, 1.0)  # the other regime's choices would have made 40
        choices[regime] = choice(drafter, MATCH)
        assert drafter.state.in_use == regime
    assert choices == {"model": "model", OUT: "ngram"}


def test_a_regime_rate_lagging_above_its_options_still_drafts() -> None:
    """A model's regime whose running rate (200 tokens a second, from a prior since unlearnt) is above anything this
    round's options yield (a perfect model, 5 tokens for ~90 ms): weighed at that rate every option loses, the
    shortest least, and the regime would step without a draft. No mix of the options beats the best of them, so ρ
    is that one's rate and the model drafts."""
    drafter, model = hybrid(model_accepts=4, ngram_accepts=0, in_use="model")
    drafter.state.regimes["model"].add(200.0, 1.0, 1.0)
    drafter.state.regimes[OUT].add(1.0, 1.0, 1.0)
    assert choice(drafter, NO_MATCH) == "model" and model.proposed == 1


def test_the_ngram_lookups_host_time_is_priced() -> None:
    """A perfect n-gram whose lookup takes 0.1 s yields less per second than the model: the model drafts."""
    class SlowLookup(NgramDrafter):
        def propose(self, tokens: list[int], k: int, sampling: SamplingParams, rng: np.random.Generator,
                    grammar: Grammar | None = None) -> Draft:
            time.sleep(0.1)
            return super().propose(tokens, k, sampling, rng, grammar)

    drafter, _ = hybrid(model_accepts=4, ngram_accepts=4)
    assert choice(drafter, MATCH) == "ngram"
    drafter, _ = hybrid(model_accepts=4, ngram_accepts=4)
    drafter.lookup = SlowLookup(n_vocab=100)
    assert choice(drafter, MATCH) == "model"


def test_a_new_prompt_starts_afresh() -> None:
    """A new prompt: no regret carries over, the regime in use stays, and the rates learnt on the last text weigh
    a round or two."""
    drafter, _ = hybrid(model_accepts=4, pending=40)
    assert choice(drafter, NO_MATCH) == "none" and drafter.state.regret_s > 0
    drafter.state.regimes[OUT].add(20, 0.1, 1.0)
    rate = drafter.state.regimes[OUT].rate
    drafter.start(MATCH[:1])
    assert drafter.state.regret_s == 0.0 and drafter.state.in_use == OUT
    assert drafter.state.regimes[OUT].rate == pytest.approx(rate)
    for _ in range(3):
        drafter.state.regimes[OUT].add(1, 0.025, drafter.state.decay)
    assert drafter.state.regimes[OUT].rate < 0.5 * rate


def test_a_new_long_prompt_leaves_the_regime_of_the_drafter_that_lacks_it() -> None:
    """In the model's regime, a new prompt the model lacks more than a chunk of is not paid for because the last
    one drafted with the model: the regime is left, and that backlog is priced as any entry is. Once a round of
    its regime chooses the model, it pays its backlog first, a chunk between rounds, and drafts nothing meanwhile;
    a short backlog is caught up in the round's draft."""
    drafter, model = hybrid(model_accepts=4, pending=300, in_use="model")
    drafter.start(MATCH[:1])
    assert drafter.catch_up(NO_MATCH, 64) is None and drafter.state.in_use == OUT and model.backlog == 300
    drafter.state.in_use = "model"  # entered later: the regret reached the backlog's price
    assert drafter.catch_up(NO_MATCH, 64) is None  # nothing is fed before a round chooses the model
    assert choice(drafter, NO_MATCH) == "none" and model.proposed == 0  # not offered while it lacks so much
    done = drafter.catch_up(NO_MATCH, 64)
    assert done is not None and done.left == 236 and drafter.state.in_use == "model"
    drafter, model = hybrid(model_accepts=4, pending=10, in_use="model")
    drafter.start(MATCH[:1])
    assert drafter.catch_up(NO_MATCH, 64) is None and drafter.state.in_use == "model"
    assert choice(drafter, NO_MATCH) == "model" and model.proposed == 1


def test_an_ngram_sitting_out_is_scored_in_hindsight() -> None:
    """Learnt on other text, the n-gram looks useless and sits out; its proposals, scored against what each
    round emitted, bring it back once the text repeats itself."""
    drafter, _ = hybrid(model_accepts=0, ngram_accepts=0)
    sequence = [1, 2, 3, 4, 5, 6, 7, 8] * 20
    drafter.rewind(1)
    length, chosen = 11, []
    while len(chosen) < 60 and "ngram" not in chosen:
        drafter.propose(sequence[:length], 4, GREEDY, np.random.default_rng(0))
        assert drafter.chosen is not None
        chosen.append(drafter.chosen[0])
        length += 1  # a plain target step emitted one token: the one the n-gram proposed first
    assert chosen[0] == "none" and chosen[-1] == "ngram"


@pytest.mark.parametrize("taken", [False, True])
def test_a_lookup_proposal_the_batch_passed_over_is_scored_in_hindsight(taken: bool) -> None:
    """The planner may give the lookup's proposal no K though the hybrid chose it (a full pass, a band read low): the
    tokens that follow score it, as they do one the hybrid did not choose, else a band read low stayed so (a third of
    the memory's proposals at `--parallel 4`, passed over, kept as many tokens as the ones taken). One the batch took
    is scored by its own round only."""
    drafter, _ = hybrid(model_accepts=0, ngram_accepts=4)
    drafter.rewind(1)
    [offer] = drafter.offer(MATCH, Terms(8, 64, True, 100), GREEDY, np.random.default_rng(0))
    assert offer.way == "ngram"
    band = drafter.state.lookup_acceptance(3)  # [1, 2, 3] matched
    if taken:
        drafter.take("ngram", 3)
        drafter.propose(MATCH, 3, GREEDY, np.random.default_rng(0))
    drafter.update(3 if taken else 0, 3 if taken else 0)
    before = band.measured
    drafter.offer([*MATCH, 4, 5, 6, 7], Terms(8, 64, True, 100), GREEDY, np.random.default_rng(0))
    assert band.measured == pytest.approx(before if taken else before * band.decay + 1.0)


def test_each_round_says_which_way_drafted_it() -> None:
    for tokens, way in ((MATCH, "ngram"), (NO_MATCH, "model")):
        drafter, _ = hybrid(model_accepts=4, ngram_accepts=4)
        drafter.rewind(1)
        assert drafter.propose(tokens, 4, GREEDY, np.random.default_rng(0)).way == way


def test_an_offer_decides_the_way_and_the_round_drafts_it_at_the_batchs_k() -> None:
    """Under a scheduler the hybrid chooses its way first (`offer`), priced by that way's book, and the round that
    follows drafts that way at the K the batch gave, without choosing again."""
    drafter, model = hybrid(model_accepts=1, ngram_accepts=4)
    drafter.rewind(1)
    [offer] = drafter.offer(MATCH, Terms(8, 64, True, 100), GREEDY, np.random.default_rng(0))
    assert drafter.chosen is not None and drafter.chosen[0] == "ngram" == offer.way
    assert offer.costs is drafter.costs and offer.costs.shape == HOST
    assert offer.cap == 8  # [4, 5, 6, 7, 8, 1, 2, 3] follow [1, 2, 3]: the batch chooses K within what was proposed
    regret, lookups = drafter.state.regret_s, drafter._lookups.tokens
    draft = drafter.propose(MATCH, 2, GREEDY, np.random.default_rng(0))
    assert draft.tokens == [4, 5] and draft.way == "ngram" and model.proposed == 0
    assert (drafter.state.regret_s, drafter._lookups.tokens) == (regret, lookups)  # no second choice

    drafter, model = hybrid(model_accepts=4, ngram_accepts=0, pending=7, in_use="model")
    drafter.rewind(1)
    # No n-gram match: the model alone.
    [offer] = drafter.offer(NO_MATCH, Terms(8, 64, True, 100), GREEDY, np.random.default_rng(0))
    assert offer.way == "model" and offer.costs is drafter.books["model"] and offer.backlog == 7 and offer.cap == 4
    assert drafter.propose(NO_MATCH, 3, GREEDY, np.random.default_rng(0)).tokens == [9, 9, 9]


def test_alone_an_own_drafter_is_offered_at_its_steady_price_and_catches_up_in_chunks() -> None:
    """Alone, entering the model's regime was priced against the rounds after it: the offer carries a steady round's
    backlog, [d_K, bonus], not all it lacks (the planner would weigh that catch-up against one round), and a backlog
    over a chunk is taken a chunk a step first."""
    drafter, _model = hybrid(model_accepts=4, ngram_accepts=0, pending=7, in_use="model")
    drafter.rewind(1)
    [offer] = drafter.offer(NO_MATCH, Terms(8, 64, False, 100), GREEDY, np.random.default_rng(0))
    assert offer.way == "model" and offer.backlog == 2
    drafter, _model = hybrid(model_accepts=4, ngram_accepts=0, pending=300, in_use="model")
    drafter.rewind(1)
    assert drafter.catch_up(NO_MATCH, 64) is None  # the new prompt's first round: the regime is left
    drafter.state.in_use = "model"
    offers = drafter.offer(NO_MATCH, Terms(8, 64, False, 100), GREEDY, np.random.default_rng(0))
    assert [offer.way for offer in offers] == ["none"] and drafter.catch_up(NO_MATCH, 64) is not None


def test_left_alone_a_drafter_the_batch_did_not_catch_up_weighs_its_entry_again() -> None:
    """In the model's regime under a batch that gave it no K (its catch-up would hold every sequence up), the model
    falls behind. When the others end, it is not offered at a steady round's price (its whole backlog would come with
    its first step, for the answer's last rounds: 0.4 to 0.65 s on the demo pair at the end of four requests): its
    regime is left, and entering is weighed against what the answer still emits. A drafter a steady round behind
    keeps its regime."""
    rng = np.random.default_rng(0)
    drafter, model = hybrid(model_accepts=4, ngram_accepts=0, pending=120, in_use="model")
    drafter.rewind(1)
    [offer] = drafter.offer(NO_MATCH, Terms(8, 64, True, 100), GREEDY, rng)
    assert offer.way == "model" and offer.backlog == 120  # the batch's to weigh
    offers = drafter.offer([*NO_MATCH, 9], Terms(8, 512, False, 4), GREEDY, rng)  # a round on, alone, 4 tokens left
    assert drafter.state.in_use == OUT and [offer.way for offer in offers] == ["none"]
    drafter, model = hybrid(model_accepts=4, ngram_accepts=0, pending=2, in_use="model")
    drafter.rewind(1)
    drafter.offer(NO_MATCH, Terms(8, 64, True, 100), GREEDY, rng)
    [offer] = drafter.offer([*NO_MATCH, 9], Terms(8, 512, False, 4), GREEDY, rng)
    assert drafter.state.in_use == "model" and offer.way == "model"


def test_under_auto_the_planners_k_is_the_k_a_way_is_priced_at() -> None:
    """Under auto the planner owns K: the K it gives a way (`take`) is the one that way's option is priced at in the
    rounds after (the way's controller only keeps acceptance), and before any, `K_START`."""
    drafter, _model = hybrid(model_accepts=1, ngram_accepts=4)
    drafter.state.ks.update({"ngram": K_START, "model": K_START})
    drafter.rewind(1)
    drafter.offer(MATCH, Terms(8, 64, False, 100), GREEDY, np.random.default_rng(0))
    drafter.take("ngram", 6)
    assert drafter.propose(MATCH, 6, GREEDY, np.random.default_rng(0)).tokens == [4, 5, 6, 7, 8, 1]
    assert drafter.state.ks == {"ngram": 6, "model": K_START} and drafter._k("ngram", 16) == 6
    assert drafter._k("ngram", 3) == 3  # never past the cap of this round


def test_a_k_cut_short_by_the_round_is_not_the_ways_k() -> None:
    """A K as far as the way could go this round (the answer's last tokens, a short proposal) may be less than the
    planner wanted: it does not lower the K the way is priced at in the rounds after, and one as far as a whole way
    goes raises it."""
    drafter, _model = hybrid(model_accepts=4, ngram_accepts=0, in_use="model")
    drafter.state.ks.update({"ngram": K_START, "model": 7})
    drafter.rewind(1)
    [offer] = drafter.offer(NO_MATCH, Terms(3, 64, False, 4), GREEDY, np.random.default_rng(0))  # 4 tokens left
    assert offer.way == "model" and offer.cap == 3
    drafter.take("model", 3)
    assert drafter.state.ks["model"] == 7
    drafter.offer(NO_MATCH, Terms(16, 64, False, 100), GREEDY, np.random.default_rng(0))
    drafter.take("model", 4)  # the model's controller may draft 4 at most (`hybrid`'s k): as far as it goes
    assert drafter.state.ks["model"] == 7
    drafter.offer(NO_MATCH, Terms(16, 64, False, 100), GREEDY, np.random.default_rng(0))
    drafter.state.ks["model"] = 2
    drafter.take("model", 4)
    assert drafter.state.ks["model"] == 4


def test_the_batch_may_take_the_lookup_the_hybrid_offers_beside_its_choice() -> None:
    """Where the hybrid prefers its model, it offers the lookup's proposal too: a batch that finds the model's steps
    and catch-up too dear in a full pass takes the lookup (`take`), and the round drafts it; its acceptance learns."""
    drafter, model = hybrid(model_accepts=4, ngram_accepts=0, in_use="model")
    drafter.rewind(1)
    offers = drafter.offer(MATCH, Terms(8, 64, True, 100), GREEDY, np.random.default_rng(0))
    assert [offer.way for offer in offers] == ["model", "ngram"] and offers[1].costs.shape == HOST
    drafter.take("ngram", 3)
    draft = drafter.propose(MATCH, 3, GREEDY, np.random.default_rng(0))
    assert draft.tokens == [4, 5, 6] and draft.way == "ngram" and model.proposed == 0
    reached = drafter.state.lengths["ngram"].acceptance.measured
    drafter.update(3, 3)
    assert drafter.state.lengths["ngram"].acceptance.measured > reached


def test_a_lookup_offered_in_a_drafters_regime_carries_that_drafters_catch_up_on_it() -> None:
    """In the model's regime the model will take in what a lookup's round emits, with the bonus token, at its next
    round: the lookup is offered with that catch-up, c_d(1 + E) − c_d(1), as the regime prices it; out of every own
    drafter's regime it leaves nothing to pay."""
    owed = {}
    for regime, model_accepts in (("model", 4), (OUT, 0)):  # a model never right is left
        drafter, _model = hybrid(model_accepts=model_accepts, ngram_accepts=1, in_use=regime)
        drafter.rewind(1)
        offers = drafter.offer(MATCH, Terms(8, 64, True, 100), GREEDY, np.random.default_rng(0))
        assert drafter.state.in_use == regime
        [lookup] = [offer for offer in offers if offer.way == "ngram"]
        owed[regime] = lookup.owed_s
        tokens = 1 + round(lookup.acceptance.expected_tokens(lookup.cap))
        catch_up = drafter.books["model"].draft
    assert owed[OUT] == 0.0
    assert owed["model"] > 0
    assert owed["model"] == pytest.approx(catch_up.interpolated(tokens) - catch_up.interpolated(1))


def test_a_round_without_a_choice_teaches_nothing() -> None:
    """A round a scheduler gave K = 0 without asking the hybrid (a quiet step) does not count the last round's decodes
    or acceptance again."""
    drafter, _ = hybrid(model_accepts=4, ngram_accepts=0)
    choice(drafter, NO_MATCH)
    drafter.update(4, 4)
    reached = drafter.state.lengths["model"].acceptance.measured
    drafter.update(0, 0)
    assert drafter.chosen is None and drafter.state.lengths["model"].acceptance.measured == reached


def test_an_unpriced_catch_up_is_not_offered_whole_to_a_batch() -> None:
    """A drafter whose decodes its book has not measured, lacking more than a chunk, is not offered with its whole
    backlog (a batch would take an unpriced catch-up as free and hold every sequence up on it): it catches up a chunk
    a step first, as alone. Once its decodes are priced, the batch gets the whole backlog to weigh."""
    drafter, model = hybrid(model_accepts=4, ngram_accepts=0, pending=300, in_use="model")
    book = drafter.books["model"]
    drafter.books["model"] = LoopCosts.sharing(book.verify, 1.0, "per token", book.position)  # nothing measured
    drafter.rewind(1)
    assert drafter.catch_up(NO_MATCH, 64) is None  # the new prompt's first round: the regime is left
    drafter.state.in_use = "model"  # entered later
    offers = drafter.offer(NO_MATCH, Terms(8, 64, True, 100), GREEDY, np.random.default_rng(0))
    assert [offer.way for offer in offers] == ["none"] and drafter.catch_up(NO_MATCH, 64) is not None
    drafter, model = hybrid(model_accepts=4, ngram_accepts=0, pending=300, in_use="model")
    drafter.rewind(1)
    assert drafter.catch_up(NO_MATCH, 64) is None
    drafter.state.in_use = "model"
    [offer] = drafter.offer(NO_MATCH, Terms(8, 64, True, 100), GREEDY, np.random.default_rng(0))
    assert offer.way == "model" and offer.backlog == 300 and drafter.catch_up(NO_MATCH, 64) is None


def test_a_lookup_proposal_is_priced_by_what_proposals_after_as_long_a_match_kept() -> None:
    """Proposals after a long match keep more than those after a short one (the demo's memory: 4.4 tokens each after
    8 or more matching tokens, 0.6 after 2–3): each band of match length learns its own acceptance, and a round's
    proposal is offered and priced with its band's. After [1, 2, 3] the band of 2–3 says the lookup loses; after
    [1, 2, 3, 4] the band of 4–7 says it wins."""
    drafter, _ = hybrid(model_accepts=0, ngram_accepts=2)
    short, long = drafter.state.lookup_acceptance(3), drafter.state.lookup_acceptance(4)
    for _ in range(20):
        short.update(4, 0)
        long.update(4, 4)
    for tokens, band, way in ((MATCH, short, "none"), ([1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4], long, "ngram")):
        drafter.rewind(1)
        offers = drafter.offer(tokens, Terms(8, 64, False, 100), GREEDY, np.random.default_rng(0))
        assert offers[-1].way == "ngram" and offers[-1].acceptance is band
        assert drafter.chosen is not None and drafter.chosen[0] == way


def test_the_time_in_llama_cpp_of_the_default_is_its_own_drafters() -> None:
    """The round timer reads a drafter's `clocks`: the default's are every own drafter's, and a lookup has none."""
    books = {"model": machine(), "mtp": machine()}
    drafter, model = hybrid(model_accepts=4, own=books)
    assert drafter.clocks == (*model.clocks, *drafter.own["mtp"].clocks) and NgramDrafter(n_vocab=100).clocks == ()


def test_an_own_drafter_whose_acceptance_is_barely_measured_is_tried_until_a_text_of_it_is_known() -> None:
    """A draft model that has drafted one round on any text (a cold cost book's) is not priced by that round: it is
    tried and offered with the optimism of a drafter never measured, until it has drafted `TEXT_ROUNDS` rounds on a
    text; then its acceptance prices it, and a poor one is left out."""
    drafter, model = hybrid(model_accepts=1, ngram_accepts=0)
    assert choice(drafter, NO_MATCH) == "none"  # 1 of 4 kept: not worth its steps
    pool = drafter.state.lengths["model"].acceptance.pooled = Pool(0.995)
    pool.update(4, 1)
    assert choice(drafter, NO_MATCH) == "model" and drafter.state.in_use == "model"
    drafter.rewind(1)
    [offer] = drafter.offer(NO_MATCH, Terms(8, 64, False, 100), GREEDY, np.random.default_rng(0))
    assert offer.way == "model" and offer.acceptance.gains(4) == [1.0] * 4
    assert drafter.propose(NO_MATCH, 4, GREEDY, np.random.default_rng(0)).way == "model"  # the round it offered
    for _ in range(TEXT_ROUNDS - 1):
        pool.update(4, 1)
    drafter.state.in_use = OUT
    assert choice(drafter, NO_MATCH) == "none"


def settled(drafter: HybridDrafter, tokens: list[int]) -> None:
    """Past a new text's first rounds, which each choose afresh (`RegimeEntry.settled`), as the loop runs them: a
    round's catch-up, the offer, its K taken, its draft, what was kept of it."""
    drafter.rewind(1)
    rng = np.random.default_rng(0)
    for _ in range(3):
        drafter.catch_up(tokens, 64)
        [offer, *_] = drafter.offer(tokens, Terms(8, 64, False, 100), GREEDY, rng)
        drafter.take(offer.way, 4)
        draft = drafter.propose(tokens, 4, GREEDY, rng)
        drafter.update(len(draft.tokens), len(draft.tokens))


def test_a_choice_of_no_draft_stands_while_the_lookup_proposes_nothing_out_of_every_regime() -> None:
    """The planner's choice of no draft may stand for a round (`still_idle`) while the lookup proposes nothing, past a
    new text's first rounds and out of every own drafter's regime: a round that stands prices no way and weighs no
    regime; a lookup that starts proposing (a copy begins) ends it."""
    drafter, model = hybrid(model_accepts=0, ngram_accepts=0)
    drafter.rewind(1)
    rng = np.random.default_rng(0)
    assert not drafter.still_idle(NO_MATCH, 8, GREEDY, rng)  # a new text: its first rounds are each weighed
    settled(drafter, NO_MATCH)
    regret, rounds = drafter.state.regret_s, drafter.entry._rounds
    assert drafter.still_idle(NO_MATCH, 8, GREEDY, rng)
    drafter.stood()
    assert (drafter.state.regret_s, drafter.entry._rounds, model.proposed) == (regret, rounds, 0)
    assert not drafter.still_idle(MATCH, 8, GREEDY, rng)  # the lookup proposes now
    drafter, _model = hybrid(model_accepts=4, ngram_accepts=0, in_use="model")
    settled(drafter, NO_MATCH)
    assert not drafter.still_idle(NO_MATCH, 8, GREEDY, rng)  # in the model's regime every round is chosen


def test_the_rounds_a_choice_stood_for_count_at_the_next() -> None:
    """The next choice after rounds a choice of no draft stood for counts each of them: the regimes' rates as that
    many rounds of their choices priced now, and the rounds of the text the regime entry waits for; a choice made
    after two such rounds and one made at once, from the same state, differ by those two rounds."""
    after_stands, at_once = (hybrid(model_accepts=0, ngram_accepts=0)[0] for _ in range(2))
    for drafter in (after_stands, at_once):
        settled(drafter, NO_MATCH)
    before = {regime: (rate.tokens, rate.seconds) for regime, rate in after_stands.state.regimes.items()}
    for _ in range(2):
        assert after_stands.still_idle(NO_MATCH, 8, GREEDY, np.random.default_rng(0))
        after_stands.stood()
    for drafter in (after_stands, at_once):
        drafter.offer(NO_MATCH, Terms(8, 64, False, 100), GREEDY, np.random.default_rng(0))
    assert after_stands.entry._rounds == at_once.entry._rounds + 2
    decay = at_once.state.decay
    for regime, (tokens, seconds) in before.items():
        one = at_once.state.regimes[regime]
        added = (one.tokens - tokens * decay, one.seconds - seconds * decay)  # one round of its choice, priced now
        three = after_stands.state.regimes[regime]
        assert three.tokens == pytest.approx(tokens * decay ** 3 + added[0] * (1 + decay + decay ** 2))
        assert three.seconds == pytest.approx(seconds * decay ** 3 + added[1] * (1 + decay + decay ** 2))
        assert added[1] > 0
