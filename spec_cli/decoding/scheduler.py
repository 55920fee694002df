"""Several generations at once, or one alone (a schedule of one): one verify pass a step for every active sequence
(continuous batching).

Each generation runs on its own sequence of one target context (`Pair.slots`). A step asks each generating
sequence for its round (`Generation.plan`: its drafts, with its way and K chosen by the `planner`; a
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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, TypeVar

import numpy as np

from spec_cli.decoding.drafter import Draft, DraftSteps
from spec_cli.decoding.planned import Planned
from spec_cli.decoding.planner import Planner
from spec_cli.llama.context import Context, Part, decode_together
from spec_cli.llama.vision import has_images, whole_images

if TYPE_CHECKING:  # the engine runs a generation alone as a schedule of one: it imports this module
    from spec_cli.decoding.engine import Generation, TokenEvent

PREFILL_CHUNK = 64  # prompt tokens a newcomer feeds a step while others generate (alone: a whole batch), and the
# most a drafter catches up on in a step (`Generation.begin_round`): a long catch-up never holds the others up
ALONE_CHUNK = 512  # the most a drafter catches up on in a step where its sequence runs alone: nobody waits on it
T = TypeVar("T")
MAX_SEQUENCES = 64  # the most sequences at once we offer (llama.cpp takes up to 256 in one context)


@dataclass
class _Running:
    """A generation under the scheduler: the prompt tokens the target still lacks, and what the planner keeps of it."""

    generation: Generation
    prompt: list[int]
    fed: int = 0
    lacked: int = 0  # the prompt tokens the target lacked when it joined
    plan: Planned = field(init=False)

    def __post_init__(self) -> None:
        self.plan = Planned(self.generation)


class Scheduler:
    """Runs the generations that `join` it, one step (`step`) at a time, until each finishes or `leave`s.

    Its `planner` chooses each step's ways and Ks from the passes, host work and acceptance the steps measure.
    A drafter takes its prompt in at its first round (`Drafter.start`): a sequence that never drafts costs
    what the target alone does, and the first catch-up, priced as it is measured, is the drafter's to earn.

    A generation run alone is a schedule of one (`Generation.__iter__`): the same planner chooses its way and K.
    Whatever face runs it (a lone generation, `spec serve`, `spec batch`), the planner's first prices of a pass are
    the target's passes as the pair's cost book measured them, from the first sequence that joins (`Planner.meet`).
    """

    def __init__(self) -> None:
        self.planner = Planner()
        self._running: list[_Running] = []

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
        self.planner.meet(generation.pass_costs)
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
        for running, k in zip(generating, self.planner.ks([r.plan for r in generating], self._chunk, self._shared)):
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
            self.planner.drafted(running.plan)
        fed = self._prompt_chunks(parts, bool(verified))
        if parts:
            started = time.perf_counter()
            rows, passes = _decode(parts)
            seconds = time.perf_counter() - started
            passes_s += seconds
            if not fed and passes == 1:
                self.planner.passed(sum(len(part.tokens) for part in parts), seconds)
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
            self.planner.stepped(any(r.generation.last_draft.tokens for r in planned), seconds)
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
        self.planner.settled(generation, len(generation.last_draft.tokens), generation.stats.accepted - accepted)
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
