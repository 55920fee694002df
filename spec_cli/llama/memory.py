"""How a context's memory goes back to an earlier position: one strategy per context, chosen when it is made.

Part of the `llama` wing, the adapter over llama.cpp (the only wing that imports `llama_cpp`). Speculative
decoding keeps the first n tokens of a sequence and forgets the rest after every round; chat turns and
prompt reuse cut back further. What that takes depends on what llama.cpp keeps per sequence:

- **attention** KV cache: one cell per position; `llama_memory_seq_rm` removes the tail.
- **sliding window** (Gemma 2/3, …): the same, but cells that left the window are pruned once the cache
  wraps. A cut inside the last rounds is always served (a batch only prunes cells its first token no
  longer sees); a cut far back is checked against the oldest cell still held.
- **recurrent** (Mamba, RWKV) and **hybrid** (attention + recurrent layers: LFM2, Jamba, Qwen3.5 …): the
  state folds in every token and cannot drop a tail. For some architectures llama.cpp keeps the states of
  the last `n_rs_seq` tokens of a batch and rolls back *in place*; otherwise the recurrent part is saved
  before a decode whose tail may be rejected, restored afterwards, and the kept tokens are replayed.

Snapshots hold only what cannot be cut (`LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY`: the recurrent or
sliding-window part); the attention part of a hybrid is cut as usual after a restore. Two are kept: one
before the current round's speculative decode, one at the end of the last prompt (so a chat turn that
rewrites earlier text replays from there instead of from the start).
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass

import llama_cpp

from spec_cli.errors import SpecError

ATTENTION, SLIDING_WINDOW, RECURRENT, HYBRID = "attention", "sliding window", "recurrent", "hybrid"
KINDS = (ATTENTION, SLIDING_WINDOW, RECURRENT, HYBRID)
_PARTIAL = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY


def memory_kind(model: llama_cpp.llama_model_p, n_swa: int) -> str:
    """What llama.cpp keeps per sequence for this model, whose sliding window is `n_swa` tokens (0: none)."""
    if llama_cpp.llama_model_is_hybrid(model):
        return HYBRID
    if llama_cpp.llama_model_is_recurrent(model):
        return RECURRENT
    if n_swa > 0:
        return SLIDING_WINDOW
    return ATTENTION


@dataclass
class _Snapshot:
    """The saved part of a sequence's state when the memory held `position` tokens."""

    position: int
    buffer: ctypes.Array[ctypes.c_uint8]
    size: int


def rollback_method(kind: str, n_swa: int = 0, n_rs_seq: int = 0) -> str:
    """How spec takes tokens back from a memory of this kind, in words for reports."""
    if kind == ATTENTION:
        return "cut"
    if kind == SLIDING_WINDOW:
        return f"cut (window {n_swa}); beyond the cache, a snapshot at the prompt or from the start"
    if n_rs_seq > 0:
        return f"in place (up to {n_rs_seq} tokens); snapshot + replay beyond"
    return "snapshot + replay"


class Memory:
    """Attention KV cache: any tail can be cut, nothing is ever saved."""

    kind = ATTENTION
    n_swa = 0
    n_rs_seq = 0

    def __init__(self, context: llama_cpp.llama_context_p, name: str, seq: int = 0) -> None:
        self._context = context
        self._memory = llama_cpp.llama_get_memory(context)
        self._name = name
        self.seq = seq  # the sequence of the context this memory is
        self.saving_s = 0.0  # time spent saving snapshots

    @property
    def method(self) -> str:
        return rollback_method(self.kind, self.n_swa, self.n_rs_seq)

    def held(self) -> int:
        """How many positions llama.cpp holds for this sequence."""
        return llama_cpp.llama_memory_seq_pos_max(self._memory, self.seq) + 1

    def saves_before(self, n_tokens: int, n_final: int) -> bool:
        """Whether `before_decode` would save a snapshot for such a batch."""
        return False

    def before_decode(self, n_past: int, n_tokens: int, n_final: int) -> None:
        """A batch of `n_tokens` is about to be decoded at `n_past`; only its first `n_final` are sure to be
        kept. Memories that cannot cut back prepare here."""

    def after_prompt(self, n_past: int) -> None:
        """A prompt has just been evaluated up to `n_past`: a place a later chat turn may come back to."""

    def rollback(self, n_keep: int) -> int:
        """Forget every position from `n_keep` on; return how many positions are held afterwards: `n_keep`,
        or fewer when the memory had to go back to a snapshot (or to the start) and the caller replays."""
        self._cut(n_keep)
        return n_keep

    def clear(self) -> None:
        """Forget this sequence (a context shared by several sequences keeps the others)."""
        llama_cpp.llama_memory_seq_rm(self._memory, self.seq, -1, -1)

    def _cut(self, n_keep: int) -> None:
        if not llama_cpp.llama_memory_seq_rm(self._memory, self.seq, n_keep, -1):
            raise SpecError(f"llama.cpp refused to remove positions {n_keep}… of {self._name}")


