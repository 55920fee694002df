"""Drafting with a model whose vocabulary is not the target's: through text, exactly.

The target's token ids are the only truth. The draft model reads the text the target's tokens spell (its
own tokens for it, re-spelt only from a short look-behind at the end each round), drafts in its own
vocabulary, and its drafts become *target* tokens before the target sees them, so verification runs on
target tokens with the existing rules and a conversion mistake can only cost acceptance, never exactness.

- Greedy: the draft's text is spelt in target tokens; the target keeps the longest prefix it would have
  chosen itself, then its own token (exact by construction).
- Sampled: token-level intersection (TLI; Timor et al., "Accelerating LLM Inference with Lossless
  Speculative Decoding Algorithms for Heterogeneous Vocabularies", ICML 2025, arXiv 2502.05202). Only tokens
  whose text is one token in both vocabularies are drafted: the draft's q, restricted to them and
  renormalised, *is* a distribution over target tokens, so each drafted token x_i is drawn from a known
  q_i(x) over the target's vocabulary, and the rejection-sampling and block-verification rules keep the
  output distributed as the target's p, as they do for any q. (Spelling the draft's text in target tokens
  has no such q: its law over target tokens is unknown, so sampled rounds do not use it.)
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from spec_cli.decoding.drafter import Draft
from spec_cli.decoding.sampling import SamplingParams, probabilities, sample
from spec_cli.drafting.base import Choose, ContextDrafter, draft_step_by_step, next_draft_token
from spec_cli.drafting.spelling import incomplete_tail
from spec_cli.drafting.translation import Translation
from spec_cli.drafting.window import MIN_WINDOW, DraftMemory
from spec_cli.llama.context import Context, common_prefix
from spec_cli.llama.grammar import Grammar

LOOK_BEHIND = 2  # aligned points re-spelt behind the end of the text each round: where tokens may merge
STEPS_PER_TOKEN = 2  # the most draft steps a greedy round takes per target token it asks for


class TextDrafter(ContextDrafter):
    """Drafts with a model of another vocabulary (see the module notes), on its own KV cache.

    `aligned` holds (i, j): target tokens[:i] spell what draft tokens[:j] spell. Each round re-spells the
    text from the aligned point `LOOK_BEHIND` points behind the last still valid, so that a word the target
    finished in two tokens reads as the draft would spell it; the draft's memory keeps its common prefix.
    """

    def __init__(self, context: Context, translation: Translation, p_min: float = 0.0,
                 memory: DraftMemory | None = None) -> None:
        super().__init__(context, p_min, memory)
        self.translation = translation
        self._seen: list[int] = []  # the target tokens the draft's text spells (and `_tail`)
        self._valid = 0  # how many of them are still the sequence's
        self._draft: list[int] = []
        self._aligned: list[tuple[int, int]] = [(0, 0)]
        self._tail = b""

    def start(self, tokens: Sequence[int]) -> None:
        """Only what the text already spelt of `tokens` stays valid; the first proposal re-spells the rest and
        its catch-up feeds it."""
        self._valid = common_prefix(self._seen, tokens)

    def pending(self, tokens: Sequence[int]) -> int:
        """About how many tokens the next proposal feeds before its first draft step (its catch-up): the
        target's new tokens, and what the draft's memory lacks of the text it already has; a long backlog is
        spelt first, to be measured within its window."""
        held = self.memory.window.held(len(self._draft))
        about = len(tokens) - self._valid + held - min(self.context.n_past, held)
        if about <= MIN_WINDOW:
            return about
        self._resync(tokens)
        return self.memory.lacking(self._draft)

    def _feed(self, tokens: Sequence[int], n: int) -> list[tuple[int, float]]:
        self._resync(tokens)
        return self.memory.feed(self._draft, n)

    def narrow(self, tokens: Sequence[int]) -> None:
        self._resync(tokens)
        self.memory.narrow(self._draft)

    def _resync(self, tokens: Sequence[int]) -> None:
        """Make the draft's text spell `tokens`, and its memory keep what it holds of that text but the last token
        (which a round feeds again for its logits)."""
        same, window = self._sync(tokens), self.memory.window
        if same < window.start and not window.fits(self._draft):  # the text changed where the window skips it
            self.memory.rewind(same)
        keep = min(window.held(same), self.context.n_past)
        keep += common_prefix(self.context.tokens[keep:], window.tail(self._draft, keep))
        self.context.trim(min(keep, window.held(len(self._draft)) - 1))

    def propose(self, tokens: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator,
                grammar: Grammar | None = None) -> Draft:
        """Under a grammar the draft is spelt as without one: its vocabulary is not the grammar's, and the loop
        cuts the draft at its first token the grammar forbids."""
        started = time.perf_counter()
        self._resync(tokens)
        catch_up = self.memory.backlog(self._draft)
        synced_s = time.perf_counter() - started
        recent = sampling.recent(self._draft)
        if sampling.greedy:
            draft = draft_step_by_step(self._step, catch_up, STEPS_PER_TOKEN * k, sampling, recent,
                                       self._spelt_text(k, sampling, rng))
            del draft.tokens[k:]
        elif not self._tail:  # a half-written character: the next round drafts after it
            draft = draft_step_by_step(self._step, catch_up, k, sampling, recent, self._shared_token(sampling, rng))
        else:
            draft = Draft()
        draft.convert_s += synced_s
        return draft

    def rewind(self, n_keep: int) -> None:
        """Only `n_keep` target tokens are still the sequence's; the next round re-spells from there."""
        self._valid = min(self._valid, n_keep)

    def _sync(self, tokens: Sequence[int]) -> int:
        """Make `_draft` spell `tokens` (of which the first `_valid` are unchanged); return how many draft
        tokens stayed as they were."""
        last = len(self._aligned) - 1
        while self._aligned[last][0] > self._valid:
            last -= 1
        last = max(0, last - LOOK_BEHIND)
        i, j = self._aligned[last]
        spelt, aligned, self._tail = self.translation.to_draft(tokens[i:], at_start=i == 0)
        self._draft[j:] = spelt
        self._aligned[last + 1:] = [(i + a, j + b) for a, b in aligned]
        self._seen[:] = tokens
        self._valid = len(tokens)
        return j

    def _spelt_text(self, k: int, sampling: SamplingParams, rng: np.random.Generator) -> Choose:
        """Greedy: draft until the draft's text spells k target tokens or the steps run out. The k-th may be
        the start of a longer token the next draft step would have finished; waiting for that step (to see
        the k-th token end) cost more than it saved: on Gemma 3 270M drafted by SmolLM2 it kept acceptance
        at 64% and took the pair from 0.87x to 0.64x of the target alone. The text must begin with the
        held-back bytes to count."""
        speller, tail = self.translation.draft, self._tail
        text = b""

        def choose(draft: Draft, logits: np.ndarray, recent: list[int]) -> int | None:
            nonlocal text
            choice = next_draft_token(logits, sampling, recent, rng, self.p_min)
            if choice is None or speller.control[choice[0]]:
                return None
            started = time.perf_counter()
            token = choice[0]
            text += speller.pieces[token]
            if not text.startswith(tail[:len(text)]):
                return None  # it did not finish the target's character: nothing it drafts can follow the text
            body = text[len(tail):]
            draft.tokens = self.translation.target.spell(body[:len(body) - incomplete_tail(body)])
            draft.convert_s += time.perf_counter() - started
            return token if len(draft.tokens) < k else None
        return choose

    def _shared_token(self, sampling: SamplingParams, rng: np.random.Generator) -> Choose:
        """Sampled: each step draws from the draft's q restricted to the shared tokens (see the module notes)
        and hands the target its token and that law over the target's vocabulary."""
        translation = self.translation

        def choose(draft: Draft, logits: np.ndarray, recent: list[int]) -> int | None:
            q = probabilities(logits, sampling, recent)
            started = time.perf_counter()
            law = translation.shared_law(q)
            if law is None or law.max() < self.p_min:
                return None
            pick = sample(law, rng)
            draft.tokens.append(int(translation.shared_target[pick]))
            draft.q.append(translation.over_target(law))
            draft.convert_s += time.perf_counter() - started
            return int(translation.shared_draft[pick])
        return choose
