"""llama.cpp's grammar sampler (GBNF) through the low-level API: which tokens a grammar allows next, and its
state advanced token by token, so that a grammar means exactly what it means to llama.cpp.

The sampler is used as a mask and nothing else: `allowed` hands it a candidate array of token ids and reads
back which it left finite; the laws themselves are ours (`decoding.constrained`). A state is cloned where a
round needs one per drafted position (`llama_sampler_clone` copies the parse stacks).

llama.cpp aborts the process when a grammar accepts a token it does not allow (an end-of-generation token
before the grammar is complete): `accept` is only ever called on a token `allowed` passed.
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


class Grammar:
    """One state of a grammar sampler over a model's vocabulary."""

    def __init__(self, handle: int) -> None:
        self._handle = handle

    @classmethod
    def compile(cls, model: Model, gbnf: str, root: str = "root") -> Grammar:
        """The grammar's start state over `model`'s vocabulary; GrammarError when it does not parse."""
        return cls(_parse(model.vocab, gbnf, root))

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
        """Advance past `token`, which `allowed` must have passed."""
        llama_cpp.llama_sampler_accept(self._handle, token)

    def clone(self) -> Grammar:
        return Grammar(llama_cpp.llama_sampler_clone(self._handle))

    def after(self, tokens: list[int]) -> Grammar:
        """A clone advanced past `tokens`, each of which the grammar must allow."""
        state = self.clone()
        for token in tokens:
            state.accept(token)
        return state

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
