"""What the loop asks of a drafter, so that it never imports one.

A drafter sees the whole sequence so far (prompt + accepted output) and proposes up to K tokens, each with
the distribution q it was drawn from (none when drafting greedily), so the loop can run the acceptance test
min(1, p/q). A deterministic proposal (n-gram lookup) has q = 1 at its token, which keeps sampling exact:
the token is kept with probability p(x), and a rejection draws from norm(max(0, p − q)), that is p without
x. After verification the loop tells the drafter how much of the sequence is still valid.

Under a grammar the loop hands `propose` a clone of the grammar's state, the drafter's to advance: a drafter
that draws from a law masks it (`decoding.constrained`), so its q is the law it drew from; one that does not
(n-gram lookup) ignores it, and the loop cuts its draft at the first token the grammar forbids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Generator, Sequence

import numpy as np

from spec_cli.decoding.costs import HOST, LoopCosts
from spec_cli.decoding.draft_length import PositionAcceptance
from spec_cli.decoding.sampling import Law, SamplingParams
from spec_cli.decoding.timing import InLlama
from spec_cli.llama.context import Context
from spec_cli.llama.grammar import Grammar


@dataclass
class Draft:
    """Proposed tokens d1..dK and, when sampling, the distributions q1..qK they were drawn from; `steps` are
    the draft model's decodes, (tokens fed, seconds) each, for the cost model; `convert_s` the seconds spent
    translating between two vocabularies (drafting through text); `way`, the drafting mode that made it where
    a drafter chooses among several (the hybrid), for the statistics; `match`, for a lookup's proposal, how many
    tokens of the sequence's end it found before (its reliability: `drafting.matches`)."""

    tokens: list[int] = field(default_factory=list)
    q: list[Law] = field(default_factory=list)
    steps: list[tuple[int, float]] = field(default_factory=list)
    convert_s: float = 0.0
    way: str = ""
    match: int = 0


@dataclass
class CatchUp:
    """A chunk of a drafter's catch-up taken in between rounds: its decodes, (tokens fed, seconds) each, and how many
    tokens it still lacks."""

    steps: list[tuple[int, float]]
    left: int


@dataclass(frozen=True)
class Offer:
    """A way a drafter that chooses among several (`Drafter.chooses_ways`) may draft next round, offered before its
    K so that a scheduler prices K by that way: its name (`way`), its acceptance by position, its book (`costs`,
    which knows its cost shape), the most it can draft (`cap`: a lookup's proposal may be short; 0 where it chose no
    draft) and the tokens its drafter lacks (`backlog`, the catch-up a round pays first); `owed_s`: what a round of
    this way leaves another of the drafter's ways to pay later (the catch-up, on the tokens the round emits, of a draft
    model whose turn it is otherwise)."""

    way: str
    acceptance: PositionAcceptance
    costs: LoopCosts
    cap: int
    backlog: int = 0
    owed_s: float = 0.0


@dataclass(frozen=True)
class Terms:
    """What the planner asks a drafter's offer for: ways for at most `k` tokens; a catch-up of at most `chunk` tokens a
    step; whether other sequences share the pass (`shared`: a catch-up then holds them up); how many tokens the
    generation may still emit (`left`: what entering a dearer way has to pay back over) and has emitted so far
    (`emitted`)."""

    k: int
    chunk: int
    shared: bool
    left: int
    emitted: int = 0


DraftSteps = Generator[list[int], np.ndarray, Draft]
"""A proposal made one decode of the drafter's context at a time: it yields the tokens each decode feeds (the
catch-up first), is sent the logits of the token after them, and returns the draft."""


def run_steps(steps: DraftSteps, decode: Callable[[int, list[int]], np.ndarray]) -> Draft:
    """Make a proposal step by step, `decode(i, fed)` decoding step i's tokens alone."""
    i = 0
    try:
        fed = next(steps)
        while True:
            fed = steps.send(decode(i, fed))
            i += 1
    except StopIteration as done:
        return done.value


