"""Several generations at once, or one alone (a schedule of one): one verify pass a step for every active sequence
(continuous batching).

Each generation runs on its own sequence of one target context (`Pair.slots`). A step asks each generating
sequence for its round (`Generation.plan`: its drafts, with K chosen for the batch's goodput, `goodput`; a
draft model's steps for all sequences decoded together, one pass of the draft context a step), feeds all of
them to the target in one pass (`decode_together`: ragged, each sequence its own K + 1 rows, no padding),
and hands each its rows (`Generation.settle`: it accepts, rewinds its own memory
and emits). A newcomer's prompt rides along in chunks of `PREFILL_CHUNK` tokens so that the others wait
little for it; a generation that finished or was stopped leaves at once, and its sequence is free. A
generation whose own work fails (drafting, planning or settling its round: its grammar, its drafter) leaves
alone with the error (`Generation.error`); the others go on untouched. Only a failed pass fails them all.

Each sequence's output is what it would be alone: its drafts, acceptance and corrections read only its own
rows, laws and random generator, and every row of a pass is computed as it would be in a pass of its own
(on the CPU, F16/F32 weights; quantized kernels may round a near-tie differently at another batch shape).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, TypeVar

import numpy as np

from spec_cli.decoding.costs import DECAY, PROBE_ROUNDS, STEADY_BACKLOG, BatchCosts, probe_rounds
from spec_cli.decoding.draft_length import AdaptiveK, PositionAcceptance
from spec_cli.decoding.drafter import Draft, DraftSteps, Offer
from spec_cli.decoding.goodput import Candidate, choose
from spec_cli.llama.context import Context, Part, decode_together
from spec_cli.llama.vision import has_images, whole_images

if TYPE_CHECKING:  # the engine runs a generation alone as a schedule of one: it imports this module
    from spec_cli.decoding.engine import Generation, TokenEvent

PREFILL_CHUNK = 64  # prompt tokens a newcomer feeds a step while others generate (alone: a whole batch), and the
# most a drafter catches up on in a step (`Generation.begin_round`): a long catch-up never holds the others up
ALONE_CHUNK = 512  # the most a drafter catches up on in a step where its sequence runs alone: nobody waits on it
PROBE_MAX = 1024  # the most rounds an idle sequence's drafter waits for its next probe
PLAN_SHARE = 0.01  # the most of a step's time that choosing K = 0 again and again may cost (`Scheduler._quiet_steps`)
QUIET_MAX = 128  # the most steps a choice of no drafts at all stands for
CHOICES_KEPT = 5  # the last choices' seconds the quiet rule reads the middle one of (`Scheduler._quiet_steps`)
HOST_KEPT = 8  # the last steps' host seconds, of each kind, whose middle h reads (`Scheduler.host_s`)
T = TypeVar("T")
MAX_SEQUENCES = 64  # the most sequences at once we offer (llama.cpp takes up to 256 in one context)


@dataclass
class _Running:
    """A generation under the scheduler: the prompt tokens the target still lacks, and how long its drafter has
    been idle (K = 0) and may stay so before the next probe (`probe_after`, and `priced_after`: the idle rounds its
    probe's price needs, as last read, so that an idle step does not price it again)."""

    generation: Generation
    prompt: list[int]
    fed: int = 0
    lacked: int = 0  # the prompt tokens the target lacked when it joined
    idle: int = 0
    probe_after: int = PROBE_ROUNDS
    priced_after: int = 0
    probing: bool = False
    offers: list[str] = field(default_factory=list)  # the ways its drafter offered this step, its preferred first
    adaptive: bool = field(init=False)  # whether the planner chooses its K (`_chooses_k`), for its whole life

    def __post_init__(self) -> None:
        self.adaptive = _chooses_k(self.generation)

    @property
    def probe_may_be_due(self) -> bool:
        """Whether its drafter has sat out the rounds a probe waits for, and those its price needed when last read."""
        return self.adaptive and self.idle >= max(self.probe_after, self.priced_after)


@dataclass
class _Quiet:
    """A choice of no drafts standing for `left` more steps of the same sequences (`running`, with the Ks it gave
    them): a quiet step only counts down, and the idle rounds the streak adds to each sequence (`steps`) are counted
    when it ends. It ends before any drafter is due a probe: its length was cut to that when it was chosen (a probe
    left to the streak's end came after a 48-token answer had ended on a tiny model, whose streaks are long)."""

    left: int
    running: list[_Running]
    ks: list[int | None]
    steps: int = 0

    def goes_on(self, generating: list[_Running]) -> bool:
        """Count a quiet step down, if one is left for these same sequences."""
        if not self.left or len(generating) != len(self.running) or \
                any(a is not b for a, b in zip(generating, self.running)):
            return False
        self.left, self.steps = self.left - 1, self.steps + 1
        return True

    def end(self) -> None:
        """The sequences' drafters sat out the streak's steps."""
        for running in self.running:
            running.idle += running.adaptive * self.steps


class Scheduler:
    """Runs the generations that `join` it, one step (`step`) at a time, until each finishes or `leave`s.

    `pass_costs`: c(R), a verify pass's seconds by its rows, measured on passes without prompt chunks;
    `host`: the seconds of the last steps outside their passes (the loop's own work), by whether they drafted;
    `acceptance`: by drafting mode, every sequence's rounds pooled: what a sequence whose own controller has
    seen no round yet is expected to keep (a slot's first request would otherwise explore on its own).
    A drafter's steps are priced from its own book (`Generation.draft_length.costs`), which knows its cost shape.

    A drafter takes its prompt in at its first round (`Drafter.start`): a sequence that never drafts costs
    what the target alone does, and the first catch-up, priced as it is measured, is the drafter's to earn.

    A generation run alone is a schedule of one (`Generation.__iter__`): the same planner chooses its way and K.
    `verify`: the target's passes by K as a pair's cost book has measured them (one sequence's K + 1 rows), the
    first prices of c(R) for a planner that has measured none yet.
    """

    def __init__(self, verify: BatchCosts | None = None) -> None:
        self.pass_costs = BatchCosts(DECAY)
        if verify is not None and verify.weight:
            self.pass_costs.seed({str(int(k) + 1): seconds for k, seconds in verify.as_dict().items()}, 1.0)
        self.host: dict[bool, deque[float]] = {True: deque(maxlen=HOST_KEPT), False: deque(maxlen=HOST_KEPT)}
        self.acceptance: dict[str, PositionAcceptance] = {}
        self._running: list[_Running] = []
        self._quiet: _Quiet | None = None  # a choice of no drafts that stands for some steps
        self._chosen_s: deque[float] = deque(maxlen=CHOICES_KEPT)  # the last steps' choosing, their offers included
        self._replan_s = 0.0  # the seconds of a step's choice, its drafters' offers included (decayed)
        self._drafting_steps = 0  # steps that would draft since the last that did not (`_plain_due`)

    def __len__(self) -> int:
        return len(self._running)

    @property
    def _shared(self) -> bool:
        """Whether other sequences share the passes: a catch-up then holds them up."""
        return len(self._running) > 1

    @property
    def _chunk(self) -> int:
        """The most a drafter catches up on in a step: `ALONE_CHUNK` where its sequence runs alone."""
        return PREFILL_CHUNK if self._shared else ALONE_CHUNK

    def join(self, generation: Generation) -> None:
        """Start `generation` (made by a `Slot` no other running generation uses); its prompt is fed from the
        next step on."""
        prompt = generation.start()
        running = _Running(generation, prompt, lacked=len(prompt))
        self._running.append(running)
        if not running.prompt:  # the target's memory holds it all
            generation.prompt_fed(0)

    def leave(self, generation: Generation) -> None:
        """Stop `generation` now (a client that went away, a stop string): it is "interrupted" unless it had
        finished, and its sequence is free."""
        for running in self._running:
            if running.generation is generation:
                self._running.remove(running)
                generation.close()
                return

    def phase(self, generation: Generation) -> dict[str, object]:
        """Where `generation` is: its prompt being fed (tokens fed of those the target lacked), its drafter catching
        up between rounds (tokens it still lacks), or generating (tokens so far); "done" once it has left."""
        running = next((r for r in self._running if r.generation is generation), None)
        if running is None:
            return {"phase": "done"}
        if running.prompt:
            return {"phase": "prefill", "fed": running.fed, "of": running.lacked}
        if generation.catching_up:
            return {"phase": "catching up", "lacks": generation.catching_up,
                    "tokens": generation.stats.generated_tokens}
        return {"phase": "generating", "tokens": generation.stats.generated_tokens}

    def step(self) -> list[tuple[Generation, list[TokenEvent]]]:
        """One pass: every generating sequence's round and the next chunk of prompts. Returns what each
        generation emitted (those that finished included, with what they emitted last: they have left)."""
        step_started = time.perf_counter()
        generating = [r for r in self._running if not r.prompt]
        planned, emitted = [], []
        for running, k in zip(generating, self._planned_ks(generating)):
            if self._guarded(running, running.generation.begin_round, k, self._chunk) is True:
                planned.append(running)
            else:
                emitted.append((running.generation, []))
        drafts, passes_s = self._draft_together(planned)
        parts, verified = [], []
        for running in planned:
            part = None if running.generation.error else self._guarded(running, running.generation.plan,
                                                                   drafts.get(id(running)))
            if part is None:
                emitted.append((running.generation, []))
                continue
            parts.append(part)
            verified.append(running)
            self._drafted(running)
        fed = self._prompt_chunks(parts, bool(verified))
        if parts:
            started = time.perf_counter()
            rows, passes = _decode(parts)
            seconds = time.perf_counter() - started
            passes_s += seconds
            if not fed and passes == 1:
                self.pass_costs.record(sum(len(part.tokens) for part in parts), seconds)
            for running, part_rows in zip(verified, rows):
                events = self._guarded(running, self._settle, running.generation, part_rows, seconds, len(verified))
                emitted.append((running.generation, events or []))
        for running, n in fed:
            running.fed += n
            if not running.prompt:
                running.generation.prompt_fed(running.fed)
        for generation, _ in emitted:
            if generation.check_limits() is not None:
                self.leave(generation)
        if not fed and not any(r.generation.catching_up for r in planned):
            seconds = max(0.0, time.perf_counter() - step_started - passes_s)
            self.host[any(r.generation.last_draft.tokens for r in planned)].append(seconds)
        return emitted

    def _guarded(self, running: _Running, work: Callable[..., T], *args: object) -> T | None:
        """`work` for one generation; should it fail, the generation leaves with the error (None)."""
        try:
            return work(*args)
        except Exception as exc:
            self._fail(running, exc)
            return None

    def _fail(self, running: _Running, error: Exception) -> None:
        running.generation.error = error
        running.generation.finish_reason = "error"
        self.leave(running.generation)

    def _draft_together(self, planned: list[_Running]) -> tuple[dict[int, Draft], float]:
        """The drafts of the sequences whose drafters draft step by step (`Generation.draft_steps`), by id of
        their `_Running` (their steps in lockstep, each step of all of them one pass of the draft context), and
        the seconds of those steps. A step's seconds are its pass and each drafter's work on its row (choosing its
        token, its law): on a tiny draft that work is half a step, and a price without it drafted where drafting
        lost a third of the speed."""
        drafts: dict[int, Draft] = {}
        passes_s = 0.0
        stepping: list[tuple[_Running, Context, DraftSteps, list[int], int]] = []
        shares: dict[int, list[tuple[int, float]]] = {}
        for running in planned:
            stepped = self._guarded(running, running.generation.draft_steps)
            if stepped is not None:
                self._advance(drafts, stepping, running, stepped[0], stepped[1], None, 0)
        while stepping:
            parts = [Part(context, fed, 1, len(fed) if i == 0 else 0) for _, context, _, fed, i in stepping]
            started = time.perf_counter()
            rows, _ = _decode(parts)
            this_step, stepping = stepping, []
            for (running, context, steps, _fed, i), row in zip(this_step, rows):
                self._advance(drafts, stepping, running, context, steps, row[0], i + 1)
            seconds = time.perf_counter() - started
            passes_s, share = passes_s + seconds, seconds / len(parts)
            for running, _context, _steps, fed, _i in this_step:
                shares.setdefault(id(running), []).append((len(fed), share))
        for key, draft in drafts.items():  # each step costs its share of the pass, not the whole pass it waited on
            draft.steps = shares.get(key, [])
        return drafts, passes_s

    def _advance(self, drafts: dict[int, Draft], stepping: list[tuple[_Running, Context, DraftSteps, list[int], int]],
                 running: _Running, context: Context, steps: DraftSteps, logits: np.ndarray | None, i: int) -> None:
        """Send a drafter its step's logits (none to start it); its next step goes to `stepping`, its draft, once
        it has finished, to `drafts` (a drafter that fails takes its generation out)."""
        try:
            stepping.append((running, context, steps, steps.send(logits) if logits is not None else next(steps), i))
        except StopIteration as done:
            drafts[id(running)] = done.value
        except Exception as exc:
            self._fail(running, exc)

    def _settle(self, generation: Generation, rows: np.ndarray, seconds: float, sequences: int) -> list[TokenEvent]:
        """Finish a generation's round; its drafts and what was kept of them join its mode's pooled acceptance."""
        accepted = generation.stats.accepted
        events = generation.settle(rows, seconds, sequences)
        draft = generation.last_draft
        if draft.tokens:
            pooled = self.acceptance.setdefault(generation.stats.draft_mode, PositionAcceptance(DECAY))
            pooled.update(len(draft.tokens), generation.stats.accepted - accepted)
        return events

    def _prompt_chunks(self, parts: list[Part], others: bool) -> list[tuple[_Running, int]]:
        """Add the next chunk of each prompt still being fed to `parts`, within one batch; return how many tokens
        of which prompt were added. The prompts that lack least go first: a short request beside a long prompt
        starts generating at the next step instead of after it."""
        if not any(running.prompt for running in self._running):
            return []
        n_batch = self._running[0].generation.target.n_batch
        # What the rounds leave of a batch; at least a chunk (a pass of its own), so that a prompt always moves.
        room = max(n_batch - sum(len(part.tokens) for part in parts), min(PREFILL_CHUNK, n_batch))
        fed = []
        for running in sorted(self._running, key=lambda r: len(r.prompt)):
            n = min(len(running.prompt), PREFILL_CHUNK if others else room, room)
            if not running.prompt or n <= 0:
                continue
            n = whole_images(running.prompt, n)
            chunk, running.prompt = running.prompt[:n], running.prompt[n:]
            parts.append(Part(running.generation.target, chunk, 0, len(chunk)))
            fed.append((running, n))
            room -= n
        return fed

    def _planned_ks(self, generating: list[_Running]) -> list[int | None]:
        """`_ks`, its seconds shared among the sequences' planning figures (`Stats.plan_s`), less what their drafters
        spent choosing their ways, which each drafter counts itself, and their proposals made to offer them (drafting
        time, `Generation.offer`). Where no K is the planner's there is nothing to choose; a quiet step (`_Quiet`) asks
        no drafter and only counts down: on a tiny model, whose step costs ~150 µs, asking whether a probe was due and
        counting idle rounds every quiet step cost 3% of the target alone's speed."""
        started = time.perf_counter()
        if self._quiet is not None:
            if self._quiet.goes_on(generating):
                share = (time.perf_counter() - started) / len(generating)
                for running in generating:
                    running.generation.stats.plan_s += share
                return self._quiet.ks
            self._quiet.end()
            self._quiet = None
        if not any(r.adaptive for r in generating):
            return [None] * len(generating)
        drafting = [r.generation.drafter for r in generating if r.generation.drafter is not None]

        def choosing() -> float:
            return sum(drafter.plan_s for drafter in drafting)

        def proposing() -> float:
            return sum(r.generation.stats.draft_s for r in generating)

        chose, proposed = choosing(), proposing()
        ks = self._ks(generating)
        seconds, proposed = time.perf_counter() - started, proposing() - proposed
        self._chosen_s.append(seconds)
        self._replan_s = seconds if not self._replan_s else 0.8 * self._replan_s + 0.2 * seconds
        share = (seconds - proposed - (choosing() - chose)) / len(generating)
        for running in generating:
            running.generation.stats.plan_s += share
        return ks

    def _ks(self, generating: list[_Running]) -> list[int | None]:
        """K for each generating sequence: a fixed K as its request asked (None: its own), and for `-k auto` the
        batch's choice by goodput, with a probe (K = 1) for a drafter idle for long enough. A choice of no drafts at
        all stands for some steps of the same sequences (`_quiet_steps`)."""
        candidates = [self._candidate(r) for r in generating]  # made once a step (a drafter's offer decides its way)
        quiet = self._quiet_steps(len(generating))  # what drafting forgoes: the choice not made on quiet steps
        choices = choose(candidates, self.pass_costs, self.host_s, self._replan_s * quiet / (quiet + 1))
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
        if quiet and not any(ks):  # quiet until the first drafter due a probe (`_Running.probe_may_be_due`) is
            quiet = min([quiet, *(max(r.probe_after, r.priced_after) - r.idle for r in generating if r.adaptive)])
        self._quiet = _Quiet(quiet, list(generating), list(ks)) if quiet > 0 and not any(ks) else None
        return ks

    def _plain_due(self, generating: list[_Running]) -> bool:
        """Whether this step, which would draft, should not: the planner's own probe. Where every step drafts, the
        pass over the sequences alone is never measured again, and its price, left from cold first steps, kept the
        choice drafting (a tiny model drafting for itself at two sequences priced that pass at three times what it
        took). Due when that price is stale, after at least `PROBE_ROUNDS` steps that drafted since the last that did
        not, or at once while it rests on its first call, which was cold (`BatchCosts.first_only`: a tiny model's
        first 4-row pass cost 4× the next, was the floor of every larger pass, and its twin drafted 16 tokens for each
        of four sequences through a batch at 0.6× the target alone's speed); only where the planner chooses every
        sequence's K."""
        self._drafting_steps += 1
        if not all(r.adaptive for r in generating):
            return False
        plain = len(generating)
        if not self.pass_costs.first_only(plain) and \
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
        step_s = (self.pass_costs.seconds(sequences) or 0.0) + self.host_s
        if len(self._chosen_s) <= CHOICES_KEPT // 2 or not step_s:
            return 0
        choosing_s = sorted(self._chosen_s)[len(self._chosen_s) // 2]
        return min(QUIET_MAX, int(choosing_s / (PLAN_SHARE * step_s)))

    def _probe_due(self, running: _Running, candidate: Candidate, sequences: int) -> bool:
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

    def _candidate(self, running: _Running) -> Candidate:
        """What the goodput choice needs of a sequence: its acceptance by position, and what its drafter's steps and
        a round of them cost (`LoopCosts.step_costs`: its cost shape, its catch-up on what it has not seen), as
        measured (unmeasured: free, so that it gets tried)."""
        generation = running.generation
        length, mode = generation.draft_length, generation.stats.draft_mode
        cap = max(0, min(length.k_max, generation.room() - 1))
        if not running.adaptive:
            return Candidate((), fixed=min(length.next_k(), cap) if generation.drafter else 0)
        if not isinstance(length, AdaptiveK):  # a drafter of several ways: each way it offers, priced as it drafts
            offers = generation.offer(cap, self._chunk, self._shared)
            running.offers = [offer.way for offer in offers]
            if not offers:
                return Candidate((), fixed=0)
            first, *others = [self._way(offer, cap) for offer in offers]
            return Candidate(first.rates, step_s=first.step_s, round_s=first.round_s, others=tuple(others))
        pooled = self.acceptance.get(mode)
        if not length.priced and (pooled is None or pooled.measured < length.warmup_rounds):
            return Candidate((), fixed=min(length.next_k(), cap))  # not priced yet: tried at its warm-up K
        # Its steady round: what it lacks beyond a round's catch-up (a prompt, rounds it sat out) is the way's entry,
        # which no one pass can weigh (a pass priced with it never drafts, and the backlog only grows).
        step_s, round_s = length.costs.step_costs(min(generation.drafter_backlog(), STEADY_BACKLOG)) or (0.0, 0.0)
        acceptance = length.acceptance if length.rounds else pooled or length.acceptance
        return Candidate(acceptance.rates(cap), step_s=step_s, round_s=round_s)

    @staticmethod
    def _way(offer: Offer, cap: int) -> Candidate:
        """A way a drafter offers, as the goodput choice prices it: its acceptance, its steps, what a round costs
        once."""
        step_s, round_s = offer.costs.step_costs(offer.backlog) or (0.0, 0.0)
        return Candidate(offer.acceptance.rates(min(cap, offer.cap)), step_s=step_s, round_s=round_s)

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
        middles = [sorted(seconds)[(len(seconds) - 1) // 2] for seconds in self.host.values() if seconds]
        return min(middles, default=0.0)

    @staticmethod
    def _drafted(running: _Running) -> None:
        """A sequence drafted (its decodes were booked, as their share of the passes, by its round): a probe that the
        batch would not have chosen waits twice as long for the next."""
        if running.probing:
            running.probe_after = min(PROBE_MAX, running.probe_after * 2)
            running.probing = False


def _chooses_k(generation: Generation) -> bool:
    """Whether the planner chooses this generation's K: under `-k auto`, for a drafter of one way (its controller of K
    only keeps its acceptance) or of several (`Drafter.chooses_ways`: each way it offers is priced here); a fixed K is
    the request's."""
    if generation.drafter is None:
        return False
    return isinstance(generation.draft_length, AdaptiveK) or (
        generation.stats.adaptive and generation.drafter.chooses_ways)


def _decode(parts: list[Part]) -> tuple[list[np.ndarray], int]:
    """Every part's rows, decoded in as few passes as fit (`_batches`), and how many passes that took."""
    passes = _batches(parts, parts[0].context.n_batch)
    return [rows for group in passes for rows in decode_together(group)], len(passes)


def _batches(parts: list[Part], n_batch: int) -> list[list[Part]]:
    """The parts in order, in groups that each fit one batch: one pass, unless so many sequences draft so much
    (or a memory replays so many tokens) that they do not fit; a part larger than a batch goes alone, which
    `decode_together` decodes in several, and so does a part with an image (embeddings are a pass of their own)."""
    groups: list[list[Part]] = [[]]
    size = 0
    for part in parts:
        if groups[-1] and (size + len(part.tokens) > n_batch or has_images(part.tokens)
                           or has_images(groups[-1][-1].tokens)):
            groups.append([])
            size = 0
        groups[-1].append(part)
        size += len(part.tokens)
    return groups
