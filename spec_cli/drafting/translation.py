"""Two vocabularies side by side: a target's and a draft's `Speller`, and the tokens whose text is a single
token in both, through which a draft of another vocabulary drafts sampled rounds exactly (`drafting.text`).
Pure functions of the two vocabularies: tests hammer them without running a model."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from spec_cli.decoding.sampling import Law
from spec_cli.drafting.spelling import Speller, incomplete_tail
from spec_cli.llama.model import Model


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
