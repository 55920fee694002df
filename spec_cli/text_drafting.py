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

from spec_cli.drafters import ContextDrafter, Draft, next_draft_token
from spec_cli.llama import Context, Model, common_prefix
from spec_cli.sampling import Law, SamplingParams, probabilities, sample
from spec_cli.spelling import Speller, incomplete_tail

LOOK_BEHIND = 2  # aligned points re-spelt behind the end of the text each round: where tokens may merge
STEPS_PER_TOKEN = 2  # the most draft steps a greedy round takes per target token it asks for


class Translation:
    """A target's and a draft's vocabularies side by side: both `Speller`s, and the shared tokens, those
    whose text is a single token in both (the draft's id and the target's, pairwise)."""

    def __init__(self, target: Model, draft: Model) -> None:
        self.target, self.draft = Speller(target), Speller(draft)
        by_text: dict[bytes, int] = {}
        for token in range(len(self.target.pieces) - 1, -1, -1):  # the lowest id wins
            piece = self.target.pieces[token]
            if piece and not self.target.control[token]:
                by_text[piece] = token
        for byte, token in self.target.byte_tokens.items():
            spelt = self.target.spell(bytes([byte]))  # "a": the target's own letter, not its <0x61> fallback
            by_text[bytes([byte])] = spelt[0] if len(spelt) == 1 else token
        pairs = [(d, by_text[piece]) for d, piece in enumerate(self.draft.pieces)
                 if not self.draft.control[d] and piece in by_text]
        self.shared_draft = np.array([d for d, _ in pairs], dtype=np.int64)
        self.shared_target = np.array([t for _, t in pairs], dtype=np.int64)
        self._shared_index = np.full(len(self.draft.pieces), -1)  # by draft id: its shared index, -1 for none
        self._shared_index[self.shared_draft] = np.arange(self.shared_draft.size)
        self._targets, self._rank = np.unique(self.shared_target, return_inverse=True)

    def to_draft(self, tokens: Sequence[int], at_start: bool) -> tuple[list[int], list[tuple[int, int]], bytes]:
        """The draft's tokens for the text of target `tokens`, the aligned points (i, j) where target
        tokens[:i] and draft tokens[:j] spell the same bytes, and the bytes held back: an incomplete
        character at the end, which no tokenizer can spell until it is whole.

        The target's BOS becomes the draft's (at the start, where its tokenizer would add it); its other
        control tokens become their text, which the draft parses as its own control token where it has one
        of that text (ChatML's markers in both) and spells plainly where not."""
        target, draft = self.target, self.draft
        out = [draft.bos] if at_start and draft.add_bos else []
        aligned: list[tuple[int, int]] = []
        run = bytearray()
        ends: list[tuple[int, int]] = []  # (byte offset in the run, target tokens so far) at each token's end

        def flush(held: int = 0) -> None:
            data = bytes(run[:len(run) - held])
            spelt = draft.spell(data)
            offset, at = 0, {}
            for j, token in enumerate(spelt):
                piece = draft.pieces[token]
                if data[offset:offset + len(piece)] != piece:
                    break  # the draft cannot spell this text: aligned no further
                offset += len(piece)
                at[offset] = len(out) + j + 1
            aligned.extend((i, at[end]) for end, i in ends if end in at)
            out.extend(spelt)
            run.clear()
            ends.clear()

        for i, token in enumerate(tokens, start=1):
            if token == target.bos or target.control[token]:
                flush()
                if token != target.bos:
                    out.extend(draft.spell_control(target.pieces[token]))
                aligned.append((i, len(out)))
            else:
                run.extend(target.pieces[token])
                ends.append((len(run), i))
        held = incomplete_tail(bytes(run))
        tail = bytes(run[len(run) - held:])
        flush(held)
        return out, aligned, tail

    def shared_law(self, q: Law | np.ndarray) -> Law | None:
        """q restricted to the shared tokens and renormalised, as a law over shared indices, or None when it puts
        no mass there."""
        q = Law.of(q)
        if q.tokens is None:
            law = Law(q.probs[self.shared_draft])
        else:
            index = self._shared_index[q.tokens]
            law = Law(q.probs[index >= 0], index[index >= 0], self.shared_draft.size)
        mass = law.probs.sum()
        return Law(law.probs / mass, law.tokens, law.size) if mass > 0 else None

    def over_target(self, law: Law) -> Law:
        """A law over shared indices as a distribution over the target's vocabulary (zero elsewhere); draft tokens
        of the same text add up on their one target token."""
        size = len(self.target.pieces)
        if law.tokens is None:
            return Law(np.bincount(self._rank, weights=law.probs, minlength=self._targets.size), self._targets, size)
        ranks, merged = np.unique(self._rank[law.tokens], return_inverse=True)
        return Law(np.bincount(merged, weights=law.probs), self._targets[ranks], size)


