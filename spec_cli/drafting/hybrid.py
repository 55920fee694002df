"""The hybrid drafter, the default way of drafting: each round a lookup (the memory's, or n-gram lookup), one
of the pair's own drafters (a draft model, an EAGLE-3 head, a DFlash drafter, the target's MTP head) or no
draft at all, whichever is expected to serve the long-run rate best (the policy is in `HybridDrafter`'s
notes)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from spec_cli.decoding.costs import STEADY_BACKLOG, LoopCosts
from spec_cli.decoding.draft_length import PositionAcceptance
from spec_cli.decoding.drafter import CatchUp, Draft, Drafter, DraftSteps, Offer, Terms
from spec_cli.decoding.sampling import SamplingParams
from spec_cli.drafting.base import CatchUpDrafter
from spec_cli.drafting.entry import OUT, RegimeEntry
from spec_cli.drafting.hybrid_state import LASTING_DECAY, DecayedRate, HybridState
from spec_cli.llama.context import Context
from spec_cli.llama.grammar import Grammar

K_START = 4  # under auto, the K a way is priced at until the planner has given it one
NONE = "none"


@dataclass(frozen=True)
class Option:
    """One way to draft this round: E[tokens] it emits and E[seconds] it takes (None: not priced yet)."""

    tokens: float
    seconds: float | None


class HybridDrafter(Drafter):
    """Each round, the lookup (below "n-gram": the memory's where the pair keeps one, else n-gram lookup), one
    of the pair's own drafters or no draft at all (a plain target step, K = 0), whichever is expected to serve
    the long-run rate best.

    Each option is priced by the cost model (`LoopCosts`): E[tokens] from its drafter's acceptance by
    position, E[seconds] from the costs measured on this machine (the cost book a pair starts from, then
    the running means): its drafting (an n-gram proposal's host time, a model's steps), the target's pass
    over its K + 1 rows, the loop's own work per token. An option not priced yet is tried once.

    An own drafter sits out the rounds others draft and catches up on them in one batch when it is next
    chosen. Whether that backlog is a cost depends on whether the drafter will be used again, so the choice
    is made within a regime: "d in use" (d, n-gram or none; each round d does not draft is charged what its
    catch-up grows by) or "out" (n-gram or none, uncharged). Within a regime the choice is the largest
    E[tokens] − ρ·E[seconds], ρ the rate that regime's choices have been yielding (a renewal-reward argument:
    the rule that maximises tokens per second over many rounds). Every regime's choice is priced every round,
    so each regime's rate is known whichever runs; the loop runs in the regime with the best rate, except that
    entering a drafter's regime means paying its backlog first (`entry.RegimeEntry`: when that pays). Which drafter
    proposed a token never touches exactness.
    """

    chooses_ways = True
    idle_way = NONE

    def __init__(self, lookup: Drafter, own: dict[str, CatchUpDrafter], books: dict[str, LoopCosts],
                 costs: LoopCosts, state: HybridState) -> None:
        """`lookup`: the drafter that costs no decode (n-gram lookup, or the memory's: `state.lookup` names it);
        `own`: the pair's own drafters by mode name, each priced with its book in `books` (which knows its cost
        shape); `costs`: the hybrid's own book (the target's passes, the loop's work), which prices n-gram and plain
        rounds."""
        self.lookup = lookup
        self.lookup_name = state.lookup
        self.own = own
        self.clocks = tuple(clock for drafter in own.values() for clock in drafter.clocks)
        self.books = books
        self.costs = costs
        self.state = state
        for regime in (OUT, *own):
            state.regimes.setdefault(regime, DecayedRate())
            state.lasting.setdefault(regime, DecayedRate())
        if state.in_use not in state.regimes:
            state.in_use = OUT
        self.chosen: tuple[str, float] | None = None  # the option of the round in flight, and its E[seconds]
        self._draft = Draft()  # the proposal of the round in flight
        self._context = 0  # the tokens it follows
        self._decided: Draft | None = None  # a round `stepped` chose, for the `propose` that follows it
        self._offered: tuple[int, str, Draft] | None = None  # (where, the option, the lookup's proposal) `offer` chose
        self._unused: tuple[int, Draft] | None = None  # (where, what): the n-gram proposal a round passed over
        self._lookups = DecayedRate()  # n-gram lookups: calls and their host seconds
        self._chunk = 1 << 30  # the most an own drafter may lack and draft: the loop's catch-up chunk
        self.entry = RegimeEntry(state, books)  # its `terms`: what the planner last asked `offer` for
        self._new = False  # a new prompt's first round is next
        self._wanted: str | None = None  # the own drafter the last choice picked while it lacked more than a chunk
        self._lacking: dict[str, int] = {}  # what each own drafter lacked when the last choice was made (`pending`)
        self._looked: tuple[int, int, Draft] | None = None  # (where, within what K, what) the lookup last proposed
        self._stood = 0  # the rounds of no draft the planner's last choice has stood for since (`stood`)

    def start(self, tokens: Sequence[int]) -> None:
        """A new prompt, which each own drafter takes in once its regime is entered (its backlog, which is
        priced): a prompt the rounds never draft for with a model costs what the target alone does."""
        self._new_prompt(tokens)
        for drafter in self.own.values():
            drafter.start(tokens)

    def catch_up(self, tokens: Sequence[int], chunk: int) -> CatchUp | None:
        """The next chunk of the catch-up of the own drafter the rounds chose while it lacked more than a chunk
        (`_ready`), as long as the loop runs in its regime: its backlog is paid when it is chosen, not while the
        lookup drafts in its regime (a backlog fed every few rounds cost the demo pair 0.8x memory drafting at
        `--parallel 4`). A new prompt the regime's drafter lacks more than a chunk of leaves the regime: that
        backlog is a price the next entry weighs, not a given (an agent's next 7k-token request is not paid for
        because the last one drafted with the model)."""
        self._chunk = chunk
        if self._wanted is None and not self._new:  # most rounds: no drafter is owed a catch-up
            return None
        in_use = self.own.get(self.state.in_use)
        if in_use is not None and self._new and in_use.pending(tokens) > chunk:
            self.state.in_use, self.state.regret_s = OUT, 0.0
        self._new = False
        if self._wanted != self.state.in_use:
            self._wanted = None
        drafter = self.own.get(self._wanted) if self._wanted is not None else None
        done = drafter.catch_up(tokens, chunk) if drafter is not None else None
        if done is None:
            self._wanted = None  # caught up: the next choice may draft with it
        else:
            self.books[self.state.in_use].record_draft(done.steps, len(tokens) - done.left)
            self.chosen = None
        return done

    def _new_prompt(self, tokens: Sequence[int]) -> None:
        self.state.new_text()
        self._unused = self._decided = self._looked = None
        self._stood = 0
        self.entry.new_text()
        self._new = True
        self.lookup.prefill(tokens)

    def propose(self, tokens: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator,
                grammar: Grammar | None = None) -> Draft:
        """This round's draft: the one `stepped` decided on, where it handed the round back, else chosen now."""
        if self._decided is not None:
            draft, self._decided = self._decided, None
            return draft
        name, looked_up, k_own = self._choice(tokens, k, sampling, rng)
        return self._made(name, looked_up, tokens, k_own, sampling, rng, grammar)

    def stepped(self, tokens: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator,
                grammar: Grammar | None = None) -> tuple[Context, DraftSteps] | None:
        """The round chosen as `propose` chooses it: a drafter that drafts step by step drafts so (a scheduler
        decodes its steps with other sequences'); any other choice is the draft the next `propose` returns."""
        name, looked_up, k_own = self._choice(tokens, k, sampling, rng)
        if name in self.own:
            stepped = self.own[name].stepped(tokens, k_own, sampling, rng, grammar)
            if stepped is not None:
                return stepped[0], self._named(stepped[1], name)
        self._decided = self._made(name, looked_up, tokens, k_own, sampling, rng, grammar)
        return None

    def _made(self, name: str, looked_up: Draft, tokens: Sequence[int], k_own: int, sampling: SamplingParams,
              rng: np.random.Generator, grammar: Grammar | None) -> Draft:
        """The round's draft, whole, by the option `name`: an own drafter's proposal, the lookup's, or none."""
        if name in self.own:
            self._draft = self.own[name].propose(tokens, k_own, sampling, rng, grammar)
        else:
            self._draft = looked_up if name == self.lookup_name else Draft()
        self._draft.way = name
        return self._draft

    def _named(self, steps: DraftSteps, name: str) -> DraftSteps:
        """`steps`, whose draft, once made, says it was `name`'s and is this round's."""
        draft = yield from steps
        draft.way = name
        self._draft = draft
        return draft

    def offer(self, tokens: Sequence[int], terms: Terms, sampling: SamplingParams,
              rng: np.random.Generator) -> list[Offer]:
        """This round's option, chosen now (as `propose` would), and the lookup's proposal where it made one and the
        option is another: the planner weighs them by their acceptance and costs in the pass (a way fit for a
        sequence alone may not be in a full pass) and sets K; the round drafts the way it takes (`take`). Where other
        sequences share the pass (`terms.shared`), an own drafter is offered with all it lacks (`backlog`): its catch-up
        holds every sequence up, so it is the batch's to weigh, and is paid only where the batch takes that way (its
        first draft step takes it in); one whose catch-up is not priced yet and lacks more than a chunk catches up a
        chunk a step first. Alone, entering a regime has been priced against the rounds after it (the ski-rental rule),
        so the drafter is offered at its steady round's price (a catch-up of at most [d_K, bonus]), and one that lacks
        more than a chunk catches up a chunk a step (`_ready`), which nobody waits on."""
        in_use = self.state.in_use
        if self.entry.shared and not terms.shared and in_use in self.own:  # the others ended
            self.entry.leave_unpaid(in_use, self.own[in_use].pending(tokens))
        self._chunk, self.entry.terms = terms.chunk, terms
        name, looked_up, k_own = self._choice(tokens, terms.k, sampling, rng, offering=True, shared=terms.shared)
        self._offered = (len(tokens), name, looked_up)
        acceptance = self.state.lookup_acceptance(looked_up.match)
        cap = len(looked_up.tokens)
        owed_s = self._left_behind_s(self.state.in_use, acceptance.expected_tokens(cap)) if cap else 0.0
        lookup = Offer(self.lookup_name, acceptance, self.costs, cap, owed_s=owed_s)
        if name == self.lookup_name:
            offers = [lookup]
        elif name not in self.own:
            offers = [Offer(NONE, lookup.acceptance, self.costs, 0), *([lookup] if lookup.cap else [])]
        else:
            offers = [self._own_offer(name, k_own, terms.shared), *([lookup] if lookup.cap else [])]
        entering = self.entry.entering
        if entering is not None and entering != name:  # the batch's to enter, by taking it
            offers.append(self._own_offer(entering, min(terms.k, self.state.lengths[entering].k_max), True))
        return offers

    def _own_offer(self, name: str, k: int, shared: bool) -> Offer:
        """Own drafter `name` offered for at most `k` tokens: with all it lacks where other sequences share the pass,
        alone with a steady round's catch-up."""
        pending = self._lacking[name]
        backlog = pending if shared else min(pending, STEADY_BACKLOG)
        acceptance = PositionAcceptance() if self._untried(name) else self.state.lengths[name].acceptance
        return Offer(name, acceptance, self.books[name], k, backlog)

    def take(self, way: str, k: int) -> None:
        """Draft the offered way `way` next round (the one this round chose, or another), which the planner gave K =
        `k`: under auto the K that way is priced at in the rounds after (`_k`), unless `k` is as far as the way could go
        this round (the tokens left before the answer's end, the lookup's proposal), where the planner may have wanted
        more: a K cut short so is not that way's (an answer's last round, drafting 3, priced the draft model at 3 for
        the answers after, whose regime then looked no better than the target alone's)."""
        terms = self.entry.terms
        if self._offered is None or terms is None:
            return
        where, name, looked_up = self._offered
        if way in self.state.ks:
            k_max = self.state.lengths[way].k_max
            cap = len(looked_up.tokens) if way == self.lookup_name else min(terms.k, k_max)
            self.state.ks[way] = k if k < cap else max(k, self.state.ks[way])
        if way == self.lookup_name:
            self._unused = None  # drafted: its round teaches it
        if name == way:
            return
        if way in self.own:  # a regime the batch entered (`RegimeEntry.entering`)
            self.state.in_use, self.state.regret_s = way, 0.0
        self._offered = (where, way, looked_up)
        self.chosen = (way, 0.0)

    def expect(self, terms: Terms) -> None:
        """Under a fixed K: the round's `terms`, which the regimes' entry and leave weigh as an offer's
        (`RegimeEntry.ahead`). Without them the tokens an answer still emits were unknown under `-k 5`: a clearly better
        regime was entered only after the ski-rental wait (a 134-token chat answer on the demo pair: 23 plain rounds
        while the model's regime read 1.3x the rate out), and a burst of lookups left it for free."""
        self._chunk, self.entry.terms = terms.chunk, terms

    def still_idle(self, tokens: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator) -> bool:
        """Whether the planner's choice of no draft may stand for this round (its last offer held no way that drafts):
        out of every own drafter's regime, the lookup still proposes nothing (its proposal, made here, is the next
        choice's where it does), no own drafter is owed a catch-up, and the text is past the rounds weighed one by one
        (`RegimeEntry.settled`: its first ones, a trial's). A round it stands for prices no way; the regimes' rates and
        the rounds a regime's entry waits for count it at the next choice (`_choose`)."""
        if self._new or self._wanted is not None or self.state.in_use != OUT or not self.entry.settled:
            return False
        started = time.perf_counter()
        looked_up, lookup_s = self._look(tokens, k, sampling, rng)
        self.plan_s += time.perf_counter() - started - lookup_s
        return not looked_up.tokens

    def stood(self) -> None:
        """A round of no draft that `still_idle` let stand: counted at the next choice."""
        self._stood += 1
        self._looked = None

    def _look(self, tokens: Sequence[int], k: int, sampling: SamplingParams,
              rng: np.random.Generator) -> tuple[Draft, float]:
        """The lookup's proposal of at most `k` tokens here, and the seconds it took now: made once a place (`still_idle`
        and the choice that follows it where the lookup proposes share it)."""
        looked = self._looked
        if looked is not None and looked[0] == len(tokens) and looked[1] == k:
            return looked[2], 0.0
        started = time.perf_counter()
        looked_up = self.lookup.propose(tokens, k, sampling, rng)
        lookup_s = time.perf_counter() - started
        self._lookups.add(1.0, lookup_s, self.state.decay)
        self._looked = (len(tokens), k, looked_up)
        return looked_up, lookup_s

    def _choice(self, tokens: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator,
                offering: bool = False, shared: bool = False) -> tuple[str, Draft, int]:
        """This round's option (see the class notes), the lookup's proposal, and K for an own drafter chosen: the
        ones `offer` chose for this place, cut to `k` (the planner's K), else chosen now. `offering`: for the planner,
        which chooses K within `k` (the lookup proposes that far, an own drafter is offered that far); else each way
        drafts at its K (`_k`). An own drafter that lacks more than a chunk catches up first (`_ready`), unless
        other sequences share the pass (`shared`) and its catch-up is priced (its book has measured its decodes)."""
        self._draft, self._context = Draft(), len(tokens)
        offered, self._offered = self._offered, None
        if offered is not None and offered[0] == len(tokens):
            _, name, looked_up = offered
            looked_up = Draft(looked_up.tokens[:k], looked_up.q[:k], match=looked_up.match)
            k_own = min(k, self.state.lengths[name].k_max) if name in self.own else 0
            return name, looked_up, k_own
        planning = time.perf_counter()
        rounds, self._stood = 1 + self._stood, 0
        self._learn_in_hindsight(tokens)
        looked_up, lookup_s = self._look(tokens, k if offering else self._k(self.lookup_name, k), sampling, rng)
        self._looked = None
        ks = {name: self._k(name, k) for name in self.own}
        options = self._price(min(len(looked_up.tokens), self._k(self.lookup_name, k)), looked_up.match, ks)
        pending = {name: self.own[name].pending(tokens) for name in self.own}
        for name, drafter in self.own.items():
            if name in options and options[name].seconds is None and pending[name] > self._chunk:
                drafter.narrow(tokens)  # a trial: the cheapest catch-up, the latest tokens only
                pending[name] = drafter.pending(tokens)
        self._lacking = pending
        name = self._choose(options, pending, ks, rounds)
        if not shared or name not in self.books or not self.books[name].draft.weight:
            name = self._ready(name, options, pending)
        self.chosen = (name, options[name].seconds or 0.0)
        self._unused = (len(tokens), looked_up) if looked_up.tokens and (offering or name != self.lookup_name) else None
        self.plan_s += time.perf_counter() - planning - lookup_s
        if name not in self.own:
            return name, looked_up, 0
        return name, looked_up, min(k, self.state.lengths[name].k_max) if offering else ks[name]

    def _k(self, name: str, k: int) -> int:
        """The K way `name` drafts and is priced at, within `k`: under auto the planner's last for it, else its
        controller's."""
        return min(k, self.state.ks.get(name) or self.state.lengths[name].next_k())

    def _price(self, n_ngram: int, match: int, ks: dict[str, int]) -> dict[str, Option]:
        """Every option of this round: no draft, the n-gram's proposal of `n_ngram` tokens after a match of `match`
        where it made one, each own drafter at its K (`_k`; where it is above 0)."""
        lengths, costs = self.state.lengths, self.costs
        none = lengths[self.lookup_name].acceptance
        options = {NONE: Option(1.0, costs.round_seconds(0, none))}
        if n_ngram:
            acceptance = self.state.lookup_acceptance(match)
            seconds = costs.round_seconds(n_ngram, acceptance)
            lookup_s = self._lookups.seconds / self._lookups.tokens
            options[self.lookup_name] = Option(acceptance.expected_tokens(n_ngram),
                                               None if seconds is None else seconds + lookup_s)
        for name, k in ks.items():
            if k:
                acceptance = lengths[name].acceptance
                options[name] = Option(acceptance.expected_tokens(k), None if self._untried(name) else
                                       self.books[name].round_seconds(k, acceptance))
        return options

    def _untried(self, name: str) -> bool:
        """Whether own drafter `name`'s acceptance rests on too little to price it: it has not drafted `TEXT_ROUNDS`
        rounds on any text (`Pool.known`). It is then tried, as a drafter whose costs are not measured is, and offered
        with the optimism of one never measured: a cold cost book's first model round, 3 of 4 drafts kept, priced the
        demo pair's draft model at K = 1 below the target alone, and a 160-token chat answer never drafted with it
        (the pinned model ran it 1.1x, keeping 0.9 of its drafts)."""
        pool = self.state.lengths[name].acceptance.pooled
        return pool is not None and not pool.known

    def _choose(self, options: dict[str, Option], pending: dict[str, int], ks: dict[str, int], rounds: int = 1) -> str:
        """Try what is not priced yet (the n-gram first: it costs no decode; an own drafter in its regime, so
        that it catches up first; one whose costs are not measured, or whose acceptance is not, `_untried`); else the
        choice of the regime the loop runs in, after weighing a trial of an own drafter on a new text or a move to the
        regime with the best rate (`entry`). `rounds`: the rounds since the last choice (those the planner's choice of
        no draft stood for, `stood`, and this one), each a round of every regime's choice as priced now."""
        self.entry.entering = None
        for name in (self.lookup_name, *self.own, NONE):
            if name in options and options[name].seconds is None:
                if name in self.own:
                    self.state.in_use = name
                return name
        state = self.state
        picks = {regime: self._regime_choice(regime, options) for regime in state.regimes}
        for regime, (name, tokens, seconds) in picks.items():
            state.regimes[regime].add(tokens, seconds, state.decay, rounds)
            state.lasting[regime].add(tokens, seconds, LASTING_DECAY, rounds)
        rates = {regime: state.regimes[regime].rate or 0.0 for regime in state.regimes}
        best = max(rates, key=lambda regime: rates[regime])
        trying = self.entry.trial(options, pending, ks, rates[OUT], rounds)
        if trying is not None:
            return trying
        comes_back = best == OUT != state.in_use and self._pays(state.in_use, options)  # only a leave reads it
        self.entry.weigh(best, rates, picks[state.in_use][1], pending, rounds, comes_back)
        return picks[state.in_use][0]

    def _pays(self, name: str, options: dict[str, Option]) -> bool:
        """Whether option `name` is priced to yield more tokens a second than a plain step: an own drafter that does is
        one its regime, left, would be come back to."""
        option, plain = options.get(name), options[NONE]
        return option is not None and option.seconds is not None and plain.seconds is not None and \
            option.tokens * plain.seconds > plain.tokens * option.seconds

    def _ready(self, name: str, options: dict[str, Option], pending: dict[str, int]) -> str:
        """`name`, unless it is an own drafter that lacks more than a chunk: that one catches up between the next
        rounds (`catch_up`), and this round the lookup's proposal drafts, or none."""
        if name not in self.own or pending[name] <= self._chunk:
            return name
        self._wanted = name
        return self.lookup_name if self.lookup_name in options else NONE

    def _regime_choice(self, regime: str, options: dict[str, Option]) -> tuple[str, float, float]:
        """(the option, its E[tokens], its E[seconds] with the catch-up it leaves) that `regime` chooses: the
        largest E[tokens] − ρ·E[seconds] among no draft, the n-gram and the regime's own drafter. ρ is the regime's
        rate, but never above the best option's own E[tokens] / E[seconds]: no mix of this round's options yields
        more, and a ρ that lags above them (a drafter's acceptance falling from its prior) prices every option at a
        loss and picks the shortest, no draft, every other round of a draft model's regime."""
        priced: dict[str, tuple[float, float]] = {}
        for name, option in options.items():
            if name in self.own and name != regime:
                continue
            assert option.seconds is not None
            seconds = option.seconds
            if name != regime:
                seconds += self._left_behind_s(regime, option.tokens)
            priced[name] = (option.tokens, seconds)
        best_rate = max(tokens / seconds for tokens, seconds in priced.values())
        rho = min(self.state.regimes[regime].rate or best_rate, best_rate)
        name = max(priced, key=lambda way: priced[way][0] - rho * priced[way][1])
        return name, *priced[name]

    def _left_behind_s(self, regime: str, tokens: float) -> float:
        """What a round of another way, emitting `tokens` on average, adds to the catch-up of `regime`'s drafter (none
        out of every own drafter's regime): it will take them in with the bonus token at its next round, c_d(1 + E)
        where a round of its own leaves it c_d(1). The planner's price of a lookup's offer carries it too: without
        it the planner took the memory's short proposals in the draft model's regime (a 134-token chat answer on the
        demo pair: 8 rounds of 1.9 tokens each, whose catch-up the model paid at its next rounds)."""
        if regime == OUT:
            return 0.0
        return self.entry.catch_up_s(regime, 1 + round(tokens)) - self.entry.catch_up_s(regime, 1)

    def _learn_in_hindsight(self, tokens: Sequence[int]) -> None:
        """Score last round's untaken n-gram proposal against the tokens the round emitted.

        An option that is not chosen is never measured, so a poor estimate (learnt on other text) would keep
        it out for good. The n-gram's can be measured for free: emitted token i follows the target's law, so
        it equals the proposal's d_i with probability p(d_i), the very chance token verification accepts a
        one-hot q with. Past the emitted tokens nothing is known, so a proposal that matched all of them
        counts as drafted that far.
        """
        if self._unused is None:
            return
        start, proposal = self._unused
        self._unused = None
        emitted = tokens[start:start + len(proposal.tokens)]
        matched = next((i for i, (d, x) in enumerate(zip(proposal.tokens, emitted)) if d != x), len(emitted))
        if emitted:
            drafted = min(matched + 1, len(emitted))
            self.state.lengths[self.lookup_name].acceptance.update(drafted, matched)
            self.state.lookup_acceptance(proposal.match).update(drafted, matched)

    def update(self, drafted: int, accepted: int) -> None:
        """The round's option learns what the target kept, its own drafter's book what its decodes cost; a round that
        made no choice (a catch-up's, or one a scheduler gave K = 0 without asking) teaches nothing."""
        if self.chosen is None:
            return
        name, self.chosen = self.chosen[0], None
        if name in self.state.lengths:
            started = time.perf_counter()
            self.state.lengths[name].update(drafted, accepted)
            if name == self.lookup_name and drafted:
                self.state.lookup_acceptance(self._draft.match).update(drafted, accepted)
            self.plan_s += time.perf_counter() - started
        if name in self.own:
            self.books[name].record_draft(self._draft.steps, self._context)
            if not drafted and self.entry.shared:  # the batch passed the round's choice over
                self.entry.leave_unpaid(name, self._lacking.get(name, 0))

    def done(self, tokens: Sequence[int], n_prompt: int, ended: bool = False) -> None:
        """The lookup keeps the output; the answer's length, and whether it ended on its own, tells what the next answers
        are expected to emit (`RegimeEntry.ahead`)."""
        self.lookup.done(tokens, n_prompt, ended)
        self.state.answers.append((len(tokens) - n_prompt, ended))

    def rewind(self, n_keep: int) -> None:
        self.lookup.rewind(n_keep)
        for drafter in self.own.values():
            drafter.rewind(n_keep)
