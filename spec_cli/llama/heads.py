"""The memories of drafters fed with the target's hidden states, through llama.cpp's extended batch (rows that
carry a token, an embedding, or both):

- `HeadContext`: a head that pairs each token with a hidden state, the target's MTP head (its own weights
  in the target's GGUF) or an EAGLE-3 head (a GGUF of its own, whose fc layer `encode`s the target's
  features into the states it pairs);
- `BlockContext`: a DFlash drafter, whose memory holds the target's features position by position and which
  drafts a whole block in one non-causal pass.

Each is a plain KV cache over the drafter's own layers, so taking tokens back is a cut.
"""

from __future__ import annotations

import ctypes
import time
from typing import Sequence

import llama_cpp
import numpy as np
from llama_cpp import llama_cpp_ext

from spec_cli.errors import SpecError
from spec_cli.llama.context import Context, copy_rows, new_context
from spec_cli.llama.model import Backend, Model
from spec_cli.llama.threads import Threads

_FLOAT_P = ctypes.POINTER(ctypes.c_float)


class _FedContext:
    """A context fed through the extended batch; `tokens` are what its positions stand for in the sequence."""

    what = "the drafter"
    rollback_s = 0.0  # a cut of its memory counts in `busy_s`, as its drafter's time (`Drafter.clocks`)

    def __init__(self, model: Model, n_ctx: int, n_threads: int, n_batch: int, **settings: object) -> None:
        self.model = model
        self.n_batch = min(n_batch, n_ctx)
        self._handle = new_context(model, n_ctx, self.n_batch, n_threads, self.what, n_rs_seq=0, **settings)
        self._batch = llama_cpp.llama_batch_ext_init(self._handle)
        self._position = (llama_cpp.llama_pos * 4)()  # M-RoPE models read 4 for an embedding row
        self._embedding = llama_cpp.llama_embd(None, 1, 0)  # reused: one row of an array the caller keeps alive
        self.tokens: list[int] = []
        self.busy_s = 0.0
        self.threads = Threads(llama_cpp.llama_n_threads(self._handle))  # the count its passes run on
        self._rows = self._outputs = 0  # of the batch being filled

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def _add(self, position: int, token: int | None, row: int | None, width: int, output: bool) -> None:
        """One row of the batch: a token, an embedding, or a token with an embedding; `row` is the address of
        the embedding's `width` float32 values (llama.cpp copies them). Called once per drafted token, so it
        keeps to few calls (see `copy_rows`)."""
        embedding = self._embedding
        if row is not None:
            embedding.data, embedding.n_embd = ctypes.cast(row, _FLOAT_P), width
        if token is None:
            index = llama_cpp.llama_batch_ext_add_embd(self._batch, 0, embedding)
            self._position[:3] = [position] * 3
        else:
            index = llama_cpp.llama_batch_ext_add_token(self._batch, 0, token)
            if row is not None:
                llama_cpp.llama_batch_ext_set_embd_token(self._batch, index, embedding)
            self._position[0] = position
        llama_cpp.llama_batch_ext_set_pos(self._batch, index, self._position)
        self._rows += 1
        if output:
            llama_cpp.llama_batch_ext_set_output_logits(self._batch, index, True)
            self._outputs += 1

    def _process(self, kind: int) -> None:
        self.threads.apply(self._handle)
        Backend.forget()
        started = time.perf_counter()
        status = llama_cpp.llama_process(self._handle, kind, self._batch)
        self.threads.passed((kind, self._rows, self._outputs), time.perf_counter() - started)
        self._rows = self._outputs = 0
        llama_cpp.llama_batch_ext_clear(self._batch)
        if status != 0:  # the memory may hold part of the batch: forget everything
            llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(self._handle), 0, 0, -1)
            self.tokens.clear()
            raise SpecError(f"llama.cpp could not run {self.what} of {self.model.path.name}: "
                            f"{Backend.message(f'status {status}')}")

    def _logits(self, n_rows: int) -> np.ndarray:
        return copy_rows(llama_cpp.llama_get_logits(self._handle), n_rows, self.model.n_vocab)

    def _states(self, n_rows: int) -> np.ndarray:
        """The drafter's own hidden states of the last pass's output rows (h_nextn)."""
        return copy_rows(llama_cpp_ext.llama_get_embeddings_nextn(self._handle), n_rows, self.model.n_embd)

    def trim(self, n_keep: int) -> None:
        """Forget every position from `n_keep` on."""
        if n_keep >= self.n_past:
            return
        started = time.perf_counter()
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(self._handle), 0, n_keep, -1)
        del self.tokens[n_keep:]
        self.busy_s += time.perf_counter() - started

    def close(self) -> None:
        if self._handle:
            llama_cpp.llama_batch_ext_free(self._batch)
            llama_cpp.llama_free(self._handle)
            self._handle = None


