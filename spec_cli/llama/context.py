"""A sequence's memory over a model: batches decoded at increasing positions, logits only where asked,
and `trim` back to n tokens (how, `memory` decides for each kind of memory). The contexts of drafters fed
with the target's hidden states are in `heads`.
"""

from __future__ import annotations

import copy
import ctypes
import time
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import llama_cpp
import numpy as np
from llama_cpp import llama_cpp_ext

from spec_cli.errors import SpecError
from spec_cli.llama import features, memory
from spec_cli.llama.model import Backend, Model
from spec_cli.llama.threads import Threads
from spec_cli.llama.vision import KEPT_IMAGES, Projector, whole_images


def copy_rows(pointer: object, n_rows: int, width: int) -> np.ndarray:
    """A copy of the n_rows × width float32 rows llama.cpp holds at `pointer` (logits, hidden states). One
    allocation and one memmove: right after a decode the host's caches are cold and each NumPy or ctypes call
    costs microseconds, several times over for `np.ctypeslib.as_array` and a copy."""
    rows = np.empty((n_rows, width), dtype=np.float32)
    ctypes.memmove(rows.ctypes.data, pointer, rows.nbytes)
    return rows


LONG_DECODE = 32  # tokens from which a decode counts as taking in a stretch (a prompt, a catch-up)


class Throughput:
    """Seconds per token of a context's long decodes (prompts, catch-ups), older ones weighing `DECAY`× less at
    each new one: what taking in a long stretch costs on this machine, under its present load. Every sequence
    of one llama.cpp context shares it (they run the same weights)."""

    DECAY = 0.8

    def __init__(self) -> None:
        self.tokens = 0.0
        self.seconds = 0.0

    def record(self, n_tokens: int, seconds: float) -> None:
        if n_tokens >= LONG_DECODE:
            self.tokens = self.tokens * self.DECAY + n_tokens
            self.seconds = self.seconds * self.DECAY + seconds

    @property
    def per_token(self) -> float | None:
        return self.seconds / self.tokens if self.tokens else None

    def seed(self, per_token: float, tokens: float = 4 * 128) -> None:
        """Start from a rate measured before (a cost book's), counting as `tokens` tokens decoded."""
        self.tokens, self.seconds = tokens, tokens * per_token


def common_prefix(held: Sequence[int], tokens: Sequence[int]) -> int:
    """How many tokens a memory holding `held` can keep of a new sequence `tokens`."""
    keep = 0
    for cached, token in zip(held, tokens):
        if cached != token:
            break
        keep += 1
    return keep


@dataclass(frozen=True)
class _Held:
    """An image a sequence's memory holds: its run of `run` ids from `start` in `tokens`, which advanced
    positions by `n_pos` in this context (0 where the context has no projector and skipped it)."""

    start: int
    run: int
    n_pos: int

    @property
    def shift(self) -> int:
        return self.n_pos - self.run


def new_context(model: Model, n_ctx: int, n_batch: int, n_threads: int, what: str, n_seq_max: int = 1,
                **settings: object) -> llama_cpp.llama_context_p:
    """A llama.cpp context over `model` for `n_seq_max` sequences (`n_ctx` cells between them), decoding batches
    of `n_batch` on `n_threads`; `settings` are further llama_context_params fields, `what` names it in the
    error. Several sequences share one KV buffer (`kv_unified`): llama.cpp then computes a batch whose
    sequences feed different numbers of tokens (a ragged verify pass) in one go, where separate buffers split
    it into as many passes as there are lengths."""
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = n_ctx
    params.n_batch = params.n_ubatch = n_batch
    params.n_seq_max = n_seq_max
    params.kv_unified = True
    params.n_threads = params.n_threads_batch = n_threads
    params.no_perf = True
    for name, value in settings.items():
        setattr(params, name, value)
    Backend.forget()
    handle = llama_cpp.llama_init_from_model(model._handle, params)
    if not handle:
        raise SpecError(f"llama.cpp could not create {what} for {model.path.name}: "
                        f"{Backend.message('out of memory?')}")
    return handle


