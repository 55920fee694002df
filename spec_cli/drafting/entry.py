"""When the default drafting enters an own drafter's regime: leaving one is free, but entering means paying the
drafter's backlog (its catch-up on every token it sat out) first.

Three rules, each for what the others cannot see:
- ski rental: out of the regime with the best rate, the seconds each round loses by staying add up (the regret); the
  better regime is entered once they reach its backlog's price, fixed when the wait began (never more than twice
  the best choice in hindsight);
- pay-back: where the tokens this answer still emits are known well enough (`ahead`), a regime clearly better is
  entered at once when the seconds it saves a token over them pay its price, once a new text's rates are its own and
  in a round the lookup proposes nothing;
- a trial on a new text: an own drafter whose acceptance over the last texts says it may pay on this one, though its
  mean does not, drafts a few rounds here (the value of the information), as acceptance differs most from text to
  text.

Leaving a regime is free only where its drafter no longer pays a round of its own: where it still does, the loop comes
back to it and pays its catch-up on every token emitted meanwhile, so the regime is left only where the way out saves
more a token than that catch-up costs a token (`_leaving_pays`); a burst of lookups does not leave it.

Beside other sequences a drafter's catch-up holds them all up, so the entry is the batch's (`entering`), and a regime
whose drafter a batch left behind is left (`leave_unpaid`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spec_cli.decoding.costs import LEFT_SHARE, STEADY_BACKLOG, LoopCosts
from spec_cli.decoding.drafter import Terms

if TYPE_CHECKING:
    from spec_cli.drafting.hybrid import Option
    from spec_cli.drafting.hybrid_state import HybridState

OUT = "out"  # the regime in which none of the pair's own drafters is in use
TRIAL_TEXTS = 2  # the texts an own drafter must have drafted in before a new one weighs a trial of it
TRIAL_ROUNDS = 2  # the rounds a trial chooses its drafter before its regime may be left
SETTLE_ROUNDS = 2  # the rounds a new text runs before the regimes' rates are read as its own: a trial is weighed, and
# a regime entered at once for its pay-back, only after them (at its first round they are the last text's), and in a
# round the lookup proposes nothing (`RegimeEntry.trial`)
TRIAL_PRIOR = 2.0  # rounds' worth of the acceptance over every text that a trial's text keeps as its prior


class RegimeEntry:
    """The regime a hybrid drafter runs in (`HybridState.in_use`), moved by the rules above; `terms`: what the planner
    last asked for (the tokens the request leaves), which `ahead` reads."""

    def __init__(self, state: HybridState, books: dict[str, LoopCosts]) -> None:
        self.state = state
        self.books = books
        self.terms: Terms | None = None
        self._weighed = False  # whether this text has weighed a trial of an own drafter
        self._rounds = 0  # the rounds this text has chosen in (`SETTLE_ROUNDS`)
        self._trying: str | None = None  # the own drafter on trial on this text
        self._tried = 0  # the rounds the trial has chosen its drafter in
        self._proposing = False  # whether the lookup proposes this round
        self.entering: str | None = None  # the own drafter whose regime the last weighing left a batch to enter

    def new_text(self) -> None:
        self._weighed, self._trying, self._rounds, self._tried = False, None, 0, 0
        self.terms = None  # a new text's first offer says whether others share its passes

    @property
    def shared(self) -> bool:
        """Whether this text's last offer was made for a pass other sequences shared."""
        return self.terms is not None and self.terms.shared

    def trial(self, options: dict[str, Option], pending: dict[str, int], ks: dict[str, int],
              out_rate: float, rounds: int = 1) -> str | None:
        """The own drafter on trial this round, if any: weighed once a text, out of every own drafter's regime, after
        `SETTLE_ROUNDS` rounds (the rate out is then this text's: weighed at its first round, against the last text's
        rate, a rewrite the memory copies at twice the target alone's speed paid a 68-token catch-up for two rounds),
        whichever regime's rate is the best (a draft model whose mean acceptance, learnt on rewrites, put its regime a
        little above the target alone's did not pay its entry on a code prompt, where it keeps nearly every draft); it
        is chosen `TRIAL_ROUNDS` rounds before its regime may be left, whatever the planner makes of them: counted by
        the drafts they kept, a trial whose first round kept none of 8 (a chat answer's first token), after which the
        planner gave the draft model K = 0, or whose next rounds the planner gave the memory (a rewrite), never ended
        and held the loop in the model's regime (a chat answer ran 110 plain rounds while the model fell 60 tokens
        behind). Its acceptance keeps `TRIAL_PRIOR` rounds of the mean over texts, so this text decides. Asked once
        each round the hybrid chooses: it counts the text's rounds, and notes whether the lookup proposes in this one,
        which the pay-back reads too.

        Neither a trial nor a pay-back is weighed in a round the lookup proposes: the rate out of every regime is
        then moving on prices of the lookup's first proposals on this text, before their acceptance here is known. A
        rewrite whose first proposals were priced as chance matches put the rate out at the target alone's, and the
        draft model's regime was entered for its pay-back at round 3 (a 70-token catch-up and a round that kept none
        of 12: 0.35 s of a 1.7 s answer), two rounds before the memory's copies ran at twice the model's rate.
        `rounds`: the text's rounds since it was last asked (those a choice of no draft stood for, `settled`), this
        one's included."""
        state = self.state
        self._rounds += rounds
        self._proposing = state.lookup in options
        if state.in_use == OUT and not self._weighed:
            self._weighed = self._rounds > SETTLE_ROUNDS and not self._proposing
            self._trying = self._worth_a_trial(options, pending, ks, out_rate) if self._weighed else None
            if self._trying is not None:
                state.in_use, state.regret_s = self._trying, 0.0
                state.lengths[self._trying].acceptance.cap(TRIAL_PRIOR)
        if self._trying == state.in_use and self._trying in options and self._tried < TRIAL_ROUNDS:
            state.regret_s, self._tried = 0.0, self._tried + 1
            return self._trying
        return None

    @property
    def settled(self) -> bool:
        """Whether this text is past the rounds weighed one by one, so that a choice of no draft may stand for several:
        its first `SETTLE_ROUNDS` (a trial is weighed at the first after them), and a trial's."""
        return self._rounds > SETTLE_ROUNDS and (self._trying is None or self._tried >= TRIAL_ROUNDS)

    def weigh(self, best: str, rates: dict[str, float], tokens: float, pending: dict[str, int],
              rounds: int = 1, comes_back: bool = False) -> None:
        """Move to regime `best` where the ski-rental wait or the pay-back says so; `tokens`: what this round's choice
        in the regime in use emits, which staying prices at the difference of the two rates, for each of `rounds`
        rounds since the last weighing; `comes_back`: whether the drafter of the regime in use still pays a round of its
        own (its option yields more than a plain step), so that leaving its regime means coming back to it
        (`_leaving_pays`). Where other sequences share the pass and `best`'s drafter lacks more than a
        steady round, its catch-up holds them all up: the move is the batch's, weighed each round with the whole
        catch-up, which enters by taking that drafter (`entering`, offered beside this round's choice), and no regret
        runs up meanwhile (the batch, not this text, chose to wait). Entered here, the regime stayed while the batch gave
        its drafter no K, and the lookup's proposals were charged a catch-up nobody paid; a regret run up so entered the
        regime at once when the others ended, its catch-up (0.3 to 0.6 s on the demo pair) for an answer's last rounds."""
        state = self.state
        self.entering = None
        if best == state.in_use or rates[best] <= rates[state.in_use] or \
                (best == OUT and comes_back and not self._leaving_pays(state.in_use)):
            state.regret_s = 0.0
            return
        if best != OUT and self.shared and pending[best] > STEADY_BACKLOG:
            self.entering, state.regret_s = best, 0.0
            return
        if state.regret_s == 0.0:
            state.price_s = 0.0 if best == OUT else self.backlog_price(best, pending[best])
        state.regret_s += rounds * (tokens / rates[state.in_use] - tokens / rates[best])  # every regime has a round now
        if state.regret_s >= state.price_s or self._pays_back(rates[state.in_use], rates[best]):
            state.in_use, state.regret_s = best, 0.0

    def _leaving_pays(self, name: str) -> bool:
        """Whether leaving own drafter `name`'s regime for the way out of every regime, to come back to it, saves more
        a token than its catch-up then costs a token: the seconds a token the way out saves against `backlog_price` of
        the tokens this answer still emits (`ahead`), a token. The saving is read off the regimes' lasting rates
        (`HybridState.lasting`, ~20 rounds), as it is to hold over the answer ahead: a regime's rate follows ~5 rounds,
        and the way out's rounds are short. On chat, one or two of the memory's proposals (a phrase the answer repeats)
        lifted that rate above the draft model's, the regime was left, and came back to 10 to 60 tokens later at their
        catch-up, 30 to 146 plain rounds of a 134-token answer where the model pinned ran 1.1 to 1.2x the target alone
        (Intel Xeon, demo pair); weighed on the short rates with this rule, two proposals in a row (4 and 6 tokens for
        ~35 ms each) still read the way out at 99.8 tok/s against the model's 73.2, and the answer ran its last 50 rounds
        plain (AMD EPYC). Over a rewrite the memory copies at twice the model's rate round after round, and saves more
        a token than the catch-up costs. Not in a new text's first `SETTLE_ROUNDS` rounds, where the rates, the lasting
        ones too, are mostly the last text's, as the pay-back is not weighed then: a story begun in the model's regime
        left it on one proposal of the memory at its second round (6 tokens for 36 ms), and ran 11 plain rounds of its
        64 tokens before the regime was entered again. Unknown `ahead`: free, as before any rule."""
        if self._rounds <= SETTLE_ROUNDS:
            return False
        ahead = self.ahead()
        rate, out_rate = (self.state.lasting[regime].rate or 0.0 for regime in (name, OUT))
        if ahead is None or ahead < 1.0 or rate <= 0.0:
            return True
        saved = 1.0 / rate - 1.0 / out_rate if out_rate > 0.0 else 0.0
        return saved > 0.0 and saved >= self.backlog_price(name, STEADY_BACKLOG + round(ahead)) / ahead

    def leave_unpaid(self, name: str, lacking: int) -> None:
        """Leave own drafter `name`'s regime, where it is in use, if it lacks more than a steady round's catch-up that a
        batch left unpaid: the batch gave it no K though it was the round's choice (a batch weighs all it lacks
        against one pass, and seldom pays), or the other sequences ended. Its entry is weighed again, against what
        this answer still emits. Kept, the regime charged the lookup's proposals a catch-up nobody paid (the first four
        of forty extraction prompts at `--parallel 4` passed over every one, 1 to 3 tokens at 6 to 12 ms each), and the
        last sequence of four, alone, was offered the draft model at a steady round's price and took it for its last 2
        to 5 rounds, its catch-up on the whole answer (~100 tokens, 0.4 to 0.65 s on the demo pair) with them."""
        if self.state.in_use == name and lacking > STEADY_BACKLOG:
            self.state.in_use, self.state.regret_s = OUT, 0.0

    def backlog_price(self, name: str, pending: int) -> float:
        """What entering `name`'s regime costs beyond a steady-state round: its catch-up on `pending` tokens
        instead of on the two a fully accepted round leaves."""
        return max(0.0, self.catch_up_s(name, pending) - self.catch_up_s(name, 2))

    def catch_up_s(self, name: str, pending: int) -> float:
        """c_d(pending) of own drafter `name` (0 while none has been measured), read between the sizes
        measured: a backlog is far larger than a draft step."""
        return self.books[name].draft.interpolated(max(pending, 1)) or 0.0

    def ahead(self) -> float | None:
        """E[the tokens this answer still emits], within what the request leaves (`Terms.left`): what the last answers
        longer than this one so far (`HybridState.answers`) had left at this point. One cut short (at its limit, a stop
        string) says only that it went at least so far, which counts where that is as far as this one may go (a
        benchmark's answers, all cut at their limit, were priced at half of what each had left, and a draft model whose
        entry paid back over the whole answer was not entered). Before any, `LEFT_SHARE` of what the request leaves: a
        request's limit says little (rewrites asked for 512 tokens ended after 76-136: the draft model's regime, entered
        for the 445 tokens the limit left, paid a 131-token catch-up, 0.45 s, for two rounds). None where the planner has
        not said."""
        if self.terms is None:
            return None
        left, emitted = self.terms.left, self.terms.emitted
        longer = [min(left, n - emitted) for n, ended in self.state.answers
                  if n > emitted and (ended or n >= emitted + left)]
        return sum(longer) / len(longer) if longer else LEFT_SHARE * left

    def _pays_back(self, rate: float, better: float) -> bool:
        """Whether the seconds a regime of rate `better` saves a token over the one of `rate`, over the tokens this
        answer is expected to emit still (`ahead`), pay its entry price. Where that is known, a regime clearly better
        is entered at once rather than after the ski-rental wait (a chat answer of 160 tokens waited ~35 rounds for a
        draft model 1.4x the target alone); unknown, the wait alone. Not in a new text's first `SETTLE_ROUNDS` rounds:
        the rates are the last text's (a rewrite after a story entered the draft model's regime at its first round, a
        68-token catch-up of 250 ms for one round, where the memory then drafted at twice the model's rate); nor in a
        round the lookup proposes (`trial`)."""
        ahead = self.ahead()
        return self._rounds > SETTLE_ROUNDS and not self._proposing and ahead is not None and \
            (1.0 / rate - 1.0 / better) * ahead >= self.state.price_s

    def _worth_a_trial(self, options: dict[str, Option], pending: dict[str, int], ks: dict[str, int],
                       out_rate: float) -> str | None:
        """The own drafter worth a trial on this new text though its regime, priced at the acceptance over every text,
        is not the best; None where none is. Its acceptance differs from text to text (the demo pair's draft model keeps
        0.97 of its drafts on code and 0.78 on a rewrite), and the mean priced it below the target alone on code, where
        it was then never drafted, after a rewrite. A trial shows within a round or two which this text is, and leaving
        is free: it is worth its entry price (its catch-up) where E over the last texts' acceptance (`Pool.texts`) of
        max(0, the seconds a token it saves at its best K against the rate out of its regime) × the tokens this answer
        is expected to emit (`ahead`) pays it."""
        ahead = self.ahead()
        if ahead is None or out_rate <= 0.0:
            return None
        best: tuple[float, str] | None = None
        for name, k in ks.items():
            pool = self.state.lengths[name].acceptance.pooled
            if not k or name not in options or pool is None or len(pool.texts) < TRIAL_TEXTS:
                continue
            saved, book, most = 0.0, self.books[name], self.state.lengths[name].k_max
            for text in pool.texts:  # each at its best K: the K the planner gave it lately was for the texts it had
                rate = book.peak_rate(text, min(k, most), most)
                if rate:
                    saved += max(0.0, 1.0 / out_rate - 1.0 / rate)
            gain = saved / len(pool.texts) * ahead - self.backlog_price(name, pending[name])
            if gain > 0.0 and (best is None or gain > best[0]):
                best = (gain, name)
        return best[1] if best is not None else None