class HeadContext(_FedContext):
    """The memory of a head that pairs tokens with hidden states: position p holds (token, state), and
    decoding a pair yields the head's logits for the token after next and its own hidden state, which the
    next draft step pairs with the drafted token.

    `target` None: the MTP head of `model` (a target loaded with `load_mtp`), llama.cpp's MTP context. Else
    `model` is an EAGLE-3 head drafting for `target`: its context reads the target's token embeddings and
    output layer where the head has none (`ctx_other`), and `encode` runs its fc layer.
    """

    def __init__(self, model: Model, n_ctx: int, n_threads: int, n_batch: int = 512,
                 target: Context | None = None) -> None:
        self.what = "the MTP head" if target is None else "the EAGLE-3 head"
        # llama.cpp's EAGLE-3 decoder graph computes every row's logits and never selects the rows asked for
        # (src/models/eagle3.cpp): it hands back the first n_outputs rows. So a chunk with outputs asks for all.
        self._every_row_out = target is not None
        if target is None:
            super().__init__(model, n_ctx, n_threads, n_batch, ctx_type=llama_cpp.LLAMA_CONTEXT_TYPE_MTP)
        else:
            super().__init__(model, n_ctx, n_threads, n_batch, ctx_other=target._handle)
        llama_cpp_ext.llama_set_embeddings_nextn(self._handle, True, True)  # the head's state, output rows only

    def decode(self, tokens: Sequence[int], hidden: np.ndarray, n_outputs: int) -> tuple[np.ndarray, np.ndarray]:
        """Append the pairs (tokens[i], hidden[i]); return the logits and the head's hidden states of the last
        `n_outputs` pairs, one row each."""
        started = time.perf_counter()
        hidden = np.ascontiguousarray(hidden, dtype=np.float32)
        address, width = hidden.ctypes.data, hidden.shape[1]
        first_output = len(tokens) - n_outputs
        for start in range(0, len(tokens), self.n_batch):
            chunk = range(start, min(start + self.n_batch, len(tokens)))
            every = self._every_row_out and chunk.stop > first_output
            for i in chunk:
                self._add(self.n_past + i - start, tokens[i], address + i * 4 * width, width,
                          every or i >= first_output)
            self._process(llama_cpp.LLAMA_PROCESS_TYPE_DECODE)
            self.tokens.extend(tokens[i] for i in chunk)
        self.busy_s += time.perf_counter() - started
        if n_outputs == 0:
            return np.empty((0, self.model.n_vocab), np.float32), np.empty((0, self.model.n_embd), np.float32)
        n_rows = len(chunk) if self._every_row_out else n_outputs
        return self._logits(n_rows)[-n_outputs:], self._states(n_rows)[-n_outputs:]

    def encode(self, features: np.ndarray) -> np.ndarray:
        """g = fc(features), one row per row of the target's concatenated layer inputs (EAGLE-3's encoder;
        it has no attention, so the memory is untouched and positions do not matter)."""
        started = time.perf_counter()
        features = np.ascontiguousarray(features, dtype=np.float32)
        address, width = features.ctypes.data, features.shape[1]
        rows = []
        for start in range(0, len(features), self.n_batch):
            chunk = features[start:start + self.n_batch]
            for i in range(len(chunk)):
                self._add(self.n_past + i, None, address + (start + i) * 4 * width, width, True)
            self._process(llama_cpp.LLAMA_PROCESS_TYPE_ENCODE)
            rows.append(self._states(len(chunk)))
        self.busy_s += time.perf_counter() - started
        return np.concatenate(rows) if rows else np.empty((0, self.model.n_embd), np.float32)


class BlockContext(_FedContext):
    """A DFlash drafter's memory: position p holds the target's features at p (its fc layer writes them into
    the KV cache as they are injected), and `block` decodes [last, MASK, …, MASK] after them in one
    non-causal pass, one row of logits per position.

    Its batches hold a whole block (llama.cpp asserts that n_ubatch does), so the batch is at least
    `block_size`; the context's memory reaches a block past the target's.
    """

    what = "the DFlash drafter"

    def __init__(self, model: Model, target: Context, n_threads: int, block_size: int, mask_token: int,
                 causal: bool = False, n_batch: int = 512) -> None:
        batch = max(n_batch, block_size)
        super().__init__(model, target.n_ctx + block_size, n_threads, batch, ctx_other=target._handle,
                         n_ubatch=batch)
        self.block_size, self.mask_token, self.causal = block_size, mask_token, causal
        llama_cpp.llama_set_causal_attn(self._handle, causal)

    def inject(self, tokens: Sequence[int], features: np.ndarray) -> None:
        """Append the target's `features` for the positions of `tokens`, one row each."""
        started = time.perf_counter()
        features = np.ascontiguousarray(features, dtype=np.float32)
        address, width = features.ctypes.data, features.shape[1]
        for start in range(0, len(tokens), self.n_batch):
            chunk = range(start, min(start + self.n_batch, len(tokens)))
            for i in chunk:
                self._add(self.n_past + i - start, None, address + i * 4 * width, width, False)
            self._process(llama_cpp.LLAMA_PROCESS_TYPE_DECODE)
            self.tokens.extend(tokens[i] for i in chunk)
        self.busy_s += time.perf_counter() - started

    def block(self, last: int, n: int) -> np.ndarray:
        """Logits of the n positions of [last, MASK × (n − 1)] placed after the memory; the block is taken
        back at once (the next round injects the target's features there instead)."""
        started = time.perf_counter()
        for i in range(n):
            self._add(self.n_past + i, last if i == 0 else self.mask_token, None, 0, True)
        self._process(llama_cpp.LLAMA_PROCESS_TYPE_DECODE)
        logits = self._logits(n)
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(self._handle), 0, self.n_past, -1)
        self.busy_s += time.perf_counter() - started
        return logits
