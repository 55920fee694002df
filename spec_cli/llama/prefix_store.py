"""Prompts that stay warm: the states of finished sequences kept in host RAM, for a request that lands on
another slot (or comes back after its own slot moved on) to start from, as llama-server's `--cache-ram`.

Agents resend a long system prompt and tools list with every call. A slot remembers only its own last
conversation; the store remembers the last states of every slot (the target's and the draft's memory, whole:
KV cache and recurrent state), bounded in bytes and evicted least recently used. A request takes the entry
that shares the longest prefix with its tokens when that beats what its slot already holds; an attention
memory is then cut back to the shared prefix, and a memory that cannot be cut (recurrent, hybrid, sliding
window) is used only when the entry is a prefix of the request whole (a conversation's next turn). A sequence
that keeps hidden states or features beside its memory (MTP, EAGLE-3, DFlash targets) is neither saved nor
loaded: a state does not carry them.
"""

from __future__ import annotations

import collections
import ctypes
import threading
from dataclasses import dataclass
from typing import Sequence

from spec_cli.llama.context import Context, common_prefix
from spec_cli.llama.memory import ATTENTION

MIN_TOKENS = 64  # shorter sequences are cheaper to prefill again than to keep
MIN_GAIN = 16  # an entry must give this many tokens more than the slot holds to be worth loading


@dataclass
class _Entry:
    """The states of one slot's contexts (target first) and the tokens each held."""

    states: list[tuple[ctypes.Array[ctypes.c_uint8], int, tuple[int, ...]]]

    @property
    def tokens(self) -> tuple[int, ...]:
        return self.states[0][2]

    @property
    def size(self) -> int:
        return sum(size for _, size, _ in self.states)


class PrefixStore:
    """Saved sequence states, at most `limit` bytes of them; `hits` counts the requests that started from one."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.hits = 0
        self._entries: collections.OrderedDict[tuple[int, ...], _Entry] = collections.OrderedDict()
        self._lock = threading.Lock()  # the worker changes the entries while /health reads them

    @property
    def used(self) -> int:
        with self._lock:
            return sum(entry.size for entry in self._entries.values())

    def save(self, contexts: Sequence[Context]) -> None:
        """Keep the states of a slot's `contexts` (target first); an entry whose tokens they extend is replaced,
        and the least recently used go until the store fits its limit."""
        target = contexts[0]
        if target.n_past < MIN_TOKENS or not all(context.portable for context in contexts):
            return
        tokens = tuple(target.tokens)
        with self._lock:
            for held in [held for held in self._entries if tokens[:len(held)] == held]:
                del self._entries[held]
        entry = _Entry([(*context.saved_state(), tuple(context.tokens)) for context in contexts])
        if entry.size > self.limit:
            return
        with self._lock:
            self._entries[tokens] = entry
            while sum(held.size for held in self._entries.values()) > self.limit:
                self._entries.popitem(last=False)

    def load(self, contexts: Sequence[Context], tokens: Sequence[int]) -> int:
        """Load into a slot's `contexts` the entry that gives `tokens` the longest prefix, when it beats what
        the target holds by `MIN_GAIN`; return the prefix it gives (0: nothing loaded)."""
        target = contexts[0]
        if not all(context.portable for context in contexts):
            return 0
        held = common_prefix(target.tokens, tokens)
        best, gain = None, held + MIN_GAIN
        for entry in self._entries.values():
            usable = _usable(target, entry.tokens, tokens)
            if usable >= gain:
                best, gain = entry, usable
        if best is None:
            return 0
        with self._lock:
            self._entries.move_to_end(best.tokens)
        for context, (buffer, size, held_tokens) in zip(contexts, best.states):
            context.load_state(buffer, size, held_tokens)
        self.hits += 1
        return gain

    def report(self) -> dict[str, object]:
        """What /health says of the store."""
        used = self.used
        return {"entries": len(self._entries), "used_mib": round(used / 2**20, 1),
                "limit_mib": round(self.limit / 2**20, 1), "hits": self.hits}


def _usable(target: Context, held: Sequence[int], tokens: Sequence[int]) -> int:
    """The prefix of `tokens` an entry holding `held` gives a target of this kind of memory."""
    shared = common_prefix(held, tokens)
    if target.memory.kind == ATTENTION or shared == len(held):
        return shared
    return 0
