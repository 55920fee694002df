"""The draft-and-verify loop: one generator that yields a `TokenEvent` per emitted token.

Each round the drafter proposes d1..dK, the target scores [last, d1..dK] in one batch (K + 1 rows of
logits), a prefix d1..dn is kept and one token from the target follows it: the correction at position
n + 1, or the bonus token when n = K. Greedy keeps the drafts the target would have chosen; sampled rounds
let a rule from `verification` (block by default, token by token, or the Gumbel rule, whose picks depend on
the seed and the position alone) decide n and the next token's law.
With K = 0 (no drafter) the same loop is plain target-only decoding, which is what `--no-draft` measures
against.

Under a grammar every law is the constrained one (`constrained`): the drafter drafts from its own law masked
by a clone of the grammar's state, a draft is cut at its first token the grammar forbids (a drafter that
does not mask, n-gram lookup), and the target's p_i is masked by the state after x_1..x_{i-1}; after the
round the state is the one after the kept tokens and the target's.

Invariant between rounds: the target's memory holds a prefix of the sequence without its last token
(all of it, unless a recurrent memory went back to a snapshot); the next round's batch feeds the rest, the
last token included, and asks for logits from the last token on.
"""

from __future__ import annotations

import codecs
import time
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from spec_cli.decoding.constrained import constrained_greedy, constrained_probabilities
from spec_cli.decoding.batch_costs import BatchCosts
from spec_cli.decoding.costs import LoopCosts
from spec_cli.decoding.draft_length import DraftLength, FixedK
from spec_cli.decoding.drafter import Draft, Drafter, DraftSteps, Offer, Terms
from spec_cli.decoding.sampling import (Law, SamplingParams, greedy_token, probabilities, row_laws, sample,
                                        shares_candidates)
from spec_cli.decoding.scheduler import Scheduler
from spec_cli.decoding.stats import Stats
from spec_cli.decoding.timing import RoundTimer
from spec_cli.decoding.noise import GumbelNoise, NoiseCursor
from spec_cli.decoding.verification import DEFAULT_VERIFY, GUMBEL, RULES, Distributions, gumbel_verification
from spec_cli.llama.context import Context, Part, common_prefix
from spec_cli.llama.grammar import Grammar


@dataclass(frozen=True)
class TokenEvent:
    """One emitted token: `from_draft` is True when a draft token was accepted, False for the target's."""

    token: int
    text: str
    from_draft: bool


