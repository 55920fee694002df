"""Constraints on llguidance (the engine behind Guidance, and llama.cpp's `LLAMA_LLGUIDANCE`) over a llama.cpp
vocabulary: which tokens a grammar allows next, and its state advanced token by token.

A grammar is any text llguidance takes: GBNF as llama.cpp writes it, a Lark grammar, or llguidance's own JSON
grammar (what `structured` makes from a JSON schema). `Constraints` holds what costs: llguidance's
view of the vocabulary (every token's bytes, built once per model) and each grammar compiled over it (its
lexer and parser tables), kept by the grammar's hash so that a schema sent again costs a copy. A `Grammar` is
one state of one compiled grammar; the laws themselves are ours (`decoding.constrained`).

The mask is the whole vocabulary's (llguidance computes it in tens of µs), kept per point of a trie of the
tokens accepted since the start (`_Point`): the draft's q and the target's p at one position ask once, and so
do the rounds that draft again from a position after a rejection. The end-of-generation tokens are allowed
exactly where the grammar is complete.
"""

from __future__ import annotations

import collections
import hashlib
import json
import re
import threading
import warnings

import llguidance
import numpy as np
from llguidance.llamacpp import lltokenizer_from_vocab

from spec_cli.errors import SpecError
from spec_cli.llama.model import Model

KEPT_GRAMMARS = 64  # compiled grammars kept per model, the least recently used dropped first
GBNF_RULE = re.compile(r"^\s*[\w-]+\s*::=", re.MULTILINE)
GBNF_ROOT = re.compile(r"^\s*root\s*::=", re.MULTILINE)
ROW_ITEMS = 10_000  # llguidance's max_items_in_row (default 2,000)


class GrammarError(SpecError):
    """A grammar llguidance cannot use: `reason` says why, on one line."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"the grammar {reason}")


def llguidance_grammar(text: str) -> str:
    """`text` as llguidance's grammar: its own JSON grammar as it is, GBNF or Lark converted (both are read
    by llguidance's converter, which tells them apart)."""
    if text.lstrip().startswith("{"):
        return text
    if GBNF_RULE.search(text) and not GBNF_ROOT.search(text):
        raise GrammarError("does not parse: a GBNF grammar starts at its 'root' rule, and this one has none")
    try:
        return llguidance.grammar_from("grammar", text)
    except ValueError as exc:
        reason = str(exc).removeprefix("Failed to convert the grammar from GBNF to Lark: ")
        raise GrammarError(f"does not parse: {one_line(reason)}") from None


def check(grammar: str) -> None:
    """GrammarError unless llguidance can compile `grammar` (llguidance's JSON grammar): its syntax, regexes
    and schema need no vocabulary, so a face can refuse a grammar before any model loads."""
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, None, limits=_limits())
    if failed:
        raise GrammarError(f"does not parse: {one_line(messages[0])}")


def one_line(message: str) -> str:
    """llguidance's message on one line: without the grammar's lines it quotes below it (`  3 | start: …`)
    and the carets that point into them."""
    kept = []
    for line in message.splitlines():
        if re.match(r"\s*\d+ \|", line):
            break
        kept.append(line.replace("^", ""))
    return " ".join(" ".join(kept).split())


def _limits() -> llguidance.LLParserLimits:
    """llguidance's bounds on a step's work, but for the items of a parser row: a schema of 900 optional
    properties needs 3,607 at its first key (llguidance's default allows 2,000), and costs under 10 ms a mask
    there. Errors without the parser's state: they are read by clients."""
    return llguidance.LLParserLimits(max_items_in_row=ROW_ITEMS, verbose_errors=False)


