"""The planner: before each step, the way of drafting and K of every generating sequence, chosen together (`choose`,
by the batch's goodput), with the rules for what is not priced yet or is stale: a probe (K = 1) for a drafter idle
for long enough, a plain step where every step drafts and the pass over the sequences alone goes stale, and quiet
steps where choosing again would cost more than a step's small share. A lone generation is a schedule of one, so this
is the only place a round's way and K are chosen. Where a step is dear, a choice of no drafts that no drafter had a
way to draft for stands for some steps while each would still offer none (`_Watched`): choosing is held to
`PLAN_BUDGET` a sequence a step.

It reads what the scheduler measures: c(R), a verify pass's seconds by its rows (`pass_costs`), h, a step's host work
(`host`), and each mode's acceptance pooled over its sequences (`acceptance`).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spec_cli.decoding.batch_costs import BatchCosts
from spec_cli.decoding.costs import DECAY, LEFT_SHARE, PROBE_ROUNDS, STEADY_BACKLOG, LoopCosts, probe_rounds
from spec_cli.decoding.draft_length import AdaptiveK, PositionAcceptance
from spec_cli.decoding.drafter import Offer
from spec_cli.decoding.goodput import Candidate, choose
from spec_cli.decoding.planned import Planned, draft_cap, probes_after

if TYPE_CHECKING:
    from spec_cli.decoding.engine import Generation

PROBE_MAX = 1024  # the most rounds an idle sequence's drafter waits for its next probe
PLAN_SHARE = 0.01  # the most of a step's time that choosing K = 0 again and again may cost (`Planner._quiet_steps`)
QUIET_MAX = 128  # the most steps a choice of no drafts at all stands for
CHOICES_KEPT = 5  # the last choices' seconds the quiet rule reads the middle one of (`Planner._quiet_steps`)
HOST_KEPT = 8  # the last steps' host seconds, of each kind, whose middle h reads (`Planner.host_s`)
PLAN_BUDGET = 50e-6  # the seconds choosing may cost a sequence a step, on average (`Planner._watched_steps`)
WATCHED_MAX = 8  # the most steps a watched choice of no drafts stands for (`_Watched`)


@dataclass
class _Quiet:
    """A choice of no drafts standing for `left` more steps of the same sequences (`running`, with the Ks it gave
    them): a quiet step only counts down, and the idle rounds the streak adds to each sequence (`steps`) are counted
    when it ends. It ends before any drafter is due a probe: its length was cut to that when it was chosen (a probe
    left to the streak's end came after a 48-token answer had ended on a tiny model, whose streaks are long), and
    where the probe does not pay yet it goes on, up to the `budget` steps the choice may stand for, priced with the
    sequences' `candidates` as chosen (`Planner._probes_wait`)."""

    left: int
    running: list[Planned]
    ks: list[int | None]
    budget: int
    candidates: list[Candidate]
    steps: int = 0

    def goes_on(self, generating: list[Planned]) -> bool:
        """Count a quiet step down, if one is left for these same sequences, or some of them: one that finished does
        not end the streak (four answers of a batch, ending at four different steps, made a tiny model choose afresh at
        each, ~400 µs, 7% of the target alone's speed), one that joins does not either where its own first round,
        chosen, drafts nothing (`newcomers`, `Planner._joined`)."""
        if not self.left or not generating or not (self.same(generating) or self._narrowed(generating)):
            return False
        self.left, self.steps = self.left - 1, self.steps + 1
        return True

    def newcomers(self, generating: list[Planned]) -> list[Planned]:
        """The sequences of `generating` that joined the streak's, where all of the streak's are there, in order, and
        a step is left; none otherwise."""
        if not self.left or len(generating) <= len(self.running):
            return []
        mine = {id(running) for running in self.running}
        if [r for r in generating if id(r) in mine] != self.running:
            return []
        return [r for r in generating if id(r) not in mine]

    def joined(self, generating: list[Planned], ks: list[int | None], candidates: list[Candidate],
               newcomers: list[Planned]) -> None:
        """Go on for `generating`, the newcomers among them given no draft as the streak's sequences were (their `ks`
        and `candidates` in `generating`'s order): this step is a quiet one, and the streak ends by the newcomers'
        first probes too."""
        self.end()
        for running in generating:
            running.idle += running.adaptive
        self.running, self.ks, self.candidates = list(generating), ks, candidates
        self.left = min([self.left - 1, *probes_after(newcomers)])

    def same(self, generating: list[Planned]) -> bool:
        """Whether `generating` are the streak's sequences."""
        return generating == self.running

    def _narrowed(self, generating: list[Planned]) -> bool:
        """Keep the streak for `generating` if they are some of its sequences, in order (the others have left)."""
        kept = {id(running): i for i, running in enumerate(self.running)}
        if len(generating) >= len(self.running) or any(id(r) not in kept for r in generating):
            return False
        at = [kept[id(r)] for r in generating]
        self.running, self.ks, self.candidates = (list(generating), [self.ks[i] for i in at],
                                                  [self.candidates[i] for i in at])
        return True

    def end(self) -> None:
        """The sequences' drafters sat out the streak's steps: counted once (a streak that goes on counts from 0)."""
        for running in self.running:
            running.idle += running.adaptive * self.steps
        self.steps = 0


@dataclass
class _Watched:
    """A choice of no drafts standing for `left` more steps of the same sequences (`running`, with the Ks it gave
    them) while each drafter of several ways among them would still offer no way that drafts (`watched`:
    `Generation.still_idle`, the memory's lookup made each step, which is drafting); the step where one would chooses
    afresh. Where a step is dear, the quiet rule holds a choice for no step or one, and the lookup is what tells a copy
    beginning: a streak that did not look would draft nothing through the first rounds of one. Its length was cut to
    the first probe that may fall due."""

    left: int
    running: list[Planned]
    ks: list[int | None]
    watched: list[Planned]

    def goes_on(self, generating: list[Planned]) -> bool:
        """Count this step down where the choice still stands for `generating`."""
        if not self.left or generating != self.running or \
                not all(running.generation.still_idle(draft_cap(running.generation)) for running in self.watched):
            return False
        self.left -= 1
        for running in generating:
            running.idle += running.adaptive
        for running in self.watched:
            running.generation.stood()
        return True


class Planner:
    """Chooses each step's ways and Ks (`ks`) from what the scheduler measures, which it books here.

    `pass_costs`: c(R), a verify pass's seconds by its rows, measured on passes without prompt chunks;
    `host`: the seconds of the last steps outside their passes (the loop's own work), by whether they drafted;
    `acceptance`: by drafting mode, every sequence's rounds pooled: what a sequence whose own controller has
    seen no round yet is expected to keep (a slot's first request would otherwise explore on its own).
    A drafter's steps are priced from its own book (`Generation.draft_length.costs`), which knows its cost shape.
    """

    def __init__(self) -> None:
        self.pass_costs = BatchCosts(DECAY)  # c(R): the pair's, once a sequence brings its book (`meet`)
        self._met = False
        self.host: dict[bool, deque[float]] = {True: deque(maxlen=HOST_KEPT), False: deque(maxlen=HOST_KEPT)}
        self._host_s: float | None = None  # h as last read, until the next step is booked
        self.acceptance: dict[str, PositionAcceptance] = {}
        self._quiet: _Quiet | None = None  # a choice of no drafts that stands for some steps
        self._chosen_s: deque[float] = deque(maxlen=CHOICES_KEPT)  # the last steps' choosing, their offers included
        self._planned_s: deque[float] = deque(maxlen=CHOICES_KEPT)  # the same, less the proposals made to offer
        self._watched: _Watched | None = None  # a choice of no drafts standing while its drafters' offers stay so
        self._replan_s = 0.0  # the seconds of a step's choice, its drafters' offers included (decayed)
        self._drafting_steps = 0  # steps that would draft since the last that did not (`_plain_due`)

    def meet(self, passes: BatchCosts | None) -> None:
        """A sequence joins whose pair's running costs hold the target's passes by rows (`passes`, c_v(R), which a
        cost book seeds): from then on the planner's c(R), read and booked there, the one book every pricing of a pass
        reads (the default's regimes, `-k auto`, the cost book it is kept in). The planner kept a book of its own
        beside it, seeded from it: the same passes booked twice, the pair's by each sequence's K with the whole pass's
        seconds. Without the pair's prices the first steps of `spec serve` and `spec batch` (whose schedulers are
        made bare) chose no drafts, then at most one a sequence (a pass grows to twice the largest measured): a short
        answer's first rounds drafted one token of a lookup's while the default's draft model, its regime in use, fell
        54 tokens behind, which it then caught up on. What it booked before (sequences without such costs) joins."""
        if passes is None or self._met:
            return
        if self.pass_costs.weight:
            passes.merge(self.pass_costs)
        self.pass_costs, self._met = passes, True

    def passed(self, rows: int, seconds: float) -> None:
        """A verify pass over `rows` rows, without prompt chunks, took `seconds`: c(R), booked once whatever ran it
        (`LoopCosts.record_round`)."""
        self.pass_costs.record(rows, seconds)

    def stepped(self, drafted: bool, seconds: float) -> None:
        """A step that fed no prompt and caught no drafter up spent `seconds` outside its passes: h (`host_s`)."""
        self.host[drafted].append(seconds)
        self._host_s = None

    def settled(self, generation: Generation, drafted: int, accepted: int) -> None:
        """A round of `generation` kept `accepted` of its `drafted` tokens: they join its mode's pooled acceptance."""
        if drafted:
            pooled = self.acceptance.setdefault(generation.stats.draft_mode, PositionAcceptance(DECAY))
            pooled.update(drafted, accepted)

    def ks(self, generating: list[Planned], chunk: int, shared: bool) -> list[int | None]:
        """`_ks`, its seconds shared among the sequences' planning figures (`Stats.plan_s`), less what their drafters
        spent choosing their ways, which each drafter counts itself, and their proposals made to offer them (drafting
        time, `Generation.offer`). Where no K is the planner's there is nothing to choose; a quiet step (`_Quiet`) asks
        no drafter and only counts down: on a tiny model, whose step costs ~150 µs, asking whether a probe was due and
        counting idle rounds every quiet step cost 3% of the target alone's speed. A watched step (`_Watched`) asks
        each drafter of several ways whether it would still offer nothing to draft, and chooses afresh where one
        would."""
        started = time.perf_counter()
        newcomers: list[Planned] = []
        quiet = self._quiet
        if quiet is not None:
            if quiet.goes_on(generating) or self._probes_wait(quiet, generating):
                share = (time.perf_counter() - started) / len(generating)
                for running in generating:
                    running.generation.stats.plan_s += share
                return quiet.ks
            newcomers = quiet.newcomers(generating)
            if not newcomers:  # the streak ends
                quiet.end()
                self._quiet = quiet = None
        if not any(r.adaptive for r in generating):
            return [None] * len(generating)
        drafting = [r.generation.drafter for r in generating if r.generation.drafter is not None]

        def choosing() -> float:
            return sum(drafter.plan_s for drafter in drafting)

        def proposing() -> float:
            return sum(r.generation.stats.draft_s for r in generating)

        chose, proposed = choosing(), proposing()
        joined = self._joined(quiet, newcomers, generating, chunk, shared) if quiet is not None else None
        watched, self._watched = self._watched, None
        afresh = joined is None and (watched is None or not watched.goes_on(generating))
        if joined is not None:
            ks = joined
        elif afresh:
            ks = self._ks(generating, chunk, shared)
        else:
            self._watched, ks = watched, watched.ks
        seconds, proposed = time.perf_counter() - started, proposing() - proposed
        if afresh:
            self._chosen_s.append(seconds)
            self._planned_s.append(seconds - proposed)
            self._replan_s = seconds if not self._replan_s else 0.8 * self._replan_s + 0.2 * seconds
        share = (seconds - proposed - (choosing() - chose)) / len(generating)
        for running in generating:
            running.generation.stats.plan_s += share
        return ks

    def _joined(self, quiet: _Quiet, newcomers: list[Planned], generating: list[Planned], chunk: int,
                shared: bool) -> list[int | None] | None:
        """The Ks of a step where `newcomers` join `quiet` (`_Quiet.newcomers`): each newcomer's first round
        is chosen, the others priced with the candidates the streak was chosen with. Where that drafts nothing the
        streak goes on with the newcomers in it; else (None) every sequence is chosen afresh, its newcomers' offers
        made again at the same place (a drafter keeps its offer there). Every answer of a batch that begins
        otherwise asked every drafter for its offers: ~280 µs a new answer at four sequences on a tiny model, ~1% of
        its steps' time."""
        fresh = {id(running): self._candidate(running, chunk, shared) for running in newcomers}
        kept = {id(running): candidate for running, candidate in zip(quiet.running, quiet.candidates)}
        candidates = [fresh[id(running)] if id(running) in fresh else kept[id(running)] for running in generating]
        choices = self._by_goodput(candidates, self._quiet_steps(len(generating)))
        if any(k for (k, _way), running in zip(choices, generating) if running.adaptive):
            quiet.end()
            self._quiet = None
            return None
        ks: list[int | None] = [0 if running.adaptive else None for running in generating]
        quiet.joined(generating, ks, candidates, newcomers)
        self._drafting_steps = 0
        return ks

    def _by_goodput(self, candidates: list[Candidate], quiet: int) -> list[tuple[int, int]]:
        """(K, way) for each candidate by the pass's goodput (`goodput.choose`), a step that drafts at all paying the
        choice the next step then makes, where `quiet` steps would otherwise follow without choosing."""
        return choose(candidates, self.pass_costs, self.host_s, self._replan_s * quiet / (quiet + 1))

    def _ks(self, generating: list[Planned], chunk: int, shared: bool) -> list[int | None]:
        """K for each generating sequence: a fixed K as its request asked (None: its own), and for `-k auto` the
        batch's choice by goodput, with a probe (K = 1) for a drafter idle for long enough. A choice of no drafts at
        all stands for some steps of the same sequences (`_quiet_steps`)."""
        # Made once a step: a drafter's offer decides its way.
        candidates = [self._candidate(r, chunk, shared) for r in generating]
        quiet = self._quiet_steps(len(generating))  # what drafting forgoes: the choice not made on quiet steps
        choices = self._by_goodput(candidates, quiet)
        for running, (k, way) in zip(generating, choices):
            if k and running.offers:  # its way (its drafter's preferred one, or another that pays best in this pass)
                running.generation.take(running.offers[way], k)
        ks = [k if running.adaptive else None for (k, _way), running in zip(choices, generating)]
        if not any(ks):
            self._drafting_steps = 0
        elif self._plain_due(generating):
            ks = [0 if running.adaptive else None for running in generating]
        for i, (running, candidate) in enumerate(zip(generating, candidates)):
            if not running.adaptive:
                continue
            running.probing = ks[i] == 0 and running.probe_may_be_due and \
                self._probe_due(running, candidate, len(generating))
            if running.probing:
                ks[i] = 1
            elif ks[i]:
                running.probe_after = PROBE_ROUNDS
            if ks[i]:
                running.idle = running.priced_after = 0
            else:
                running.idle += 1
        watching = 0 if any(ks) or not all(r.moot and len(r.offers) == 1 for r in generating if r.offers) else \
            self._watched_steps(len(generating))
        if watching > quiet:  # a dear step: a streak that looks each step outlasts one that does not
            left = min([watching, *probes_after(generating)])
            watched = [running for running in generating if running.offers]
            self._watched = _Watched(left, list(generating), list(ks), watched) if left > 0 else None
            return ks
        left = min([quiet, *probes_after(generating)]) if quiet and not any(ks) else 0
        self._quiet = _Quiet(left, list(generating), list(ks), quiet, candidates) if left > 0 else None
        return ks

    def _probes_wait(self, quiet: _Quiet, generating: list[Planned]) -> bool:
        """At the end of a quiet streak cut short for a probe that may be due (`Planned.probe_may_be_due`): whether
        none is, priced with the candidates the streak was chosen with; if so the streak goes on (this step a quiet
        one), up to its budget or the next probe. Choosing afresh at each such end asked every drafter for its offers
        (~200 µs on a tiny model drafting for itself, every `PROBE_ROUNDS` steps, whose probe never paid)."""
        if quiet.steps >= quiet.budget or not quiet.same(generating):
            return False
        spent = quiet.steps
        quiet.end()  # the idle rounds so far
        for running, candidate in zip(quiet.running, quiet.candidates):
            if running.probe_may_be_due and self._probe_due(running, candidate, len(generating)):
                return False
        quiet.budget -= spent
        left = min([quiet.budget, *probes_after(generating)])
        if left <= 0:
            return False
        quiet.left, quiet.steps = left - 1, 1  # this step is a quiet one
        return True

    def _plain_due(self, generating: list[Planned]) -> bool:
        """Whether this step, which would draft, should not: the planner's own probe. Where every step drafts, the
        pass over the sequences alone is never measured again, and its price, left from cold first steps, kept the
        choice drafting (a tiny model drafting for itself at two sequences priced that pass at three times what it
        took). Due when that price is stale, after at least `PROBE_ROUNDS` steps that drafted since the last that did
        not, or at once while it rests on its first call, which was cold (`BatchCosts.first_only`: a tiny model's
        first 4-row pass cost 4× the next, was the floor of every larger pass, and its twin drafted 16 tokens for each
        of four sequences through a batch at 0.6× the target alone's speed); only where the planner chooses every
        sequence's K. Due as well while a plain step's host work rests on fewer than `HOST_KEPT` / 2 steps, a drafting
        one's is measured, and h read so outweighs the plain pass: a process's first steps are cold, and where every
        step after them drafts, h stands on them (the twin at two sequences: two plain steps of 1.2 ms outside their
        passes where later ones take ~0.1 and the pass ~0.2, then 16 drafts for each sequence every step of its first
        batch, at 0.54x the target alone). Where a pass outweighs h (a model of some size) h moves the choice little, and
        a lone answer's first rounds draft."""
        self._drafting_steps += 1
        if not all(r.adaptive for r in generating):
            return False
        plain = len(generating)
        host_cold = bool(self.host[True]) and len(self.host[False]) < HOST_KEPT // 2 and \
            self.host_s > (self.pass_costs.seconds(plain) or float("inf"))
        if not host_cold and not self.pass_costs.first_only(plain) and \
                (self._drafting_steps < PROBE_ROUNDS or self.pass_costs.fresh(plain)):
            return False
        self._drafting_steps = 0
        return True

    def _quiet_steps(self, sequences: int) -> int:
        """How many steps after this one a choice of no drafts at all stands for: as many as keep choosing again within
        `PLAN_SHARE` of the steps' time. Where a step is dear (a model of some size) that is none, and each step chooses
        afresh; on a tiny model, whose step costs about what choosing does, the choice stands for tens of steps (the
        planner's Python between passes cost it a third of the target alone's speed).

        Choosing costs what the last steps that chose took, their drafters' offers (a lookup's proposal) included:
        without them the memory's lookups on a tiny model cost 3% of its speed, twice the share. The middle of the last
        `CHOICES_KEPT`, once most of them are known: a cold drafter's first trial, made in one step, would stand for
        tens of quiet steps (the default then never drafted a 40-token answer on a cross-vocabulary pair)."""
        if len(self._chosen_s) <= CHOICES_KEPT // 2:
            return 0
        step_s = (self.pass_costs.prices(sequences)[sequences] if self.pass_costs.weight else 0.0) + self.host_s
        if not step_s:
            return 0
        choosing_s = sorted(self._chosen_s)[len(self._chosen_s) // 2]
        return min(QUIET_MAX, int(choosing_s / (PLAN_SHARE * step_s)))

    def _watched_steps(self, sequences: int) -> int:
        """How many steps after this one a watched choice of no drafts stands for (`_Watched`): as many as hold
        choosing, the proposals made to offer left out (they are drafting), to `PLAN_BUDGET` a sequence a step, up to
        `WATCHED_MAX`. On the demo pair a choice after a 20 ms decode costs ~300 µs, most of it Python run with the
        caches cold (the same work repeated at once: a quarter of that), spread thin over pricing every way. The middle
        of the last `CHOICES_KEPT` choices, once most are known (`_quiet_steps`)."""
        if len(self._planned_s) <= CHOICES_KEPT // 2:
            return 0
        planning_s = sorted(self._planned_s)[len(self._planned_s) // 2]
        return min(WATCHED_MAX, int(planning_s / (PLAN_BUDGET * sequences)))

    def _probe_due(self, running: Planned, candidate: Candidate, sequences: int) -> bool:
        """Whether an idle drafter that has sat out enough rounds should draft one token now: the probe (its
        catch-up, a step, a row) pays against its share of the passes it sat out (the cost model's rule,
        `probe_rounds`). Where it does not yet, the idle rounds it needs are kept (`priced_after`), priced with the
        catch-up it will owe by then (a token more for each round it sits out): pricing a probe asks a drafter of
        several ways for its offers, a lookup each, which every idle step of a tiny model paid (a third of the rounds'
        host work)."""
        pass_s = self.pass_costs.seconds(sequences)
        if pass_s is None:
            return True
        row_s = max(0.0, (self.pass_costs.seconds(sequences + 1) or pass_s) - pass_s)

        def rounds(later: int) -> int:
            """The idle rounds a probe needs, priced `later` rounds from now."""
            length = running.generation.draft_length
            drafting_s = candidate.drafting_s(1)
            if isinstance(length, AdaptiveK):  # a probe pays the drafter's whole catch-up on the rounds it sat out
                costs = length.costs.step_costs(running.generation.drafter_backlog() + later)
                drafting_s = sum(costs) if costs is not None else drafting_s
            return probe_rounds(drafting_s + row_s, pass_s / sequences)

        needed = rounds(0)
        running.priced_after = max(needed, rounds(needed - running.idle)) if needed > running.idle else needed
        return running.idle >= needed

    def _candidate(self, running: Planned, chunk: int, shared: bool) -> Candidate:
        """What the goodput choice needs of a sequence: its acceptance by position, and what its drafter's steps and
        a round of them cost (`LoopCosts.step_costs`: its cost shape, its catch-up on what it has not seen), as
        measured (unmeasured: free, so that it gets tried)."""
        generation = running.generation
        length, mode = generation.draft_length, generation.stats.draft_mode
        cap = draft_cap(generation)
        if not running.adaptive:
            return Candidate((), fixed=min(length.next_k(), cap) if generation.drafter else 0)
        if not isinstance(length, AdaptiveK):  # a drafter of several ways: each way it offers, priced as it drafts
            offers = generation.offer(cap, chunk, shared)
            running.offers = [offer.way for offer in offers]
            running.moot = not offers or not offers[0].cap
            if not offers:
                return Candidate((), fixed=0)
            first, *others = [self._way(offer, cap) for offer in offers]
            return Candidate(first.gains, step_s=first.step_s, round_s=first.round_s, others=tuple(others))
        pooled = self.acceptance.get(mode)
        if not length.priced and (pooled is None or pooled.measured < length.warmup_rounds):
            return Candidate((), fixed=min(length.next_k(), cap))  # not priced yet: tried at its warm-up K
        # Its steady round, and what it lacks beyond a round's catch-up (a prompt, rounds it sat out): the way's entry,
        # which no one pass can weigh (a pass priced with it never drafts, and the backlog only grows).
        backlog = generation.drafter_backlog()
        step_s, round_s = length.costs.step_costs(min(backlog, STEADY_BACKLOG)) or (0.0, 0.0)
        acceptance = length.acceptance if length.rounds else pooled or length.acceptance
        return Candidate(acceptance.gains(cap), step_s=step_s, round_s=round_s,
                         token_s=self._entry_s(length.costs, backlog, round_s, generation.room()))

    @staticmethod
    def _entry_s(costs: LoopCosts, backlog: int, round_s: float, left: int) -> float:
        """A drafter's entry, its catch-up beyond a steady round's (`round_s`), a token of the `LEFT_SHARE` of the
        `left` tokens the answer may still emit that it is to pay back over (`Candidate.token_s`). Priced at its
        steady round alone, the draft model pinned under `-k auto` beside another request drafted a few rounds of
        64-token answers, each after taking in ~100 tokens of prompt at ~3 ms a token: 0.77x the target alone."""
        whole = costs.step_costs(backlog) if backlog > STEADY_BACKLOG else None
        return max(0.0, whole[1] - round_s) / max(1.0, LEFT_SHARE * left) if whole is not None else 0.0

    @staticmethod
    def _way(offer: Offer, cap: int) -> Candidate:
        """A way a drafter offers, as the goodput choice prices it: its acceptance, its steps, what a round costs
        once (what it leaves its drafter's other ways to pay included)."""
        step_s, round_s = offer.costs.step_costs(offer.backlog) or (0.0, 0.0)
        return Candidate(offer.acceptance.gains(min(cap, offer.cap)), step_s=step_s, round_s=round_s + offer.owed_s)

    @property
    def host_s(self) -> float:
        """h: a step's seconds outside its passes (every sequence's host work), measured on steps that fed no prompt
        and caught no drafter up (their decodes are not the loop's work): the work a step costs whatever K. The lesser
        of the middle (the lower middle) of the last `HOST_KEPT` steps' of each kind. Drafting steps' host work grows
        with the drafting priced (a tiny model's cost ~1 ms, its plain ones ~0.1), and a dearer step makes drafting
        look worth more; a mean kept the first steps, cold (1.2 and 0.5 ms where later ones took 0.07), for as long as
        nearly every step drafted: the twin of a tiny model drafted 16 tokens for each of four sequences through its
        first batch, at 0.6x the target alone's speed. The least of them instead read a busy machine's luckiest step,
        not what its steps cost: the default drafted with the model in 4% of its rounds on code where it had in 35%."""
        if self._host_s is None:
            middles = [sorted(seconds)[(len(seconds) - 1) // 2] for seconds in self.host.values() if seconds]
            self._host_s = min(middles, default=0.0)
        return self._host_s

    @staticmethod
    def drafted(running: Planned) -> None:
        """A sequence drafted (its decodes were booked, as their share of the passes, by its round): a probe that the
        batch would not have chosen waits twice as long for the next. One that proposed nothing (a lookup where the
        text had no match) measured nothing and cost nothing: the next waits as long as this one did (doubled, a
        lookup pinned under `-k auto` whose first proposals were unlucky was probed every 1024 rounds after five
        probes at places without a match, and so learnt nothing more in a whole process)."""
        if running.probing:
            if running.generation.last_draft.tokens:
                running.probe_after = min(PROBE_MAX, running.probe_after * 2)
            running.probing = False