class Generation:
    """A generation in progress: iterate it for `TokenEvent`s; `stats`, `text` and `finish_reason` are
    live while it runs and final once it has finished.

    finish_reason is "stop" (end-of-generation token), "length" (max_tokens), "context" (the context is
    full), "interrupted" (the consumer stopped early, e.g. on Ctrl-C) or "error" (set by the consumer when
    the run cannot go on, e.g. an RPC worker was lost; under a scheduler, with `error` set, when this
    generation's own work failed and it left alone).
    """

    def __init__(self, target: Context, drafter: Drafter | None, prompt: Sequence[int],
                 sampling: SamplingParams, seed: int, draft_length: DraftLength, max_tokens: int,
                 verify: str = DEFAULT_VERIFY, costs: LoopCosts | None = None,
                 grammar: Grammar | None = None, control_text: bool = False) -> None:
        """`costs`: running estimates that outlive this generation (the pair's), fed with each round's
        timings; the generation's own timings are in `stats.costs`. `grammar`: the start state of a grammar
        the output must follow (this generation's own: it advances it). `control_text`: control tokens are
        in the text as their own text (by default they write nothing)."""
        self.target = target
        self.drafter = drafter
        self.prompt = list(prompt)
        self.sampling = sampling
        self.verification = verify  # the rule's name, for reports
        self._verify_rule = RULES.get(verify)
        self.seed = seed
        self.draft_length = draft_length if drafter is not None else FixedK(0)
        self.max_tokens = max_tokens
        self.stats = Stats(draft_max=self.draft_length.k_max, prompt_tokens=len(self.prompt))
        self.token_ids: list[int] = []
        self.text = ""
        self.finish_reason: str | None = None
        self.error: Exception | None = None
        self._started = False
        self._closed = False
        self._seq = list(self.prompt)
        self._grammar = grammar
        self._states: list[Grammar | None] = [grammar]  # the grammar's state before each row of a round
        self._rng = np.random.default_rng(seed)
        self._noise = GumbelNoise(seed) if verify == GUMBEL else None
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._control_text = control_text
        self._costs = costs
        self._timer = RoundTimer(self.stats, [target, *(drafter.clocks if drafter is not None else ())],
                                 [costs] if costs is not None else [])
        self._draft = Draft()  # the round `plan` began
        self._k = 0  # the K of the round `begin_round` began
        self.catching_up = 0  # tokens the drafter still lacks, while it catches up between rounds
        self._drafter_plan_s = 0.0  # the drafter's planning seconds already in `stats.plan_s`

    def __iter__(self) -> Iterator[TokenEvent]:
        if self._started:
            raise RuntimeError("a Generation runs once; call Pair.generate again for another")
        return self._run()

    def _run(self) -> Iterator[TokenEvent]:
        """Run alone: a schedule of one (`Scheduler`), so that one planner chooses every round's way and K and the
        loop has one driver. Its prompt goes in a whole batch a step, its drafter catches up `ALONE_CHUNK` tokens
        a step, and an error of its own is raised here, as the scheduler hands it back."""
        scheduler = Scheduler()
        try:
            scheduler.join(self)
            while len(scheduler):
                for _generation, events in scheduler.step():
                    yield from events
                if self.error is not None:
                    raise self.error
        finally:
            self.close()

    # A scheduler runs generations over sequences of one target context (`scheduler`): it feeds each one's prompt
    # in chunks (`start`, `prompt_fed`), then each step begins every one's round (`begin_round`), decodes their
    # drafters' steps together where they draft step by step (`draft_steps`), asks each for its share of one
    # verify pass (`plan`) and hands back its rows (`settle`).

    @property
    def pass_costs(self) -> BatchCosts | None:
        """The target's passes by rows as the pair's running costs hold them (None without): the scheduler's c(R)."""
        return self._costs.verify if self._costs is not None else None

    def start(self) -> list[int]:
        """Begin under a scheduler: keep what the target's memory holds of the prompt; return what it lacks."""
        if self._started:
            raise RuntimeError("a Generation runs once; call Pair.generate again for another")
        self._started = True
        self._timer.prompt_started()
        prompt = self._seq[:-1]
        self.target.trim(common_prefix(self.target.tokens, prompt))
        self.stats.prompt_cached = self.target.n_past
        return prompt[self.target.n_past:]

    def prompt_fed(self, fed: int) -> None:
        """The scheduler fed the whole prompt (`fed` tokens of it in this generation's chunks): the target's
        memory marks the place, the drafter keeps what it holds of the prompt and takes the rest in when it
        first drafts (`Drafter.start`: under a scheduler it may never draft), and the rounds may start."""
        if fed:
            self.target.mark_prompt()
        if self.drafter is not None:
            self.drafter.start(self._seq[:-1])
        self._timer.prompt_done(len(self._seq))

    def begin_round(self, k: int | None, chunk: int) -> bool:
        """Start a round drafting K = `k` (None: its own controller's choice), or none while the drafter catches up
        `chunk` tokens at a time; False once it has finished."""
        if self.check_limits() is not None:
            return False
        self._timer.start_round()
        if k is None and self.drafter is not None and self.drafter.chooses_ways:
            self.drafter.expect(self._terms(self.draft_length.next_k(), chunk, False))
        self._k = 0 if self._catch_up(k, chunk) else self._next_k() if k is None else min(k, self.room() - 1)
        return True

    def _catch_up(self, k: int | None, chunk: int) -> bool:
        """Where the drafter lacks more than `chunk` tokens of the sequence, feed it the next `chunk` (drafting
        time, booked as its decodes); True: this round drafts nothing (`Drafter.catch_up`). A round the planner gave
        no draft (`k` 0) feeds no drafter of one way: its backlog is a price of drafting, paid when a round drafts (a
        drafter of several ways feeds a way only once it chose it: its own `catch_up` decides). The draft model
        pinned under `-k auto` at two sequences took in each new request's prompt, 64 tokens a step, while the planner
        drafted nothing: ~210 ms a request, 0.80x the target alone."""
        if self.drafter is None or (k == 0 and not self.drafter.chooses_ways):
            self.catching_up = 0
            return False
        self._timer.begin_step()
        done = self.drafter.catch_up(self._seq, chunk)
        self.catching_up = done.left if done is not None else 0
        if done is None:
            return False
        self._timer.end_step("draft_s")
        self._timer.caught_up(done.steps, len(self._seq) - done.left)
        self.stats.caught_up += sum(n for n, _ in done.steps)
        return True

    def draft_steps(self) -> tuple[Context, DraftSteps] | None:
        """The round's proposal one decode at a time, where the drafter can make it so (`Drafter.stepped`), for
        a scheduler to decode several sequences' steps in one pass; then `plan(draft)`. None: `plan()` makes
        the proposal whole."""
        if self.drafter is None or self._k == 0:
            return None
        grammar = self._grammar.clone() if self._grammar is not None else None
        stepped = self.drafter.stepped(self._seq, self._k, self.sampling, self._draws(), grammar)
        if stepped is not None:
            self._timer.begin_step()
        return stepped

    def plan(self, draft: Draft | None = None) -> Part:
        """This generation's share of the verify pass of the round `begin_round` began: its drafts (`draft`, from
        `draft_steps`, or proposed now) after whatever the target lacks."""
        if draft is None:
            self._draft = self._propose(self._k)
        else:
            self._draft = self._drafted(draft)
            self._timer.end_step("draft_s")
        known = self._seq[self.target.n_past:]
        return Part(self.target, [*known, *self._draft.tokens], len(self._draft.tokens) + 1, len(known))

    def settle(self, rows: np.ndarray, verify_s: float, sequences: int) -> list[TokenEvent]:
        """Finish the round `plan` began, with the verify pass's rows for it, which took `verify_s` for
        `sequences` sequences together; return the tokens it emits."""
        self._timer.verified(verify_s)
        return list(self._settle(self._draft, rows, sequences))

    def close(self) -> None:
        """Stop (alone, or under a scheduler): a generation that has not finished is "interrupted"; both
        memories keep at most the sequence but its last token, as after any round; the drafter hears, once,
        that the generation is over (`Drafter.done`)."""
        if self.finish_reason is None:
            self.finish_reason = "interrupted"
        self.stats.threads = (self.target.threads.count, self.target.threads.most)
        self._rewind()
        if self.drafter is not None and not self._closed:
            self.drafter.done(self._seq, len(self.prompt), ended=self.finish_reason == "stop")
        self._closed = True

    def check_limits(self) -> str | None:
        """The finish reason: set to "length" or "context" once max_tokens or the context is reached."""
        if self.finish_reason is None and len(self.token_ids) >= self.max_tokens:
            self.finish_reason = "length"
        if self.finish_reason is None and len(self._seq) >= self.target.n_ctx:
            self.finish_reason = "context"
        return self.finish_reason

    def _settle(self, draft: Draft, rows: np.ndarray, sequences: int) -> Iterator[TokenEvent]:
        self.stats.batched += sequences
        self.stats.current_k = len(draft.tokens) or self.stats.current_k  # the K last drafted, for live views
        with self._timer.step("verify_s"):
            n, token = self._accepted_prefix(rows, draft)
        self.stats.record_round(len(draft.tokens), n, draft.way or (self.drafter.idle_way if self.drafter else ""))
        self._advance_grammar(n, token)
        emitted = yield from self._emit(draft.tokens[:n], token)
        self._rewind(drafted=self._k > 0)
        self._learn(draft, n, emitted)

    def _next_k(self) -> int:
        """K for this round: the controller's choice, shrunk to leave room for K + 1 new tokens within
        max_tokens and the context."""
        started = time.perf_counter()
        k = min(self.draft_length.next_k(), self.room() - 1)
        self.stats.plan_s += time.perf_counter() - started
        return k

    def offer(self, k: int, chunk: int, shared: bool) -> list[Offer]:
        """The ways the drafter may draft next round, for at most `k` tokens, its preferred first, a catch-up taking
        at most `chunk` tokens a step, other sequences sharing the pass or not (`Drafter.offer`)."""
        if self.drafter is None:
            return []
        started, planned = time.perf_counter(), self.drafter.plan_s
        terms = self._terms(k, chunk, shared)
        offers = self.drafter.offer(self._seq, terms, self.sampling, self._draws())
        # Its proposals (a lookup's) are drafting; what it spent choosing is in its planning figure (`_learn`).
        self.stats.draft_s += time.perf_counter() - started - (self.drafter.plan_s - planned)
        return offers

    def _terms(self, k: int, chunk: int, shared: bool) -> Terms:
        """What a drafter of several ways is asked for next round, with what this generation may still emit and has."""
        return Terms(k, chunk, shared, self.room(), len(self.token_ids))

    def take(self, way: str, k: int) -> None:
        """Draft next round the way `way`, one of those offered, at K = `k` (`Drafter.take`)."""
        if self.drafter is not None:
            self.drafter.take(way, k)

    def still_idle(self, k: int) -> bool:
        """Whether the drafter, whose last offer held no way that drafts, would offer none for at most `k` tokens now
        either (`Drafter.still_idle`): what it proposes to see so is drafting time, what it weighs its own planning."""
        if self.drafter is None:
            return True
        started, planned = time.perf_counter(), self.drafter.plan_s
        idle = self.drafter.still_idle(self._seq, k, self.sampling, self._draws())
        self.stats.draft_s += time.perf_counter() - started - (self.drafter.plan_s - planned)
        return idle

    def stood(self) -> None:
        """The planner's choice of no drafts stands for this round (`Drafter.stood`)."""
        if self.drafter is not None:
            self.drafter.stood()

    def drafter_backlog(self) -> int:
        """How many tokens the drafter must take in before it drafts again (0 for one without a memory)."""
        return self.drafter.pending(self._seq) if self.drafter is not None else 0

    @property
    def last_draft(self) -> Draft:
        """The drafts of the round last planned (for a scheduler's cost books)."""
        return self._draft

    def room(self) -> int:
        """How many more tokens max_tokens and the context leave room for."""
        return min(self.max_tokens - len(self.token_ids), self.target.n_ctx - len(self._seq))

    def _propose(self, k: int) -> Draft:
        if self.drafter is None or k == 0:
            return Draft()
        grammar = self._grammar.clone() if self._grammar is not None else None
        with self._timer.step("draft_s"):
            return self._drafted(self.drafter.propose(self._seq, k, self.sampling, self._draws(), grammar))

    def _draws(self) -> np.random.Generator | NoiseCursor:
        """What the drafter draws from: the generation's random generator, or under the Gumbel rule the noise
        of the positions its drafts land at (so that it proposes what the target would pick, where it can)."""
        return self._rng if self._noise is None else self._noise.from_position(len(self._seq))

    def _drafted(self, draft: Draft) -> Draft:
        """A proposal made: cut where the grammar forbids, its conversion time counted."""
        if self._grammar is not None:
            self._walk_grammar(draft)
        self.stats.convert_s += draft.convert_s
        return draft

    def _walk_grammar(self, draft: Draft) -> None:
        """Keep the draft up to its first token the grammar forbids, with the grammar's state before each
        row of the verify pass (the cut only drops tokens whose p is 0: exactness is untouched)."""
        states = [self._grammar]
        for i, token in enumerate(draft.tokens):
            after = states[-1].after(token)
            if after is None:
                del draft.tokens[i:], draft.q[i:]
                break
            states.append(after)
        self._states = states

    def _advance_grammar(self, n: int, token: int) -> None:
        """The grammar's state after the n kept drafts and the target's token (none past an end of generation,
        which ends the output)."""
        if self._grammar is None:
            return
        self._grammar = self._states[n]
        if not self.target.model.is_end_of_generation(token):
            self._grammar.accept(token)
        self._states = [self._grammar]

    def _accepted_prefix(self, rows: np.ndarray, draft: Draft) -> tuple[int, int]:
        """Greedy: the drafted tokens the target would have chosen itself, then its own choice. Sampled: the
        verification rule's verdict over p_1..p_{K+1}; each row's penalties count the drafted tokens before
        it, as the draft's did."""
        sampling = self.sampling
        recent = sampling.recent(self._seq)
        if sampling.greedy:
            for n, x in enumerate([*draft.tokens, None]):
                row_recent = sampling.recent([*recent, *draft.tokens[:n]])
                grammar = self._states[n] if self._grammar is not None else None
                choice = (greedy_token(rows[n], sampling, row_recent) if grammar is None
                          else constrained_greedy(rows[n], sampling, row_recent, grammar))
                if choice != x:
                    return n, choice
        p = _TargetLaws(rows, sampling, recent, draft.tokens, self._states if self._grammar is not None else None)
        if self._noise is not None:
            start = len(self._seq)
            verdict = gumbel_verification(p, draft.tokens, lambda law, i: self._noise.pick(law, start + i))
        else:
            verdict = self._verify_rule(p, draft.q, draft.tokens, self._rng.random(len(draft.tokens)))
        return verdict.accepted, sample(verdict.next_token, self._rng)

    def _emit(self, kept: list[int], token: int) -> Iterator[TokenEvent]:
        """Yield the kept drafts and the target's token, up to an end-of-generation token; return how many
        were emitted."""
        model = self.target.model
        for i, x in enumerate([*kept, token]):
            if model.is_end_of_generation(x):
                self.finish_reason = "stop"
                return i
            self._seq.append(x)
            self.token_ids.append(x)
            piece = self._decoder.decode(model.piece(x, special=self._control_text))
            self.text += piece
            self.stats.generated_tokens += 1
            self._timer.tick()
            yield TokenEvent(x, piece, from_draft=i < len(kept))
        return len(kept) + 1

    def _rewind(self, drafted: bool = True) -> None:
        """Make both memories hold at most seq[:-1]: drop drafted tokens the target did not keep.

        Either may hold less (the draft never saw d_K after a fully accepted round; a memory that restored a
        snapshot is further back); the next round feeds what each lacks. After a stop the drafter keeps the
        last token too: no next round feeds it again, and a drafter whose memory goes back to snapshots would
        otherwise lose the round's snapshot (taken after that token). A round that asked the drafter for no draft
        (`drafted` False) left it nothing to take back (a catch-up feeds sure tokens only): on a tiny model, asking
        a draft model to rewind every idle round cost ~1% of the target alone's speed.
        """
        n = len(self._seq)
        self.target.trim(n - 1)
        if self.drafter is not None and drafted:
            self.drafter.rewind(n if self.finish_reason == "stop" else n - 1)

    def _learn(self, draft: Draft, n: int, emitted: int) -> None:
        """Tell the K controller and the drafter what was kept, and the cost books what the round cost; the planning
        figure gains the controller's update and what the drafter spent choosing its way. A round that drafted nothing
        teaches a controller nothing, and neither does a round of a drafter of several ways: its K only bounds theirs,
        and each way's own controller learns (`Drafter.update`)."""
        if draft.tokens and not self.drafter.chooses_ways:
            started = time.perf_counter()
            self.draft_length.update(len(draft.tokens), n)
            self.stats.plan_s += time.perf_counter() - started
        if self.drafter is not None:
            self.drafter.update(len(draft.tokens), n)
            self.stats.plan_s += self.drafter.plan_s - self._drafter_plan_s
            self._drafter_plan_s = self.drafter.plan_s
        self._timer.end_round(draft.steps, len(draft.tokens), emitted, len(self._seq) - emitted)


