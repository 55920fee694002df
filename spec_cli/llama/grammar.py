"""llama.cpp's grammar sampler (GBNF) through the low-level API: which tokens a grammar allows next, and its
state advanced token by token, so that a grammar means exactly what it means to llama.cpp.

The sampler is used as a mask and nothing else: `allowed` hands it a candidate array of token ids and reads
back which it left finite; the laws themselves are ours (`decoding.constrained`). A state is cloned where a
round needs one per drafted position (`llama_sampler_clone` copies the parse stacks).

The mask over the whole vocabulary is the one costly question (milliseconds at 50k tokens). It is asked of
the tokens that can be allowed at all: a token's piece is matched from its first byte on, so a token whose
first byte the grammar refuses (asked of the 256 one-byte tokens) is refused, and where few first bytes pass,
so is one whose first two bytes do not (`_Spelling`). At a JSON brace that leaves a few hundred of 50k. And a
state is fixed by the tokens accepted since the start, so the states of one grammar share a trie of those
tokens (`_Point`) that keeps each mask: the draft's q and the target's p at one position ask once, and so do
the rounds that draft again from a position after a rejection.

llama.cpp aborts the process when a grammar accepts a token it does not allow (an end-of-generation token
before the grammar is complete): `accept` refuses such a token first.
"""

from __future__ import annotations

import ctypes
import os
import re
import tempfile
import threading

import llama_cpp
import numpy as np

from spec_cli.errors import SpecError
from spec_cli.llama.model import Backend, Model

TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])  # llama_token_data
assert TOKEN_DATA.itemsize == ctypes.sizeof(llama_cpp.llama_token_data)

_stderr_lock = threading.Lock()