class TextDrafter(ContextDrafter):
    """Drafts with a model of another vocabulary (see the module notes), on its own KV cache.

    `aligned` holds (i, j): target tokens[:i] spell what draft tokens[:j] spell. Each round re-spells the
    text from the aligned point `LOOK_BEHIND` points behind the last still valid, so that a word the target
    finished in two tokens reads as the draft would spell it; the draft's memory keeps its common prefix.
    """

    def __init__(self, context: Context, translation: Translation, p_min: float = 0.0) -> None:
        super().__init__(context, p_min)
        self.translation = translation
        self._seen: list[int] = []  # the target tokens the draft's text spells (and `_tail`)
        self._valid = 0  # how many of them are still the sequence's
        self._draft: list[int] = []
        self._aligned: list[tuple[int, int]] = [(0, 0)]
        self._tail = b""

    def prefill(self, tokens: Sequence[int]) -> list[tuple[int, float]]:
        self._valid = common_prefix(self._seen, tokens)
        self._sync(tokens)
        return self._take_in(self._draft)

    def pending(self, tokens: Sequence[int]) -> int:
        """About how many tokens the next proposal feeds before its first draft step (its catch-up): the
        target's new tokens, and what the draft's memory lacks of the text it already has."""
        return len(tokens) - self._valid + len(self._draft) - min(self.context.n_past, len(self._draft))

    def propose(self, tokens: Sequence[int], k: int, sampling: SamplingParams,
                rng: np.random.Generator) -> Draft:
        started = time.perf_counter()
        same = self._sync(tokens)
        keep = min(same, self.context.n_past)
        keep += common_prefix(self.context.tokens[keep:], self._draft[keep:])
        self.context.trim(min(keep, len(self._draft) - 1))  # the last token is fed again for its logits
        draft = Draft(convert_s=time.perf_counter() - started)
        catch_up = self._draft[self.context.n_past:]
        if sampling.greedy:
            self._draft_text(draft, catch_up, k, sampling, rng)
        elif not self._tail:  # a half-written character: the next round drafts after it
            self._draft_shared(draft, catch_up, k, sampling, rng)
        return draft

    def update(self, drafted: int, accepted: int) -> None:
        pass

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

    def _step(self, i: int, fed: list[int], draft: Draft) -> np.ndarray:
        """Feed step i's tokens (the catch-up first, which is final; then the last drafted token) and return
        the logits of the next."""
        started = time.perf_counter()
        logits = self.context.decode(fed, 1, n_final=len(fed) if i == 0 else 0)[0]
        draft.steps.append((len(fed), time.perf_counter() - started))
        return logits

    def _draft_text(self, draft: Draft, fed: list[int], k: int, sampling: SamplingParams,
                    rng: np.random.Generator) -> None:
        """Greedy: draft until the draft's text spells k target tokens or the steps run out. The k-th may be
        the start of a longer token the next draft step would have finished; waiting for that step (to see
        the k-th token end) cost more than it saved: on Gemma 3 270M drafted by SmolLM2 it kept acceptance
        at 64% and took the pair from 0.87x to 0.64x of the target alone. The text must begin with the
        held-back bytes to count."""
        speller, tail = self.translation.draft, self._tail
        recent = sampling.recent(self._draft)
        text = b""
        for i in range(STEPS_PER_TOKEN * k):
            choice = next_draft_token(self._step(i, fed, draft), sampling, recent, rng, self.p_min)
            if choice is None or speller.control[choice[0]]:
                break
            started = time.perf_counter()
            token = choice[0]
            text += speller.pieces[token]
            if not text.startswith(tail[:len(text)]):
                break  # it did not finish the target's character: nothing it drafts can follow the text
            body = text[len(tail):]
            draft.tokens = self.translation.target.spell(body[:len(body) - incomplete_tail(body)])
            draft.convert_s += time.perf_counter() - started
            if len(draft.tokens) >= k:
                break
            recent = sampling.recent([*recent, token])
            fed = [token]
        del draft.tokens[k:]

    def _draft_shared(self, draft: Draft, fed: list[int], k: int, sampling: SamplingParams,
                      rng: np.random.Generator) -> None:
        """Sampled: each step draws from the draft's q restricted to the shared tokens (see the module notes)
        and hands the target its token and that law over the target's vocabulary."""
        translation = self.translation
        recent = sampling.recent(self._draft)
        for i in range(k):
            q = probabilities(self._step(i, fed, draft), sampling, recent)
            started = time.perf_counter()
            law = translation.shared_law(q)
            if law is None or law.max() < self.p_min:
                break
            pick = sample(law, rng)
            draft.tokens.append(int(translation.shared_target[pick]))
            draft.q.append(translation.over_target(law))
            draft.convert_s += time.perf_counter() - started
            token = int(translation.shared_draft[pick])
            recent = sampling.recent([*recent, token])
            fed = [token]