class Drafter:
    """The interface every drafter implements: `propose`, and whichever of the rest it needs. The defaults
    suit a drafter without a memory of its own (nothing to take in, nothing to take back, no time in
    llama.cpp)."""

    cost_shape: str = HOST
    """How its drafting cost grows with K (`costs`): host time only by default; a step per drafted token or one
    pass per round for a drafter that decodes. Declared here, by each drafter, for the cost model."""
    chooses_ways: bool = False
    """Whether it chooses among several ways each round (the default drafting): it offers them (`offer`), and the
    planner takes one and its K for the pass, alone or beside other sequences."""
    idle_way: str = ""
    """What a round that drafts nothing counts as in the statistics' ways (a drafter of several ways: its no-draft
    option, which the planner may choose for it); "" counts no way."""
    plan_s: float = 0.0
    """Seconds spent choosing how to draft (a drafter of several ways: pricing them), for the planning figure."""
    clocks: tuple[InLlama, ...] = ()
    """What keeps its time inside llama.cpp (`InLlama`: the seconds there so far and the part spent taking back
    rejected drafts), for honest time splits: none for a drafter without a model; a drafter over a context, that
    context. The loop reads them every round, so they are the things that count, not properties over them: read
    through a drafter of several ways, its drafters and their contexts, they cost a default that never drafted 1.6%
    of a tiny model's speed at four sequences."""

    def prefill(self, tokens: Sequence[int]) -> list[tuple[int, float]]:
        """Take in a new prompt now, whole: what `start` does for a drafter whose prompt work decodes nothing (a
        lookup indexes it); return the decodes it took, (tokens fed, seconds), for the cost model (none)."""
        return []

    def stepped(self, tokens: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator,
                grammar: Grammar | None = None) -> tuple[Context, DraftSteps] | None:
        """The proposal `propose` would make, one decode at a time on the returned context (step 0, the
        catch-up, is sure; the rest speculative), for a scheduler that decodes several sequences' steps in one
        pass. None (the default): this drafter proposes whole."""
        return None

    def start(self, tokens: Sequence[int]) -> None:
        """Take in a new prompt lazily: forget what the memory holds that the prompt does not extend, and leave
        decoding the rest to the catch-up (`catch_up`, or the first proposal's first decode). The loop starts
        drafters so, alone or under a scheduler: drafting may not pay at all (K = 0) and should then cost
        nothing, and the first token waits for the target's prefill alone. By default, `prefill`: a drafter whose
        prompt work decodes nothing does it all now."""
        self.prefill(tokens)

    def propose(self, tokens: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator,
                grammar: Grammar | None = None) -> Draft:
        """Propose up to `k` tokens to follow `tokens`, under `grammar` (its state after `tokens`) if any."""
        raise NotImplementedError

    def offer(self, tokens: Sequence[int], terms: Terms, sampling: SamplingParams,
              rng: np.random.Generator) -> list[Offer]:
        """For a drafter that `chooses_ways`: the ways it may draft next round on the planner's `terms`, the one it
        prefers first; the round drafts that one unless told another (`take`). None offered (the default): one way,
        priced by its K controller's book."""
        return []

    def take(self, way: str, k: int) -> None:
        """Draft next round the way `way`, one of those just offered, at K = `k` (a scheduler weighed them in the
        batch)."""

    def expect(self, terms: Terms) -> None:
        """For a drafter that `chooses_ways`, under a K the planner does not choose (a fixed `-k N`, where no offer is
        asked for): this round's `terms`, what `offer` brings under `-k auto` (the tokens the generation may still
        emit, which entering a dearer way is weighed against)."""

    def still_idle(self, tokens: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator) -> bool:
        """For a drafter that `chooses_ways` whose last offer held no way that drafts: whether it would offer none for
        at most `k` tokens now either, so that the planner's choice of no drafts may stand for this round (`stood`).
        The default: yes (its offers do not change between choices)."""
        return True

    def stood(self) -> None:
        """A round the planner's choice of no drafts stood for (`still_idle`), without asking for offers."""

    def pending(self, tokens: Sequence[int]) -> int:
        """How many tokens the next proposal must feed before its first draft step (its catch-up): 0 for a
        drafter without a memory of its own."""
        return 0

    def catch_up(self, tokens: Sequence[int], chunk: int) -> CatchUp | None:
        """Where this drafter lacks more than `chunk` tokens of `tokens` (a long prompt, a long stretch drafted
        another way), take in the next `chunk` of them now and say what is left: a catch-up is a prefill, made in
        chunks between rounds like the target's prompt, and a drafter that is catching up drafts nothing that
        round, so no round waits on a long catch-up. None: it lacks at most `chunk` and may draft this round (its
        first decode takes them in)."""
        return None

    def update(self, drafted: int, accepted: int) -> None:
        """The target kept `accepted` of the `drafted` tokens last proposed."""

    def rewind(self, n_keep: int) -> None:
        """Only the first `n_keep` tokens of the sequence last proposed from are still valid."""

    def done(self, tokens: Sequence[int], n_prompt: int, ended: bool = False) -> None:
        """The generation is over: `tokens` is its whole sequence, the first `n_prompt` of them its prompt (a
        drafter that learns from outputs keeps them); `ended`: the answer ended on its own (an end-of-generation
        token), not at a limit or stopped."""