class _TargetLaws(Distributions):
    """p_1..p_{K+1} from a verify pass's rows, computed when a verification rule first reads them: p_1..p_K all
    at once where their top-k candidates are found together (`row_laws`), else each on its own (token
    verification stops reading at the first rejection). p_{K+1} is read only when every draft is kept. Under
    a grammar each row is masked by its own state (`states`), one row at a time."""

    def __init__(self, rows: np.ndarray, sampling: SamplingParams, recent: list[int], draft: list[int],
                 states: list[Grammar] | None = None) -> None:
        self._rows, self._sampling, self._recent, self._draft = rows, sampling, recent, draft
        self._states = states
        self._laws: dict[int, Law] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i: int) -> Law:  # type: ignore[override]
        if (not self._laws and i < len(self._draft) and self._states is None
                and shares_candidates(self._sampling, self._rows.shape[1])):
            self._laws = dict(enumerate(row_laws(self._rows[:len(self._draft)], self._sampling)))
        if i not in self._laws:
            recent = self._sampling.recent([*self._recent, *self._draft[:i]])
            self._laws[i] = (probabilities(self._rows[i], self._sampling, recent) if self._states is None
                             else constrained_probabilities(self._rows[i], self._sampling, recent, self._states[i]))
        return self._laws[i]