class Context:
    """One sequence's memory over a `Model`, fed token batches at increasing positions of sequence `seq`.

    A context made for several sequences (`sequences`) is sequence 0 of them; `sequence(s)` gives the others,
    and `decode_together` feeds several in one pass. `tokens` is what the memory holds. An image's run in
    `tokens` (`vision`) is decoded through `projector`, or skipped without one; positions then part from
    indices in `tokens` (an image advances them by its own count, a grid's side under M-RoPE, or not at all
    when skipped), and the memory works in positions. Going back (`trim`) is left to the memory's strategy (`memory`):
    a cut, an in-place rollback, or a snapshot restored and the kept tokens replayed; `rollback_s` is the
    time that costs (saving snapshots included). Decoding and trimming count in `busy_s`; the prompt's
    snapshot does not.
    """

    def __init__(self, model: Model, n_ctx: int, n_threads: int, n_batch: int = 512, max_rollback: int = 0,
                 hidden_states: bool = False, n_ubatch: int | None = None,
                 feature_layers: tuple[int, ...] = (), sequences: int = 1) -> None:
        """`max_rollback`: the most tokens one speculative round may discard (K); recurrent memories that
        llama.cpp can roll back in place keep that many states per sequence. `hidden_states`: keep, in
        `hidden`, the hidden state the model exports for its MTP head (llama.cpp's h_nextn; for qwen35 the
        last layer's, after the output norm) at every position decoded, replays included. `n_ubatch`: the
        tokens llama.cpp computes at once (default: the batch; 1 over a model with `one_token_batches`).
        `feature_layers`: keep, in `features`, the inputs of these layers side by side at every position
        decoded (what an EAGLE-3 or DFlash drafter reads). `sequences`: how many sequences of `n_ctx` tokens
        the llama.cpp context holds (each keeps hidden states and features of its own)."""
        self.model = model
        self.seq = 0
        self.n_batch = min(n_batch, n_ctx)
        # n_rs_seq: llama.cpp sets it to 0 for architectures it cannot roll back in place. swa_full off: a
        # sliding-window cache of window + one batch, not of the whole context, a fraction of the memory on
        # long contexts (Gemma 3 27B at 8k: ~0.8 instead of ~4 GB); `memory` handles the cuts it prunes.
        self.n_ubatch = n_ubatch or (1 if model.one_token_batches else self.n_batch)
        what = f"a {n_ctx}-token context" + (f" for {sequences} sequences" if sequences > 1 else "")
        handle = new_context(model, n_ctx * sequences, self.n_batch, n_threads, what, n_seq_max=sequences,
                             n_rs_seq=max_rollback, swa_full=False, n_ubatch=self.n_ubatch)
        self._handle = handle
        self.memory = memory.for_context(handle, model._handle, model.path.name)
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self._open = [sequences]  # sequences of the llama.cpp context not yet closed, shared with `sequence`'s
        # llama.cpp rounds the size up (to 256s); the user's number is the limit we keep to.
        self.n_ctx: int = min(n_ctx, llama_cpp.llama_n_ctx(handle) // sequences)
        self.tokens: list[int] = []
        self.projector: Projector | None = None  # reads the images of `tokens` (the pair sets it)
        self._held: list[_Held] = []
        self._shift = 0  # positions less indices past every image held
        self.busy_s = 0.0
        self._trim_s = 0.0
        self.throughput = Throughput()  # shared with `sequence`'s copies
        # The count its passes run on, from the one llama.cpp made it with; shared with `sequence`'s copies.
        self.threads = Threads(llama_cpp.llama_n_threads(handle))
        # Row p: h_p as last computed. Valid for every position of the sequence decoded with its current tokens,
        # those a rollback took back included (their h does not change); rows of rejected drafts are stale.
        self.hidden: np.ndarray | None = None
        if hidden_states:
            llama_cpp_ext.llama_set_embeddings_nextn(handle, True, False)  # every row, not only those with logits
            self.hidden = np.zeros((self.n_ctx, model.n_embd), dtype=np.float32)
        # [layer i, row p]: the input of feature layer i at p, valid as `hidden` is; layer by layer, so each is
        # one copy after a decode. Zeros are not written: pages of rows never decoded take no memory.
        self.feature_layers = feature_layers
        self._features: np.ndarray | None = None
        if feature_layers:
            features.record_layer_inputs(handle, feature_layers)
            self._features = np.zeros((len(feature_layers), self.n_ctx, model.n_embd), dtype=np.float32)
            self._features_address = self._features.ctypes.data

    def sequence(self, seq: int) -> Context:
        """Sequence `seq` of this context's llama.cpp context (made with `sequences` > seq): the same model,
        batch and sizes, a memory and tokens of its own."""
        if not 0 < seq < llama_cpp.llama_n_seq_max(self._handle):
            raise ValueError(f"sequence {seq} is not one of this context's")
        other = copy.copy(self)
        other.seq, other.tokens, other.busy_s, other._trim_s = seq, [], 0.0, 0.0
        other._held, other._shift = [], 0
        other.memory = memory.for_context(self._handle, self.model._handle, self.model.path.name, seq)
        if self.hidden is not None:
            other.hidden = np.zeros_like(self.hidden)
        if self._features is not None:
            other._features = np.zeros_like(self._features)
            other._features_address = other._features.ctypes.data
        return other

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    @property
    def rollback_s(self) -> float:
        """Seconds spent taking tokens back: cuts, restores, saving snapshots, and the target's replays
        (a drafter's replays ride in its catch-up batch and count as drafting)."""
        return self._trim_s + self.memory.saving_s

    def decode(self, tokens: Sequence[int], n_logits: int, n_final: int | None = None) -> np.ndarray:
        """Append `tokens` to the memory; return logits for the last `n_logits` of them, one row each.

        Asking only for the rows that will be used keeps llama.cpp from computing the output layer for the
        rest (prompt prefill asks for none). `n_final`: how many of `tokens` are sure to be kept (default
        all); the rest are speculative, and a memory that cannot cut them away later prepares for it now.
        """
        tokens = self._prepare(tokens, n_logits, len(tokens) if n_final is None else n_final)
        self.threads.apply(self._handle)
        started = time.perf_counter()
        rows = self._decode(tokens, n_logits)
        elapsed = time.perf_counter() - started
        self.threads.passed((len(tokens), n_logits), elapsed)
        self.busy_s += elapsed
        if n_logits <= 1:  # a stretch taken in, not a verify pass (whose output rows cost more)
            self.throughput.record(len(tokens), elapsed)
        return rows

    def _prepare(self, tokens: Sequence[int], n_logits: int, n_final: int) -> Sequence[int]:
        """Check a batch and let the memory prepare for it; return the tokens still to decode."""
        if self.n_past + len(tokens) > self.n_ctx:
            raise RuntimeError(f"decode past the context: {self.n_past} + {len(tokens)} > {self.n_ctx}")
        if n_logits > min(len(tokens), self.n_batch):
            raise ValueError(f"cannot return {n_logits} logit rows for a batch of {len(tokens)}")
        if 1 < n_final and n_logits <= len(tokens) - n_final + 1 and self.memory.saves_before(len(tokens), n_final):
            # The sure tokens before the last one are what the last restore took back (the target's
            # verify batch feeds them again). The snapshot belongs after them, or the next rollback would
            # take them back once more: replay them on their own, as part of the rollback's cost.
            started = time.perf_counter()
            self.decode(tokens[:n_final - 1], 0)
            self._trim_s += time.perf_counter() - started
            tokens, n_final = tokens[n_final - 1:], 1
        self.memory.before_decode(self.n_past + self._shift, len(tokens), n_final)
        return tokens

    def _decode(self, tokens: Sequence[int], n_logits: int) -> np.ndarray:
        first_output = len(tokens) - n_logits
        start = 0
        while start < len(tokens):
            if tokens[start] < 0:
                start += self._see(tokens[start], whole_images(tokens[start:], 0))
                continue
            chunk = tokens[start:start + whole_images(tokens[start:start + self.n_batch], self.n_batch)]
            self._batch.n_tokens = self._put(0, chunk, first_output - start)
            Backend.forget()
            status = llama_cpp.llama_decode(self._handle, self._batch)
            if status != 0:
                self._fail(status)
            self._keep_rows(0, len(chunk))
            self.tokens.extend(chunk)
            start += len(chunk)
        if n_logits == 0:
            return np.empty((0, self.model.n_vocab), dtype=np.float32)
        return copy_rows(llama_cpp.llama_get_logits(self._handle), n_logits, self.model.n_vocab)

    def _see(self, key: int, run: int) -> int:
        """Decode the image whose run of `run` ids holds `key` through the projector (skip it without one);
        return `run`."""
        image = self.projector.get(key) if self.projector is not None else None
        if self.projector is not None and image is None:
            self._fail_quietly()
            raise SpecError(f"an image of the prompt is no longer held by {self.projector.path.name} (more than "
                            f"{KEPT_IMAGES} images were read since): send it again")
        if image is not None:
            try:
                image.decode(self._handle, self.n_past + self._shift, self.seq, self.n_batch)
            except SpecError:
                self._fail_quietly()
                raise
        held = _Held(self.n_past, run, image.n_pos if image is not None else 0)
        self._held.append(held)
        self._shift += held.shift
        self.tokens.extend([key] * run)
        return run

    def _position(self, n: int) -> int:
        """The position of the n-th token (n at the end of an image or between them)."""
        return n + sum(held.shift for held in self._held if held.start + held.run <= n)

    def _index(self, position: int) -> int:
        """How many of `tokens` the memory holds when it holds positions up to `position`: an image the position
        falls inside of is not held."""
        shift = 0
        for held in self._held:
            first = held.start + shift
            if position <= first:
                break
            if position < first + held.n_pos:
                return held.start
            shift += held.shift
        return position - shift

    def _whole(self, n: int) -> int:
        """n, or the start of the image it would cut through (memories never keep part of an image)."""
        for held in self._held:
            if held.start < n < held.start + held.run:
                return held.start
        return n

    @property
    def keeps_features(self) -> bool:
        return self._features is not None

    def features(self, positions: slice | np.ndarray) -> np.ndarray:
        """The feature layers' inputs at `positions` (a slice, or an array of them), side by side in each row
        (layer by layer, in the order given): what an EAGLE-3 or DFlash drafter's fc layer reads."""
        assert self._features is not None
        rows = self._features[:, positions]
        return rows.transpose(1, 0, 2).reshape(rows.shape[1], -1)

    def _keep_rows(self, first: int, n_rows: int) -> None:
        """Keep the hidden states and feature layers' inputs of this sequence's `n_rows` rows of the decode just
        made, from batch row `first` on, at its next positions: one memmove each (a layer each)."""
        row_bytes = self.model.n_embd * 4
        if self.hidden is not None:
            rows = self.hidden[self.n_past:self.n_past + n_rows]
            source = llama_cpp_ext.llama_get_embeddings_nextn(self._handle)
            ctypes.memmove(rows.ctypes.data, ctypes.cast(source, ctypes.c_void_p).value + first * row_bytes,
                           rows.nbytes)
        if self._features is not None:
            held = self._features.shape[1]
            address = self._features_address + self.n_past * row_bytes
            for i, layer in enumerate(self.feature_layers):
                source = ctypes.cast(features.layer_inputs(self._handle, layer), ctypes.c_void_p).value
                ctypes.memmove(address + i * held * row_bytes, source + first * row_bytes, n_rows * row_bytes)

    def _fail(self, status: int) -> None:
        """llama.cpp refused a batch: forget everything (the memory may hold part of it) and say why."""
        self._fail_quietly()
        reason = "no room in the memory" if status == 1 else f"status {status}"
        raise SpecError(f"llama.cpp could not decode with {self.model.path.name}: {Backend.message(reason)}")

    def prefill(self, tokens: Sequence[int]) -> int:
        """Make the memory hold exactly `tokens`, keeping the longest prefix it already holds; return how
        many tokens were reused.

        A new prompt that extends the last one (the next turn of a chat, the same system prompt) then
        costs only its new tokens. A memory that cannot cut back that far restores its snapshot at the end
        of an earlier prompt, or starts over.
        """
        self.trim(common_prefix(self.tokens, tokens))  # what a restore leaves out is decoded with the rest
        reused = self.n_past
        self.decode(tokens[reused:], 0)
        if reused < len(tokens):
            self.mark_prompt()
        return reused

    def mark_prompt(self) -> None:
        """The memory holds a whole prompt: a place a later chat turn may come back to."""
        self.memory.after_prompt(self.n_past + self._shift)

    def _put(self, at: int, chunk: Sequence[int], first_output: int) -> int:
        """Write `chunk` into the batch from row `at`, at this sequence's next positions, asking for logits from
        its row `first_output` on; return the row after it."""
        batch, n_past, seq = self._batch, self.n_past + self._shift, self.seq
        for i, token in enumerate(chunk):
            batch.token[at + i] = token
            batch.pos[at + i] = n_past + i
            batch.n_seq_id[at + i] = 1
            batch.seq_id[at + i][0] = seq
            batch.logits[at + i] = i >= first_output
        return at + len(chunk)

    def trim(self, n_keep: int) -> None:
        """Forget every position from `n_keep` on: keep at most `n_keep` tokens.

        A memory that cannot cut there goes back further (to a snapshot, or to the start); every caller
        feeds what it lacks with its next decode (a drafter's catch-up, the target's next verify batch).
        The memory is asked even when nothing seems to be beyond `n_keep`: a Ctrl-C that lands between
        `llama_decode` and the bookkeeping above leaves llama.cpp holding positions that `tokens` lacks.
        """
        n_keep = self._whole(min(n_keep, self.n_past))
        if n_keep >= max(self.n_past, self._index(self.memory.held())):
            return
        started = time.perf_counter()
        kept = self._index(self.memory.rollback(self._position(n_keep)))
        del self.tokens[kept:]
        self._forget_images(kept)
        elapsed = time.perf_counter() - started
        self._trim_s += elapsed
        self.busy_s += elapsed

    def _forget_images(self, kept: int) -> None:
        self._held = [held for held in self._held if held.start < kept]
        self._shift = sum(held.shift for held in self._held)

    def _fail_quietly(self) -> None:
        self.memory.clear()
        self.tokens.clear()
        self._forget_images(0)

    @property
    def portable(self) -> bool:
        """Whether this sequence's whole state can be saved and loaded elsewhere (`saved_state`): not when it
        keeps hidden states or features beside its memory, which a state does not carry, nor when it holds an
        image (whose positions the state does not say)."""
        return self.hidden is None and self._features is None and not self._held

    def saved_state(self) -> tuple[ctypes.Array[ctypes.c_uint8], int]:
        """This sequence's whole state (every kind of memory it has), as llama.cpp writes it: (buffer, size)."""
        size = llama_cpp.llama_state_seq_get_size_ext(self._handle, self.seq, 0)
        buffer = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data_ext(self._handle, buffer, size, self.seq, 0)
        if written == 0 and size > 0:
            raise SpecError(f"llama.cpp could not save the state of {self.model.path.name}")
        return buffer, written

    def load_state(self, buffer: ctypes.Array[ctypes.c_uint8], size: int, tokens: Sequence[int]) -> None:
        """Make this sequence hold `tokens` from a state `saved_state` wrote for them (on any sequence of a
        context over the same model): what it held before, and its snapshots, are forgotten."""
        self._fail_quietly()
        if llama_cpp.llama_state_seq_set_data_ext(self._handle, buffer, size, self.seq, 0) == 0:
            self.memory.clear()
            raise SpecError(f"llama.cpp could not load a saved state of {self.model.path.name}")
        self.tokens = list(tokens)
        self.memory.after_prompt(self.n_past)

    def close(self) -> None:
        """Forget this sequence; the last of a llama.cpp context's sequences to close frees it."""
        if not self._handle:
            return
        self._open[0] -= 1
        if self._open[0] == 0:
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self._handle)
        else:
            self.memory.clear()
        self._handle = None