class GrammarError(SpecError):
    """A grammar llama.cpp cannot parse: `reason` says why, in llama.cpp's words."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"the grammar {reason}")


class _Point:
    """Where a sequence of accepted tokens leads: the points after one more token, and the whole vocabulary's
    mask here once it has been asked for. Points behind every live state are freed with them."""

    __slots__ = ("after", "mask")

    def __init__(self) -> None:
        self.after: dict[int, _Point] = {}
        self.mask: np.ndarray | None = None

    def next(self, token: int) -> _Point:
        point = self.after.get(token)
        if point is None:
            point = self.after[token] = _Point()
        return point


SECOND_BYTE_AT_MOST = 8  # first bytes allowed at most for their second bytes to be asked (256 questions each)


class _Spelling:
    """A vocabulary sorted by how its pieces start: each token's first two bytes, the token that spells each
    byte alone (−1 where none does), and the end-of-generation tokens (which the grammar judges apart)."""

    def __init__(self, model: Model) -> None:
        self.starts = model.piece_starts
        single = np.flatnonzero((self.starts[:, 0] >= 0) & (self.starts[:, 1] < 0))
        self.byte_token = np.full(256, -1, dtype=np.int64)
        self.byte_token[self.starts[single[::-1], 0]] = single[::-1]  # the lowest id where several spell a byte
        self.end_tokens = model.end_of_generation_tokens
        self.begins = np.zeros(256, dtype=bool)  # bytes some piece begins with
        self.begins[self.starts[self.starts[:, 0] >= 0, 0]] = True

    def candidates(self, state: Grammar) -> np.ndarray:
        """Every token `state` may allow: the end-of-generation tokens, and those whose first bytes it takes
        one by one (a byte with no token of its own to ask about is taken as allowed)."""
        first = self._bytes_taken(state)
        fits = first[self.starts[:, 0]] & (self.starts[:, 0] >= 0)
        if np.count_nonzero(first & self.begins) <= SECOND_BYTE_AT_MOST:
            pairs = np.zeros((256, 256), dtype=bool)
            for byte in np.flatnonzero(first & self.begins):
                after = state.after(int(self.byte_token[byte])) if self.byte_token[byte] >= 0 else None
                pairs[byte] = self._bytes_taken(after) if after is not None else True
            second = self.starts[:, 1]
            fits &= (second < 0) | pairs[self.starts[:, 0], second]
        fits[self.end_tokens] = True
        return np.flatnonzero(fits)

    def _bytes_taken(self, state: Grammar) -> np.ndarray:
        known = self.byte_token >= 0
        taken = ~known
        taken[known] = state.allowed(self.byte_token[known])
        return taken


class Grammar:
    """One state of a grammar sampler over a model's vocabulary."""

    def __init__(self, handle: int, spelling: _Spelling, point: _Point) -> None:
        self._handle, self._spelling, self._point = handle, spelling, point

    @classmethod
    def compile(cls, model: Model, gbnf: str, root: str = "root") -> Grammar:
        """The grammar's start state over `model`'s vocabulary; GrammarError when it does not parse."""
        return cls(_parse(model.vocab, gbnf, root), _Spelling(model), _Point())

    def mask(self) -> np.ndarray:
        """Whether each token of the vocabulary is allowed next (kept for every state at this point)."""
        point = self._point
        if point.mask is None:
            candidates = self._spelling.candidates(self)
            point.mask = np.zeros(len(self._spelling.starts), dtype=bool)
            point.mask[candidates] = self.allowed(candidates)
        return point.mask

    @property
    def mask_known(self) -> bool:
        return self._point.mask is not None

    def allowed(self, ids: np.ndarray) -> np.ndarray:
        """For each token id of `ids`, whether the grammar allows it next (an end-of-generation token only once
        the grammar is complete)."""
        data = np.zeros(len(ids), dtype=TOKEN_DATA)
        data["id"] = ids
        array = llama_cpp.llama_token_data_array(
            data=data.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)), size=len(ids), selected=-1,
            sorted=False)
        llama_cpp.llama_sampler_apply(self._handle, ctypes.byref(array))
        return np.isfinite(data["logit"])

    def allows(self, token: int) -> bool:
        return bool(self.allowed(np.array([token]))[0])

    def accept(self, token: int) -> None:
        """Advance past `token`. One the grammar does not allow is refused here: llama.cpp would abort the
        process."""
        if not self.allows(token):
            raise ValueError(f"the grammar does not allow token {token} here")
        self._advance(token)

    def clone(self) -> Grammar:
        return Grammar(llama_cpp.llama_sampler_clone(self._handle), self._spelling, self._point)

    def after(self, token: int) -> Grammar | None:
        """A clone advanced past `token`, or None when the grammar does not allow it (asked once)."""
        if not self.allows(token):
            return None
        state = self.clone()
        state._advance(token)
        return state

    def _advance(self, token: int) -> None:
        llama_cpp.llama_sampler_accept(self._handle, token)
        self._point = self._point.next(token)

    def close(self) -> None:
        if self._handle:
            llama_cpp.llama_sampler_free(self._handle)
            self._handle = None

    def __del__(self) -> None:
        self.close()


def check(gbnf: str, root: str = "root") -> None:
    """GrammarError unless `gbnf` parses: its syntax needs no vocabulary, so a face can refuse a grammar
    before any model loads. Token references (`<[id]>`, `<|name|>`) need one: they are left to `compile`."""
    try:
        llama_cpp.llama_sampler_free(_parse(None, gbnf, root))
    except GrammarError as exc:
        if "no vocab to parse token" not in exc.reason:
            raise


def _parse(vocab: llama_cpp.llama_vocab_p | None, gbnf: str, root: str) -> int:
    """A grammar sampler's handle; GrammarError with llama.cpp's reason when `gbnf` does not parse.

    llama.cpp writes a syntax error to the process's stderr, not to its log (where its other reasons go),
    so that file descriptor is read for the moment the grammar is parsed."""
    Backend.ensure()
    Backend.forget()
    with _stderr_lock, tempfile.TemporaryFile() as caught:
        saved = os.dup(2)
        os.dup2(caught.fileno(), 2)
        try:
            handle = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode("utf-8"), root.encode("utf-8"))
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        caught.seek(0)
        said = caught.read().decode("utf-8", errors="replace")
    if not handle:
        found = re.search(r"error parsing grammar: (.*)", said)
        reason = found.group(1).strip() if found else Backend.message("llama.cpp refused it")
        raise GrammarError(f"does not parse: {reason}")
    return handle
