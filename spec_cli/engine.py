"""The draft-and-verify loop: one generator that yields a `TokenEvent` per emitted token.

Each round the drafter proposes d1..dK, the target scores [last, d1..dK] in one batch (K + 1 rows of
logits), a prefix d1..dn is kept and one token from the target follows it: the correction at position
n + 1, or the bonus token when n = K. Greedy keeps the drafts the target would have chosen; sampled rounds
let a rule from `verification` (block by default, or token by token) decide n and the next token's law.
With K = 0 (no drafter) the same loop is plain target-only decoding, which is what `--no-draft` measures
against.

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

from spec_cli.costs import LoopCosts
from spec_cli.draft_length import DraftLength, FixedK
from spec_cli.drafters import Draft, Drafter
from spec_cli.llama import Context
from spec_cli.sampling import (Law, SamplingParams, greedy_token, probabilities, row_laws, sample,
                               shares_candidates)
from spec_cli.stats import Stats
from spec_cli.verification import DEFAULT_VERIFY, RULES, Distributions


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
    the run cannot go on, e.g. an RPC worker was lost).
    """

    def __init__(self, target: Context, drafter: Drafter | None, prompt: Sequence[int],
                 sampling: SamplingParams, seed: int, draft_length: DraftLength, max_tokens: int,
                 verify: str = DEFAULT_VERIFY, costs: LoopCosts | None = None) -> None:
        """`costs`: running estimates that outlive this generation (the pair's), fed with each round's
        timings; the generation's own timings are in `stats.costs`."""
        self.target = target
        self.drafter = drafter
        self.prompt = list(prompt)
        self.sampling = sampling
        self.verification = verify  # the rule's name, for reports
        self._verify = RULES[verify]
        self.seed = seed
        self.draft_length = draft_length if drafter is not None else FixedK(0)
        self.max_tokens = max_tokens
        self.costs = costs
        self.stats = Stats(draft_max=self.draft_length.k_max, prompt_tokens=len(self.prompt))
        self.token_ids: list[int] = []
        self.text = ""
        self.finish_reason: str | None = None
        self._started = False

    def __iter__(self) -> Iterator[TokenEvent]:
        if self._started:
            raise RuntimeError("a Generation runs once; call Pair.generate again for another")
        self._started = True
        return self._run()

    def _run(self) -> Iterator[TokenEvent]:
        target, drafter, stats = self.target, self.drafter, self.stats
        model = target.model
        rng = np.random.default_rng(self.seed)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        seq = list(self.prompt)

        def spent_in_llama() -> tuple[float, float]:
            """(all seconds in llama.cpp, the part spent on rollback) of both models so far."""
            if drafter is None:
                return target.busy_s, target.rollback_s
            return target.busy_s + drafter.busy_s, target.rollback_s + drafter.rollback_s

        rollback_base = spent_in_llama()[1]  # moved past the prompt's snapshot once the prompt is in
        cost_books = [stats.costs, *filter(None, [self.costs])]  # this generation's, and the pair's running ones

        def rewind() -> None:
            """Make both memories hold at most seq[:-1]: drop drafted tokens the target did not keep.

            Either may hold less (the draft never saw d_K after a fully accepted round; a memory that
            restored a snapshot is further back); the next round feeds what each lacks. After a stop the
            drafter keeps the last token too: no next round feeds it again, and a drafter whose memory
            goes back to snapshots would otherwise lose the round's snapshot (taken after that token).
            """
            busy = spent_in_llama()[0]
            target.trim(len(seq) - 1)
            if drafter is not None:
                drafter.rewind(len(seq) if self.finish_reason == "stop" else len(seq) - 1)
            busy_now, rollback = spent_in_llama()
            stats.llama_s += busy_now - busy
            stats.rollback_s = rollback - rollback_base

        def limit_reached() -> str | None:
            if len(self.token_ids) >= self.max_tokens:
                return "length"
            if len(seq) >= target.n_ctx:
                return "context"
            return None

        def draft_length() -> int:
            """K for this round: the controller's choice, shrunk to leave room for K + 1 new tokens within
            max_tokens and the context."""
            room = min(self.max_tokens - len(self.token_ids), target.n_ctx - len(seq))
            return min(self.draft_length.next_k(), room - 1)

        def propose(k: int) -> Draft:
            if drafter is None or k == 0:
                return Draft()
            started, busy = time.perf_counter(), drafter.busy_s
            draft = drafter.propose(seq, k, self.sampling, rng)
            stats.draft_s += time.perf_counter() - started
            stats.convert_s += draft.convert_s
            stats.llama_s += drafter.busy_s - busy
            return draft

        def verify(draft: Draft) -> tuple[int, int, float]:
            """Score [last, d1..dK] in one target pass (after any tokens a rollback took back); return
            (n accepted, the target's token, seconds)."""
            started, busy = time.perf_counter(), target.busy_s
            known = seq[target.n_past:]
            rows = target.decode([*known, *draft.tokens], len(draft.tokens) + 1, n_final=len(known))
            stats.llama_s += target.busy_s - busy
            n, token = accepted_prefix(rows, draft)
            elapsed = time.perf_counter() - started
            stats.verify_s += elapsed
            return n, token, elapsed

        def accepted_prefix(rows: np.ndarray, draft: Draft) -> tuple[int, int]:
            """Greedy: the drafted tokens the target would have chosen itself, then its own choice. Sampled:
            the verification rule's verdict over p_1..p_{K+1}; each row's penalties count the drafted
            tokens before it, as the draft's did."""
            recent = self.sampling.recent(seq)
            if self.sampling.greedy:
                for n, x in enumerate([*draft.tokens, None]):
                    choice = greedy_token(rows[n], self.sampling, self.sampling.recent([*recent, *draft.tokens[:n]]))
                    if choice != x:
                        return n, choice
            p = _TargetLaws(rows, self.sampling, recent, draft.tokens)
            verdict = self._verify(p, draft.q, draft.tokens, rng.random(len(draft.tokens)))
            return verdict.accepted, sample(verdict.next_token, rng)

        def learn(draft: Draft, n: int, verify_s: float, round_s: float, emitted: int) -> None:
            """Tell the K controller and the drafter what was kept, and the cost models what it cost."""
            self.draft_length.update(len(draft.tokens), n)
            if drafter is not None:
                drafter.update(len(draft.tokens), n)
            for costs in cost_books:
                costs.record_round(draft.steps, len(draft.tokens), verify_s, round_s, emitted)

        def play_round(decode_start: float) -> Iterator[TokenEvent]:
            round_start = time.perf_counter()
            draft = propose(draft_length())
            stats.current_k = len(draft.tokens) or stats.current_k  # the K last drafted, for live views
            n, token, verify_s = verify(draft)
            stats.record_round(len(draft.tokens), n)
            emitted = 0
            for i, kept in enumerate([*draft.tokens[:n], token]):
                if model.is_end_of_generation(kept):
                    self.finish_reason = "stop"
                    break
                seq.append(kept)
                self.token_ids.append(kept)
                piece = decoder.decode(model.piece(kept))
                self.text += piece
                stats.generated_tokens += 1
                stats.decode_s = time.perf_counter() - decode_start
                emitted = i + 1
                yield TokenEvent(kept, piece, from_draft=i < n)
            rewind()
            stats.decode_s = time.perf_counter() - decode_start  # a round that ends on EOS counts too
            learn(draft, n, verify_s, time.perf_counter() - round_start, emitted)

        try:
            started = time.perf_counter()
            stats.prompt_cached = target.prefill(seq[:-1])
            if drafter is not None:
                steps = drafter.prefill(seq[:-1])
                for costs in cost_books:
                    costs.record_draft(steps)
            rollback_base = spent_in_llama()[1]
            decode_start = time.perf_counter()
            stats.prompt_s = decode_start - started
            while self.finish_reason is None:
                self.finish_reason = limit_reached()
                if self.finish_reason is None:
                    yield from play_round(decode_start)
        finally:
            if self.finish_reason is None:
                self.finish_reason = "interrupted"
            rewind()


class _TargetLaws(Distributions):
    """p_1..p_{K+1} from a verify pass's rows, computed when a verification rule first reads them: p_1..p_K all
    at once where their top-k candidates are found together (`row_laws`), else each on its own (token
    verification stops reading at the first rejection). p_{K+1} is read only when every draft is kept."""

    def __init__(self, rows: np.ndarray, sampling: SamplingParams, recent: list[int], draft: list[int]) -> None:
        self._rows, self._sampling, self._recent, self._draft = rows, sampling, recent, draft
        self._laws: dict[int, Law] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i: int) -> Law:  # type: ignore[override]
        if not self._laws and i < len(self._draft) and shares_candidates(self._sampling, self._rows.shape[1]):
            self._laws = dict(enumerate(row_laws(self._rows[:len(self._draft)], self._sampling)))
        if i not in self._laws:
            recent = self._sampling.recent([*self._recent, *self._draft[:i]])
            self._laws[i] = probabilities(self._rows[i], self._sampling, recent)
        return self._laws[i]
