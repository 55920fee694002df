"""The hybrid drafter: each round n-gram lookup, the pair's own drafter (a draft model or a head, an EAGLE-3 or
DFlash drafter) or no draft,
whichever serves the long-run rate best (the policy is in `HybridDrafter`'s notes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from spec_cli.decoding.costs import FREE, PER_TOKEN, LoopCosts
from spec_cli.decoding.draft_length import DraftLength
from spec_cli.decoding.drafter import Draft, Drafter
from spec_cli.decoding.sampling import SamplingParams
from spec_cli.drafting.base import CatchUpDrafter
from spec_cli.drafting.ngram import NgramDrafter
from spec_cli.llama.grammar import Grammar

CARRIED = 0.1  # of decayed counts worth ~20 rounds, what a new prompt keeps: about two rounds


@dataclass
class HybridState:
    """What a hybrid drafter learns, kept across generations: a K controller (with its acceptance) for each
    of its drafters, how often each has drafted, ρ (the tokens per second its rounds have been yielding,
    decayed), and the regret of deferring the draft model against the backlog's price when deferring began
    (a backlog grows while the model waits; a price fixed at the start keeps the rule from chasing it)."""

    lengths: dict[str, DraftLength]
    warmup_rounds: int = 8
    decay: float = 0.95
    tokens: float = 0.0
    seconds: float = 0.0
    regret_s: float = 0.0
    backlog_s: float = 0.0
    tried: dict[str, int] = field(default_factory=dict)  # rounds each drafter has drafted
    model_share: float = 1.0  # of recent rounds, decayed: how much the draft model is still in use

    def new_text(self) -> None:
        """A new prompt: the model starts caught up (in use, nothing to defer); ρ and the n-gram's acceptance,
        learnt on other text, count for about two rounds (a lookup right on copied code is wrong on prose, and
        the reverse). The model's acceptance carries over: it depends on the pair more than on the text."""
        self.regret_s, self.model_share = 0.0, 1.0
        self.tokens, self.seconds = self.tokens * CARRIED, self.seconds * CARRIED
        self.lengths["ngram"].acceptance.forget(CARRIED)

    def record(self, chosen: str, tokens: int, seconds: float) -> None:
        """A round drafted by `chosen` emitted `tokens` in an expected `seconds` (0: not priced yet)."""
        self.tried[chosen] = self.tried.get(chosen, 0) + 1
        self.model_share = self.model_share * self.decay + (1.0 - self.decay) * (chosen == "model")
        if seconds:
            self.tokens = self.tokens * self.decay + tokens
            self.seconds = self.seconds * self.decay + seconds

    @property
    def rho(self) -> float | None:
        return self.tokens / self.seconds if self.seconds else None


