"""A reasoning budget: a thought closed after N tokens, as llama-server's `--reasoning-budget` closes it.

Once the thought has taken `tokens` tokens without writing its close marker, the next tokens are forced to
spell the marker (the target's own tokenization of it), and the answer goes on from there. The budget is a
constraint like a grammar (`Budgeted` is a `Grammar` state, over the request's grammar if it has one): p and q
are masked alike at every position, so the loop stays exact, and a thought drafted past its budget is cut
where the budget forbids, as every constrained draft is.

A thought is the answer's start when the prompt opened it (`open` None), or when the answer starts with the
template's open marker (Qwen3 lets the model decide).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spec_cli.llama.grammar import Grammar
from spec_cli.llama.model import Model


@dataclass(frozen=True)
class ReasoningBudget:
    """At most `tokens` tokens of thought, then the thought's `close` marker is forced (`Budgeted`); `open`: the
    marker that opens a thought the prompt did not (None: the prompt opened it). A request's field
    (`GenerationRequest.reasoning_budget`), defined here so that the loop's floor imports nothing above it."""

    tokens: int
    close: str = "</think>"
    open: str | None = None


class Budgeted(Grammar):
    """The state of a reasoning budget over `inner` (the request's grammar, or None): where the answer stands
    (before a thought may open, thinking, forced to close, after), the thought's tokens so far and the tail of
    its text a close marker may be ending in."""

    def __init__(self, inner: Grammar | None, budget: ReasoningBudget, model: Model) -> None:
        self._inner, self._budget, self._model = inner, budget, model
        self._phase = "thinking" if budget.open is None else "before"
        self._spent = 0
        self._text = b""  # the answer's text before a thought opens, or the thought's tail the close may end in
        self._forced: tuple[int, ...] = ()  # the close marker's tokens still to come
        self._free = np.ones(model.n_vocab, dtype=bool)  # the mask without an inner grammar, shared by clones

    def mask(self) -> np.ndarray:
        if self._forced:
            mask = np.zeros(self._model.n_vocab, dtype=bool)
            mask[self._forced[0]] = True
            return mask & self._inner.mask() if self._inner is not None else mask
        return self._inner.mask() if self._inner is not None else self._free

    def allowed_tokens(self) -> np.ndarray:
        if self._forced or self._inner is None:
            return np.flatnonzero(self.mask())
        return self._inner.allowed_tokens()

    def allows(self, token: int) -> bool:
        if self._forced:
            return token == self._forced[0] and (self._inner is None or self._inner.allows(token))
        return self._inner is None or self._inner.allows(token)

    def clone(self) -> Budgeted:
        twin = Budgeted.__new__(Budgeted)
        twin.__dict__.update(self.__dict__)
        twin._inner = self._inner.clone() if self._inner is not None else None
        return twin

    def _advance(self, token: int) -> None:
        """Past `token` (allowed: `accept` and `after` ask first): the inner grammar, then where the answer
        stands."""
        if self._inner is not None:
            self._inner.accept(token)
        budget = self._budget
        if self._forced:
            self._forced = self._forced[1:]
            self._phase = "thinking" if self._forced else "after"
            return
        if self._phase == "before":
            self._text += self._model.piece(token, special=True)
            start, opening = self._text.lstrip(), (budget.open or "").encode()
            if start.startswith(opening):
                self._phase, self._text = "thinking", start[len(opening):]
            elif not opening.startswith(start):
                self._phase = "after"
            return
        if self._phase != "thinking":
            return
        self._spent += 1
        close = budget.close.encode()
        tail = self._text[max(0, len(self._text) - len(close) + 1):]  # where a close may have begun: no rescan
        self._text = tail + self._model.piece(token, special=True)
        if close in self._text:
            self._phase = "after"
        elif self._spent >= budget.tokens:
            self._forced = tuple(self._model.tokenize(budget.close, add_special=False))