class SnapshotMemory(Memory):
    """A memory that cannot always cut back: a sliding window, recurrent or hybrid memory.

    `before_decode` saves the non-cuttable part before a batch whose tail is speculative (once for a run of
    wholly speculative batches: a drafter's steps); `rollback` restores the newest snapshot at or before
    `n_keep` when no cut can serve.
    """

    def __init__(self, context: llama_cpp.llama_context_p, name: str, kind: str, seq: int = 0) -> None:
        super().__init__(context, name, seq)
        self.kind = kind
        self._round: _Snapshot | None = None
        self._prompt: _Snapshot | None = None
        self._speculating = False  # the last batch ended in speculative tokens

    def saves_before(self, n_tokens: int, n_final: int) -> bool:
        """A batch with speculative tokens needs a snapshot unless the snapshot before the speculative
        batches it continues serves (a batch with final tokens makes everything before it final)."""
        fresh = n_final > 0 or not self._speculating
        return n_final < n_tokens and fresh and not self._covered(n_tokens, n_final)

    def before_decode(self, n_past: int, n_tokens: int, n_final: int) -> None:
        if self.saves_before(n_tokens, n_final):
            self._round = self._save(n_past, self._round)
        self._speculating = n_final < n_tokens

    def _covered(self, n_tokens: int, n_final: int) -> bool:
        """Whether the speculative tail of this batch can be removed without a snapshot."""
        return False

    def after_prompt(self, n_past: int) -> None:
        self._prompt = self._save(n_past, self._prompt)

    def rollback(self, n_keep: int) -> int:
        self._speculating = False
        for snapshot in (self._round, self._prompt):
            if snapshot is not None and snapshot.position > n_keep:
                self._drop(snapshot)
        if self._try_cut(n_keep):
            return n_keep
        candidates = [s for s in (self._round, self._prompt) if s is not None and s.position <= n_keep]
        if not candidates:
            self.clear()
            return 0
        snapshot = max(candidates, key=lambda s: s.position)
        self._restore(snapshot)
        self._cut(snapshot.position)  # the attention part of a hybrid or sliding-window cache
        return snapshot.position

    def clear(self) -> None:
        super().clear()
        self._round = self._prompt = None
        self._speculating = False

    def _try_cut(self, n_keep: int) -> bool:
        """Cut to `n_keep` if this memory can without a snapshot; whether it did."""
        if n_keep == 0 or n_keep >= self.held():
            self._cut(n_keep)
            return True
        return False

    def _drop(self, snapshot: _Snapshot) -> None:
        if snapshot is self._round:
            self._round = None
        if snapshot is self._prompt:
            self._prompt = None

    def _save(self, position: int, reuse: _Snapshot | None) -> _Snapshot:
        """Save the non-cuttable part of the state, reusing `reuse`'s buffer when it is large enough."""
        started = time.perf_counter()
        size = llama_cpp.llama_state_seq_get_size_ext(self._context, self.seq, _PARTIAL)
        buffer = reuse.buffer if reuse is not None and len(reuse.buffer) >= size else (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data_ext(self._context, buffer, size, self.seq, _PARTIAL)
        if written == 0 and size > 0:
            raise SpecError(f"llama.cpp could not save the state of {self._name}")
        self.saving_s += time.perf_counter() - started
        return _Snapshot(position, buffer, written)

    def _restore(self, snapshot: _Snapshot) -> None:
        if llama_cpp.llama_state_seq_set_data_ext(self._context, snapshot.buffer, snapshot.size, self.seq, _PARTIAL) == 0:
            self.clear()
            raise SpecError(f"llama.cpp could not restore the saved state of {self._name}")


class SlidingWindowMemory(SnapshotMemory):
    """Sliding-window attention: cut unless the cells the next token needs were pruned.

    The next token at position n sees positions after n − n_swa; the check asks for every position from
    n − n_swa on, one more than strictly needed, so it also holds for chunked windows.
    """

    def __init__(self, context: llama_cpp.llama_context_p, name: str, n_swa: int, seq: int = 0) -> None:
        super().__init__(context, name, SLIDING_WINDOW, seq)
        self.n_swa = n_swa

    def _covered(self, n_tokens: int, n_final: int) -> bool:
        return True

    def after_prompt(self, n_past: int) -> None:
        """Only once the cache has pruned cells: before that any cut is served, and the window's cells can
        be hundreds of MB on a large model, too much to copy for every prompt."""
        if llama_cpp.llama_memory_seq_pos_min(self._memory, self.seq) > 0:
            super().after_prompt(n_past)

    def _try_cut(self, n_keep: int) -> bool:
        oldest = llama_cpp.llama_memory_seq_pos_min(self._memory, self.seq)
        if n_keep == 0 or oldest <= max(0, n_keep - self.n_swa):
            self._cut(n_keep)
            return True
        return False


class InPlaceMemory(SnapshotMemory):
    """Recurrent or hybrid memory that llama.cpp rolls back in place (`n_rs_seq` > 0).

    llama.cpp keeps the recurrent states of the last `n_rs_seq` tokens of the last batch (slot s = the state
    s tokens back), so a rollback of r tokens is served when 1 ≤ r < the last batch's length and r ≤ n_rs_seq,
    once per decode. Anything else (a draft model's one-token steps, a cut far back) uses snapshots.
    """

    def __init__(self, context: llama_cpp.llama_context_p, name: str, kind: str, n_rs_seq: int, seq: int = 0) -> None:
        super().__init__(context, name, kind, seq)
        self.n_rs_seq = n_rs_seq
        self._n_ubatch = llama_cpp.llama_n_ubatch(context)
        self._last_batch = 0

    def before_decode(self, n_past: int, n_tokens: int, n_final: int) -> None:
        self._last_batch = self._last_chunk(n_tokens)
        super().before_decode(n_past, n_tokens, n_final)

    def _covered(self, n_tokens: int, n_final: int) -> bool:
        return n_final >= 1 and n_tokens - n_final <= min(self.n_rs_seq, self._last_chunk(n_tokens) - 1)

    def _last_chunk(self, n_tokens: int) -> int:
        """The tokens of the last llama_decode call a batch becomes (Context feeds n_ubatch at a time)."""
        return (n_tokens - 1) % self._n_ubatch + 1 if n_tokens else 0

    def _try_cut(self, n_keep: int) -> bool:
        rollback, last_batch, self._last_batch = self.held() - n_keep, self._last_batch, 0  # once per decode
        if 1 <= rollback <= min(self.n_rs_seq, last_batch - 1):
            return bool(llama_cpp.llama_memory_seq_rm(self._memory, self.seq, n_keep, -1))
        return super()._try_cut(n_keep)


def for_context(context: llama_cpp.llama_context_p, model: llama_cpp.llama_model_p, name: str,
                seq: int = 0) -> Memory:
    """The rollback strategy for sequence `seq` of a freshly made context of `model`."""
    n_swa = llama_cpp.llama_model_n_swa(model)
    kind = memory_kind(model, n_swa)
    if kind == ATTENTION:
        return Memory(context, name, seq)
    if kind == SLIDING_WINDOW:
        return SlidingWindowMemory(context, name, n_swa, seq)
    n_rs_seq = llama_cpp.llama_n_rs_seq(context)
    if n_rs_seq > 0:
        return InPlaceMemory(context, name, kind, n_rs_seq, seq)
    return SnapshotMemory(context, name, kind, seq)