class HybridDrafter(Drafter):
    """Each round, n-gram lookup, the draft model or no draft at all (a plain target step), whichever is
    expected to serve the long-run rate best.

    Each option's round is priced by the cost model (`LoopCosts`): E[tokens] from that drafter's own
    acceptance by position (n-gram rounds and model rounds are tracked apart), E[seconds] from its costs (an
    n-gram proposal is nearly free to draft; no draft yields one token for one target step). The choice is
    the largest E[tokens] − ρ·E[seconds], ρ being the rate rounds have been yielding lately: the rule that
    maximises tokens per second over many rounds (a renewal-reward argument). Picking the best rate per
    round instead would spend a 9-token, 165 ms model round where a plain step and the n-gram rounds that
    follow it yield more per second.

    The draft model sits n-gram and plain rounds out: it catches up on what they emitted in one batch when
    it is next chosen (about 4 ms a token on the demo's Q4_1 draft). So the other options are charged that
    growth of the backlog, in proportion to the model's share of recent rounds: on fresh text the model is
    in use and an n-gram round must beat it after paying its catch-up; on text that keeps repeating itself
    the model is out, and stays out. A large backlog costs more than the model's next round saves (45 tokens
    took 223 ms). So while the model would be the best choice but for its backlog, the runner-up drafts,
    and the time it loses against the model is added up; once that regret reaches the backlog's price when
    deferring began, the model pays it (the ski-rental rule: never more than twice the cost of the best
    choice in hindsight). Deferring saves the price only if the model then stays out for good, so the price
    is weighed by the share of recent rounds the model did not draft. Which drafter proposed a token never
    touches exactness (tests as for every mode).
    """

    def __init__(self, ngram: NgramDrafter, model: CatchUpDrafter, costs: LoopCosts, state: HybridState,
                 pricing: str = PER_TOKEN) -> None:
        """`pricing`: how the model's drafting grows with K (`costs.PER_TOKEN`; a block drafter's `PER_ROUND`)."""
        self.ngram = ngram
        self.model = model
        self.pricing = pricing
        self.costs = costs
        self.state = state
        self.chosen: tuple[str, float] | None = None  # the option of the round in flight, and its E[seconds]
        self._unused: tuple[int, list[int]] | None = None  # (where, what): the n-gram proposal a round passed over

    @property
    def busy_s(self) -> float:
        return self.model.busy_s

    @property
    def rollback_s(self) -> float:
        return self.model.rollback_s

    def prefill(self, tokens: Sequence[int]) -> list[tuple[int, float]]:
        """A new prompt, taken in whole by the model (see `HybridState.new_text`)."""
        self._new_prompt(tokens)
        return self.model.prefill(tokens)

    def start(self, tokens: Sequence[int]) -> None:
        """A new prompt, which the model takes in when it first drafts (its backlog, which the hybrid prices)."""
        self._new_prompt(tokens)
        self.model.start(tokens)

    def _new_prompt(self, tokens: Sequence[int]) -> None:
        self.state.new_text()
        self._unused = None
        self.ngram.prefill(tokens)

    def propose(self, tokens: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator,
                grammar: Grammar | None = None) -> Draft:
        lengths = self.state.lengths
        self._learn_in_hindsight(tokens)
        ngram = self.ngram.propose(tokens, min(k, lengths["ngram"].next_k()), sampling, rng)
        k_model = min(k, lengths["model"].next_k())
        options = {"none": (0, lengths["model"].acceptance, FREE)}
        if ngram.tokens:
            options["ngram"] = (len(ngram.tokens), lengths["ngram"].acceptance, FREE)
        if k_model:
            options["model"] = (k_model, lengths["model"].acceptance, self.pricing)
        priced = {name: (acceptance.expected_tokens(n), self.costs.round_seconds(n, acceptance, pricing))
                  for name, (n, acceptance, pricing) in options.items()}
        name = self._choose(priced, self.model.pending(tokens))
        self.chosen = (name, priced[name][1] or 0.0)  # 0: not priced yet, so left out of ρ
        self._unused = (len(tokens), ngram.tokens) if ngram.tokens and name != "ngram" else None
        if name == "model":
            return self.model.propose(tokens, k_model, sampling, rng, grammar)
        return ngram if name == "ngram" else Draft()

    def _choose(self, priced: dict[str, tuple[float, float | None]], pending: int) -> str:
        """The option with the largest E[tokens] − ρ·E[seconds] (see the class notes)."""
        state = self.state
        for name in ("ngram", "model"):
            if name in priced and (priced[name][1] is None or state.tried.get(name, 0) < state.warmup_rounds):
                return name  # too little known yet: try it (the n-gram first, it costs no draft-model work)
        if priced["none"][1] is None:
            return "none"
        rho = state.rho or 1.0 / priced["none"][1]
        # Whatever the model sits out, it catches up on later; that is a cost of the other options as far as
        # the model is still in use (its share of recent rounds).
        growth = {name: 0.0 if name == "model" else
                  self._catch_up_s(pending + round(tokens)) - self._catch_up_s(pending)
                  for name, (tokens, _seconds) in priced.items()}
        surplus = {name: tokens - rho * (seconds + state.model_share * growth[name])
                   for name, (tokens, seconds) in priced.items()}
        best = max(surplus, key=lambda name: surplus[name])
        if best != "model":
            if best == "ngram":
                state.regret_s = 0.0  # the n-gram's stretch grows the backlog: price it afresh after it
            return best
        if state.regret_s == 0.0:  # the price, fixed when deferring starts; deferring saves it only if the
            # model stays out for good, which is as unlikely as the model is still in use
            state.backlog_s = (1.0 - state.model_share) * (self._catch_up_s(pending) - self._catch_up_s(2))
        runner_up = max((name for name in surplus if name != "model"), key=lambda name: surplus[name])
        # Deferring one more round loses the surplus against the model and grows the backlog by its tokens.
        regret_s = state.regret_s + (surplus["model"] - surplus[runner_up]) / rho \
            + (1.0 - state.model_share) * growth[runner_up]
        if regret_s >= state.backlog_s:
            state.regret_s = 0.0
            return "model"
        state.regret_s = regret_s
        return runner_up

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
        emitted = tokens[start:start + len(proposal)]
        matched = next((i for i, (d, x) in enumerate(zip(proposal, emitted)) if d != x), len(emitted))
        if emitted:
            self.state.lengths["ngram"].acceptance.update(min(matched + 1, len(emitted)), matched)

    def _catch_up_s(self, pending: int) -> float:
        """c_d(pending): the draft model's catch-up on `pending` tokens (0 while none has been measured), read
        between the sizes measured: a backlog is far larger than a draft step."""
        return self.costs.draft.interpolated(max(pending, 1)) or 0.0

    def update(self, drafted: int, accepted: int) -> None:
        if self.chosen is None:
            return
        name, seconds = self.chosen
        if name in self.state.lengths:
            self.state.lengths[name].update(drafted, accepted)
        self.state.record(name, accepted + 1, seconds)

    def rewind(self, n_keep: int) -> None:
        self.ngram.rewind(n_keep)
        self.model.rewind(n_keep)