class Constraints:
    """llguidance's view of one model's vocabulary and the grammars compiled over it. Thread-safe: the server
    compiles off its generation worker (`compile`), and the worker takes the compiled start (`start`)."""

    def __init__(self, model: Model, kept: int = KEPT_GRAMMARS) -> None:
        self._model, self._kept = model, kept
        self._lock = threading.Lock()
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._compiled: collections.OrderedDict[str, llguidance.LLMatcher] = collections.OrderedDict()

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        """Every token's bytes as llguidance reads them, built once (0.3 s at 49k tokens)."""
        with self._lock:
            if self._tokenizer is None:
                ends = [int(t) for t in self._model.end_of_generation_tokens]
                with warnings.catch_warnings():  # the bridge asks llama-cpp-python's deprecated name, per token
                    warnings.simplefilter("ignore", DeprecationWarning)
                    self._tokenizer = lltokenizer_from_vocab(self._model.vocab, n_vocab=self._model.n_vocab,
                                                             eos_token=ends or None)
            return self._tokenizer

    def __contains__(self, text: str) -> bool:
        """Whether `text` is compiled and kept."""
        with self._lock:
            return _key(text) in self._compiled

    def compile(self, text: str) -> None:
        """Compile `text` (any grammar `llguidance_grammar` takes) over the vocabulary, or find it compiled;
        GrammarError when it does not compile or allows no token at its start."""
        self._matcher(text)

    def start(self, text: str) -> Grammar:
        """The start state of `text` over the vocabulary (compiled now unless it is kept)."""
        matcher = self._matcher(text)
        return Grammar(matcher.deep_copy(), self._model.n_vocab, _Point())

    def _matcher(self, text: str) -> llguidance.LLMatcher:
        """The compiled start of `text`: the one kept, else compiled now and kept."""
        key = _key(text)
        with self._lock:
            matcher = self._compiled.get(key)
            if matcher is not None:
                self._compiled.move_to_end(key)
                return matcher
        matcher = llguidance.LLMatcher(self.tokenizer, llguidance_grammar(text), log_level=0, limits=_limits())
        if matcher.is_error():
            raise GrammarError(f"does not parse: {one_line(matcher.get_error())}")
        if not _mask(matcher, self._model.n_vocab).any() or matcher.is_error():
            raise GrammarError("allows no token of the model's vocabulary at its start: it asks for text that no "
                               "token can spell")
        with self._lock:
            self._compiled[key] = matcher
            while len(self._compiled) > self._kept:
                self._compiled.popitem(last=False)
        return matcher


def _key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()


class _Point:
    """Where a sequence of accepted tokens leads: the points after one more token, and the whole vocabulary's
    mask here (and the ids it allows) once asked for. Points behind every live state are freed with them."""

    __slots__ = ("after", "mask", "ids")

    def __init__(self) -> None:
        self.after: dict[int, _Point] = {}
        self.mask: np.ndarray | None = None
        self.ids: np.ndarray | None = None

    def next(self, token: int) -> _Point:
        point = self.after.get(token)
        if point is None:
            point = self.after[token] = _Point()
        return point


class Grammar:
    """One state of a compiled grammar over a model's vocabulary."""

    def __init__(self, matcher: llguidance.LLMatcher, n_vocab: int, point: _Point) -> None:
        self._matcher, self._n_vocab, self._point = matcher, n_vocab, point

    def mask(self) -> np.ndarray:
        """Whether each token of the vocabulary is allowed next (kept for every state at this point)."""
        point = self._point
        if point.mask is None:
            point.mask = _mask(self._matcher, self._n_vocab)
            if self._matcher.is_error():
                raise GrammarError(f"failed while generating: {one_line(self._matcher.get_error())}")
        return point.mask

    def allowed_tokens(self) -> np.ndarray:
        """The ids the grammar allows next, ascending (kept with the mask)."""
        point = self._point
        if point.ids is None:
            point.ids = np.flatnonzero(self.mask())
        return point.ids

    def allows(self, token: int) -> bool:
        return bool(self.mask()[token])

    def accept(self, token: int) -> None:
        """Advance past `token`. One the grammar does not allow is refused here: llguidance would fall into an
        error state it never leaves."""
        if not self.allows(token):
            raise ValueError(f"the grammar does not allow token {token} here")
        self._advance(token)

    def clone(self) -> Grammar:
        return Grammar(self._matcher.deep_copy(), self._n_vocab, self._point)

    def after(self, token: int) -> Grammar | None:
        """A clone advanced past `token`, or None when the grammar does not allow it (asked once)."""
        if not self.allows(token):
            return None
        state = self.clone()
        state._advance(token)
        return state

    def _advance(self, token: int) -> None:
        self._matcher.consume_token(token)
        self._point = self._point.next(token)


def _mask(matcher: llguidance.LLMatcher, n_vocab: int) -> np.ndarray:
    """The matcher's next-token bitmask as one bool per token."""
    words = np.zeros((n_vocab + 31) // 32, dtype=np.uint32)
    matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
    return np.unpackbits(words.view(np.uint8), count=n_vocab, bitorder="little").view(bool)



def spelt(model: Model, text: str) -> str:
    """`text` as a Lark grammar writes it for `model`: each of the model's control tokens in it as itself
    (`<[id]>`: no plain text spells a control token, and a model writes its markers as them: Mistral's
    `[TOOL_CALLS]`, LFM2's `<|tool_call_start|>`, gpt-oss's channels), the text between as quoted strings."""
    parts, rest = [], text
    for token in model.tokenize(text, add_special=False):
        if not model.is_control(token):
            continue
        marker = model.piece(token, special=True).decode("utf-8", errors="replace")
        before, found, rest = rest.partition(marker)
        parts += [json.dumps(before)] if before else []
        parts += [f"<[{token}]>"] if found else []
    parts += [json.dumps(rest)] if rest else []
    return " ".join(parts)