class Part(NamedTuple):
    """One sequence's share of a pass: its context, the tokens it appends, the logit rows it wants (its last
    `n_logits` tokens'), and how many of its tokens are sure (`n_final`: kept whatever the verification says)."""

    context: Context
    tokens: Sequence[int]
    n_logits: int
    n_final: int


def decode_together(parts: Sequence[Part]) -> list[np.ndarray]:
    """One llama.cpp pass for several sequences of one context (`Context.sequence`): each part appends its tokens
    to its own sequence, as `Context.decode` would, and gets the logits of its last `n_logits`, one row each.

    The pass reads the weights once for every row of every sequence: where a pass is bound by memory traffic (a
    CPU, a GPU at small batches) N sequences' verify rows cost little more than one's. The parts' tokens
    must fit one batch (`n_batch`); each sequence's memory prepares for its speculative tail as in `decode`.
    One part is `decode` itself.
    """
    if len(parts) == 1:  # a context of one sequence, which may keep hidden states or features
        context, tokens, n_logits, n_final = parts[0]
        return [context.decode(tokens, n_logits, n_final)]
    first = parts[0].context
    todo = [(context, context._prepare(tokens, n_logits, n_final), n_logits)
            for context, tokens, n_logits, n_final in parts]
    total = sum(len(tokens) for _, tokens, _ in todo)
    if total > first.n_batch or any(context._handle != first._handle for context, _, _ in todo):
        raise ValueError(f"{len(parts)} parts of {total} tokens are not one batch of one context")
    started, at, firsts = time.perf_counter(), 0, []
    for context, tokens, n_logits in todo:
        firsts.append(at)
        at = context._put(at, tokens, len(tokens) - n_logits)
    first._batch.n_tokens = at
    first.threads.apply(first._handle)
    Backend.forget()
    status = llama_cpp.llama_decode(first._handle, first._batch)
    if status != 0:
        for context, _, _ in todo[1:]:
            context._fail_quietly()
        first._fail(status)
    n_rows = sum(n_logits for _, _, n_logits in todo)
    rows = copy_rows(llama_cpp.llama_get_logits(first._handle), n_rows, first.model.n_vocab) if n_rows else None
    elapsed, out, row = time.perf_counter() - started, [], 0
    first.threads.passed((at, n_rows), elapsed)
    if n_rows <= len(parts):  # prompt chunks and one-row steps, not verify passes
        first.throughput.record(at, elapsed)
    for (context, tokens, n_logits), first_row in zip(todo, firsts):
        context._keep_rows(first_row, len(tokens))
        context.tokens.extend(tokens)
        context.busy_s += elapsed
        out.append(rows[row:row + n_logits] if rows is not None else np.empty((0, first.model.n_vocab), np.float32))
        row += n_logits
    return out
