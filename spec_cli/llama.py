"""Adapter over llama-cpp-python's low-level API; with `memory.py` and `rpc.py` (ggml's device registry) the only
modules that import `llama_cpp`.

It offers exactly what speculative decoding needs: load a GGUF model, tokenize and detokenize, decode a
batch asking for logits only at the last n positions, and trim a context's memory back to n tokens (how,
`memory.py` decides for each kind of memory).
llama-cpp-python's high-level `Llama` class is not used: it keeps logits for every position and offers no
way to drive two models in lock-step.
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

import llama_cpp
from llama_cpp import llama_cpp_ext
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from spec_cli import kernels, memory, rpc
from spec_cli.errors import SpecError

GGUF_MAGIC = b"GGUF"
_GGML_LOG_LEVEL_WARN = 3
_GGML_LOG_LEVEL_ERROR = 4
_GGML_LOG_LEVEL_CONT = 5

# Names accepted by `quantize`, mapped to llama.cpp's LLAMA_FTYPE values.
FTYPES = {
    "f32": 0,
    "f16": 1,
    "q4_0": 2,
    "q4_1": 3,
    "q8_0": 7,
    "q5_0": 8,
    "q5_1": 9,
    "q2_k": 10,
    "q3_k_m": 12,
    "q4_k_s": 14,
    "q4_k_m": 15,
    "q5_k_s": 16,
    "q5_k_m": 17,
    "q6_k": 18,
    "bf16": 32,
}


class _Backend:
    """Initialises llama.cpp once and keeps its log quiet, collecting its errors (or else warnings) since the
    last `forget` so our one-line messages can quote llama.cpp's own words."""

    initialised = False
    errors: list[str] = []
    warnings: list[str] = []
    _continued: list[str] | None = None  # the list a GGML_LOG_LEVEL_CONT line extends

    @staticmethod
    @llama_cpp.llama_log_callback
    def _log(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
        line = text.decode("utf-8", errors="replace").strip()
        target = _Backend._continued
        if level == _GGML_LOG_LEVEL_CONT and target:
            target[-1] = f"{target[-1]} {line}".strip()
        elif level in (_GGML_LOG_LEVEL_ERROR, _GGML_LOG_LEVEL_WARN):
            _Backend._continued = _Backend.errors if level == _GGML_LOG_LEVEL_ERROR else _Backend.warnings
            _Backend._continued.append(line)
        else:
            _Backend._continued = None

    @classmethod
    def ensure(cls) -> None:
        if not cls.initialised:
            llama_cpp.llama_log_set(cls._log, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            cls.initialised = True

    @classmethod
    def forget(cls) -> None:
        cls.errors.clear()
        cls.warnings.clear()

    @classmethod
    def message(cls, default: str) -> str:
        """llama.cpp's errors since `forget`, else its warnings, else `default`, on one line."""
        return " ".join("; ".join(cls.errors or cls.warnings or [default]).split())


def check_gguf(path: Path) -> None:
    """Fail with one line unless `path` is a readable file that starts with the GGUF magic."""
    if not path.exists():
        raise SpecError(f"model file not found: {path}")
    if not path.is_file():
        raise SpecError(f"not a file: {path}")
    try:
        with path.open("rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror}") from exc
    if magic != GGUF_MAGIC:
        raise SpecError(f"not a GGUF file: {path}")


def versions() -> tuple[str, str]:
    """(llama-cpp-python version, llama.cpp's system info line: SIMD features and compiled backends)."""
    _Backend.ensure()
    return llama_cpp.__version__, llama_cpp.llama_print_system_info().decode("utf-8", errors="replace").strip()


def supports_gpu_offload() -> bool:
    """True when this llama.cpp build can place layers on a GPU of this machine (CUDA, Metal, Vulkan …).
    llama.cpp's own `llama_supports_gpu_offload` also says yes for a CPU-only build with RPC, whose only
    devices are other machines."""
    _Backend.ensure()
    return bool(rpc.local_devices())


@dataclass(frozen=True)
class VocabInfo:
    """The vocabulary facts that decide whether two models can share token ids."""

    vocab_type: int
    n_tokens: int
    bos: int
    eos: int
    add_bos: bool
    add_eos: bool


@dataclass(frozen=True)
class ModelInfo:
    """What `spec models show` reports of a GGUF file, read from its metadata without loading weights."""

    architecture: str
    quantization: str
    context_length: int | None
    vocab_size: int
    has_chat_template: bool
    memory: str  # attention, sliding window, recurrent or hybrid
    rollback: str  # how spec takes rejected tokens back from that memory
    recommended_sampling: dict[str, str]  # the GGUF's general.sampling.* keys (without the prefix), as written
    mtp_layers: int  # multi-token-prediction layers the file carries (nextn_predict_layers)


def model_info(path: Path, max_rollback: int) -> ModelInfo:
    """The report of `path`; `max_rollback` is the K the rollback method is sized for."""
    model = Model(path, vocab_only=True)
    try:
        architecture = model.metadata("general.architecture") or "unknown"
        file_type = model.metadata("general.file_type")
        names = {number: name.upper() for name, number in FTYPES.items()}
        quantization = names.get(int(file_type), f"type {file_type}") if file_type else "unknown"
        context = model.metadata(f"{architecture}.context_length")
        n_swa = model.sliding_window()
        kind = memory.memory_kind(model._handle, n_swa)
        return ModelInfo(architecture, quantization, int(context) if context else None, model.n_vocab,
                         model.chat_template() is not None, kind,
                         memory.rollback_method(kind, n_swa, _in_place_rollback(path, kind, max_rollback)),
                         model.metadata_under("general.sampling."), _nextn_layers(model))
    finally:
        model.close()


def memory_of(path: Path) -> str:
    """The kind of memory of the model in `path` (attention, sliding window, recurrent, hybrid)."""
    model = Model(path, vocab_only=True)
    try:
        return memory.memory_kind(model._handle, model.sliding_window())
    finally:
        model.close()


def mtp_layers(path: Path) -> int:
    """How many multi-token-prediction layers the GGUF in `path` carries, read without loading weights."""
    model = Model(path, vocab_only=True)
    try:
        return _nextn_layers(model)
    finally:
        model.close()


def _nextn_layers(model: Model) -> int:
    """Its `<arch>.nextn_predict_layers`: 0 when the architecture has none or a conversion left them out."""
    written = model.metadata(f"{model.metadata('general.architecture')}.nextn_predict_layers") or "0"
    return int(written) if written.isdigit() else 0


def _in_place_rollback(path: Path, kind: str, max_rollback: int) -> int:
    """How many tokens llama.cpp rolls back in place for this model (0 where it cannot). Only a context
    says, so recurrent and hybrid models are loaded (memory-mapped) for a small one."""
    if kind not in (memory.RECURRENT, memory.HYBRID):
        return 0
    model = Model(path)
    try:
        context = Context(model, 64, 1, max_rollback=max_rollback)
        context.close()
        return context.memory.n_rs_seq
    finally:
        model.close()


class Model:
    """A loaded GGUF model: weights, vocabulary and metadata."""

    def __init__(self, path: str | os.PathLike[str], gpu_layers: int = 0, vocab_only: bool = False,
                 devices: ctypes.Array[ctypes.c_void_p] | None = None, tensor_split: Sequence[float] = (),
                 load_mtp: bool = False, drafts: bool = False, extra_buffers: bool | None = None) -> None:
        """Load `path`; with `vocab_only` only the vocabulary and metadata (fast: no weights are read).

        `gpu_layers` layers go to `devices` (a NULL-terminated list from `rpc.device_list`; None: the GPUs
        llama.cpp finds), weighted by `tensor_split` (one weight per device; empty: by free memory); the
        rest stay on the CPU. `load_mtp` also loads the model's multi-token-prediction layers, which
        llama.cpp skips otherwise (`n_layer_mtp` counts them either way).

        llama.cpp's extra buffer types (repacked weights, AMX) are used as far as this machine runs them
        (`kernels.verdict`): for a model that `drafts`, possibly with one-token batches only
        (`one_token_batches`: its contexts then decode a batch token by token); `extra_buffers` decides by
        hand (the probe itself does).
        """
        self.path = Path(path)
        check_gguf(self.path)
        _Backend.ensure()
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = gpu_layers
        params.vocab_only = vocab_only
        if extra_buffers is None and not vocab_only:
            found = kernels.verdict()
            extra_buffers = found.extra_buffers(drafts)
            self.one_token_batches = extra_buffers and not found.batches_run
        else:
            self.one_token_batches = False
        self.extra_buffers = bool(extra_buffers)
        params.use_extra_bufts = self.extra_buffers
        params.load_mtp = load_mtp
        if devices is not None:
            params.devices = ctypes.cast(devices, ctypes.c_void_p)
        if tensor_split:
            params.tensor_split = (ctypes.c_float * llama_cpp.llama_max_devices())(*tensor_split)
        _Backend.forget()
        handle = llama_cpp.llama_model_load_from_file(str(self.path).encode(), params)
        if not handle:
            raise SpecError(f"llama.cpp could not load {self.path}: {_Backend.message('unknown error')}")
        self._handle = handle
        self._vocab = llama_cpp.llama_model_get_vocab(handle)
        self.n_vocab: int = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self.n_ctx_train: int = llama_cpp.llama_model_n_ctx_train(handle)
        self.n_embd: int = llama_cpp.llama_model_n_embd(handle)
        self.n_layer_mtp: int = llama_cpp.llama_model_n_layer_nextn(handle)
        self.mtp_loaded = load_mtp and self.n_layer_mtp > 0
        self.placement = "CPU" if gpu_layers == 0 else "the devices llama.cpp finds"  # `pair._load` says which

    def vocab_info(self) -> VocabInfo:
        v = self._vocab
        return VocabInfo(
            vocab_type=llama_cpp.llama_vocab_type(v),
            n_tokens=self.n_vocab,
            bos=llama_cpp.llama_vocab_bos(v),
            eos=llama_cpp.llama_vocab_eos(v),
            add_bos=bool(llama_cpp.llama_vocab_get_add_bos(v)),
            add_eos=bool(llama_cpp.llama_vocab_get_add_eos(v)),
        )

    def token_text(self, token: int) -> bytes:
        """The vocabulary entry of `token` as stored in the GGUF (not detokenized)."""
        return llama_cpp.llama_vocab_get_text(self._vocab, token) or b""

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        """Tokens for `text`, special tokens parsed; BOS is added when the model asks for it, unless
        `add_special` is False (text that continues a conversation already under way)."""
        return self.tokenize_bytes(text.encode("utf-8"), add_special, parse_special=True)

    def tokenize_bytes(self, data: bytes, add_special: bool, parse_special: bool) -> list[int]:
        """Tokens for UTF-8 `data`; with `parse_special`, the text of special tokens becomes those tokens."""
        capacity = len(data) + 8
        buf = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_special, parse_special)
        if n < 0:
            capacity = -n
            buf = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes `token` contributes to generated text (control tokens contribute none, or their own
        text with `special`)."""
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def is_control(self, token: int) -> bool:
        """A control token (BOS, end of turn, a chat template's markers): text no tokenizer spells unasked."""
        return bool(llama_cpp.llama_vocab_get_attr(self._vocab, token) & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL)

    @property
    def adds_space_prefix(self) -> bool:
        """SentencePiece vocabularies that put a space before text that starts a fragment (Llama 2's, not
        Gemma's): tokenizing a piece of a text adds a space it did not have."""
        return self.metadata("tokenizer.ggml.add_space_prefix") != "false" and \
            llama_cpp.llama_vocab_type(self._vocab) == llama_cpp.LLAMA_VOCAB_TYPE_SPM

    def is_end_of_generation(self, token: int) -> bool:
        """EOS, end-of-turn and the other tokens llama.cpp marks as ending generation."""
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def metadata(self, key: str) -> str | None:
        """A GGUF metadata value as text (e.g. "general.architecture"), or None when the key is absent."""
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_model_meta_val_str(self._handle, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            llama_cpp.llama_model_meta_val_str(self._handle, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def metadata_under(self, prefix: str) -> dict[str, str]:
        """Every metadata key starting with `prefix` (e.g. "general.sampling."), without it, with its value."""
        found = {}
        buf = ctypes.create_string_buffer(256)
        for i in range(llama_cpp.llama_model_meta_count(self._handle)):
            if llama_cpp.llama_model_meta_key_by_index(self._handle, i, buf, len(buf)) < 0:
                continue
            key = buf.value.decode("utf-8", errors="replace")
            value = self.metadata(key) if key.startswith(prefix) else None
            if value is not None:
                found[key[len(prefix):]] = value
        return found

    def sliding_window(self) -> int:
        """The attention window in tokens, 0 for none. A vocab-only load leaves llama.cpp's own field at 0,
        so the GGUF key that llama.cpp reads it from is asked as well."""
        key = f"{self.metadata('general.architecture')}.attention.sliding_window"
        written = self.metadata(key) or "0"
        return max(llama_cpp.llama_model_n_swa(self._handle), int(written) if written.isdigit() else 0)

    def chat_template(self) -> str | None:
        raw = llama_cpp.llama_model_chat_template(self._handle, None)
        return raw.decode("utf-8") if raw else None

    def format_chat(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True,
                    template: str | None = None) -> str:
        """Render `messages` with `template` (a Jinja chat template), by default the model's own, ready
        for `tokenize`.

        Templates usually write the BOS text themselves; it is removed here when the tokenizer adds BOS
        anyway, so the prompt never starts with two.
        """
        template = template or self.chat_template()
        if template is None:
            raise SpecError(f"{self.path.name} has no chat template in its GGUF metadata; give one with "
                            f"--chat-format (chatml, or a Jinja file)")
        info = self.vocab_info()
        bos_text = self.token_text(info.bos).decode("utf-8", errors="replace") if info.bos >= 0 else ""
        eos_text = self.token_text(info.eos).decode("utf-8", errors="replace") if info.eos >= 0 else ""
        formatter = Jinja2ChatFormatter(template=template, eos_token=eos_text, bos_token=bos_text,
                                        add_generation_prompt=add_generation_prompt)
        try:
            prompt = formatter(messages=list(messages)).prompt
        except Exception as exc:  # a broken template is the model file's fault, not ours
            raise SpecError(f"the chat template of {self.path.name} failed: {exc}") from exc
        if info.add_bos and bos_text and prompt.startswith(bos_text):
            prompt = prompt[len(bos_text):]
        return prompt

    def close(self) -> None:
        if self._handle:
            llama_cpp.llama_model_free(self._handle)
            self._handle = None


def common_prefix(held: Sequence[int], tokens: Sequence[int]) -> int:
    """How many tokens a memory holding `held` can keep of a new sequence `tokens`."""
    keep = 0
    for cached, token in zip(held, tokens):
        if cached != token:
            break
        keep += 1
    return keep


def _new_context(model: Model, n_ctx: int, n_batch: int, n_threads: int, what: str,
                 **settings: object) -> llama_cpp.llama_context_p:
    """A llama.cpp context for one sequence over `model`, decoding batches of `n_batch` on `n_threads`;
    `settings` are further llama_context_params fields, `what` names it in the error."""
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = n_ctx
    params.n_batch = params.n_ubatch = n_batch
    params.n_seq_max = 1
    params.n_threads = params.n_threads_batch = n_threads
    params.no_perf = True
    for name, value in settings.items():
        setattr(params, name, value)
    _Backend.forget()
    handle = llama_cpp.llama_init_from_model(model._handle, params)
    if not handle:
        raise SpecError(f"llama.cpp could not create {what} for {model.path.name}: "
                        f"{_Backend.message('out of memory?')}")
    return handle


class Context:
    """One sequence's memory over a `Model`, fed token batches at increasing positions of sequence 0.

    `tokens` is what the memory holds. Going back (`trim`) is left to the memory's strategy (`memory.py`):
    a cut, an in-place rollback, or a snapshot restored and the kept tokens replayed; `rollback_s` is the
    time that costs (saving snapshots included). Decoding and trimming count in `busy_s`; the prompt's
    snapshot does not.
    """

    def __init__(self, model: Model, n_ctx: int, n_threads: int, n_batch: int = 512, max_rollback: int = 0,
                 hidden_states: bool = False, n_ubatch: int | None = None) -> None:
        """`max_rollback`: the most tokens one speculative round may discard (K); recurrent memories that
        llama.cpp can roll back in place keep that many states per sequence. `hidden_states`: keep, in
        `hidden`, the hidden state the model exports for its MTP head (llama.cpp's h_nextn; for qwen35 the
        last layer's, after the output norm) at every position decoded, replays included. `n_ubatch`: the
        tokens llama.cpp computes at once (default: the batch; 1 over a model with `one_token_batches`)."""
        self.model = model
        self.n_batch = min(n_batch, n_ctx)
        # n_rs_seq: llama.cpp sets it to 0 for architectures it cannot roll back in place. swa_full off: a
        # sliding-window cache of window + one batch, not of the whole context, a fraction of the memory on
        # long contexts (Gemma 3 27B at 8k: ~0.8 instead of ~4 GB); memory.py handles the cuts it prunes.
        self.n_ubatch = n_ubatch or (1 if model.one_token_batches else self.n_batch)
        handle = _new_context(model, n_ctx, self.n_batch, n_threads, f"a {n_ctx}-token context",
                              n_rs_seq=max_rollback, swa_full=False, n_ubatch=self.n_ubatch)
        self._handle = handle
        self.memory = memory.for_context(handle, model._handle, model.path.name)
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        # llama.cpp rounds the size up (to 256s); the user's number is the limit we keep to.
        self.n_ctx: int = min(n_ctx, llama_cpp.llama_n_ctx(handle))
        self.tokens: list[int] = []
        self.busy_s = 0.0
        self._trim_s = 0.0
        # Row p: h_p as last computed. Valid for every position of the sequence decoded with its current tokens,
        # those a rollback took back included (their h does not change); rows of rejected drafts are stale.
        self.hidden: np.ndarray | None = None
        if hidden_states:
            llama_cpp_ext.llama_set_embeddings_nextn(handle, True, False)  # every row, not only those with logits
            self.hidden = np.zeros((self.n_ctx, model.n_embd), dtype=np.float32)

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
        if self.n_past + len(tokens) > self.n_ctx:
            raise RuntimeError(f"decode past the context: {self.n_past} + {len(tokens)} > {self.n_ctx}")
        if n_logits > min(len(tokens), self.n_batch):
            raise ValueError(f"cannot return {n_logits} logit rows for a batch of {len(tokens)}")
        n_final = len(tokens) if n_final is None else n_final
        if 1 < n_final and n_logits <= len(tokens) - n_final + 1 and self.memory.saves_before(len(tokens), n_final):
            # The sure tokens before the last one are what the last restore took back (the target's
            # verify batch feeds them again). The snapshot belongs after them, or the next rollback would
            # take them back once more: replay them on their own, as part of the rollback's cost.
            started = time.perf_counter()
            self.decode(tokens[:n_final - 1], 0)
            self._trim_s += time.perf_counter() - started
            tokens, n_final = tokens[n_final - 1:], 1
        started = time.perf_counter()
        self.memory.before_decode(self.n_past, len(tokens), n_final)
        rows = self._decode(tokens, n_logits)
        self.busy_s += time.perf_counter() - started
        return rows

    def _decode(self, tokens: Sequence[int], n_logits: int) -> np.ndarray:
        first_output = len(tokens) - n_logits
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start:start + self.n_batch]
            self._fill_batch(chunk, first_output - start)
            _Backend.forget()
            status = llama_cpp.llama_decode(self._handle, self._batch)
            if status != 0:
                self._fail(status)
            if self.hidden is not None:
                rows = llama_cpp_ext.llama_get_embeddings_nextn(self._handle)
                self.hidden[self.n_past:self.n_past + len(chunk)] = np.ctypeslib.as_array(
                    rows, shape=(len(chunk), self.model.n_embd))
            self.tokens.extend(chunk)
        if n_logits == 0:
            return np.empty((0, self.model.n_vocab), dtype=np.float32)
        logits = llama_cpp.llama_get_logits(self._handle)
        return np.ctypeslib.as_array(logits, shape=(n_logits, self.model.n_vocab)).copy()

    def _fail(self, status: int) -> None:
        """llama.cpp refused a batch: forget everything (the memory may hold part of it) and say why."""
        self.memory.clear()
        self.tokens.clear()
        reason = "no room in the memory" if status == 1 else f"status {status}"
        raise SpecError(f"llama.cpp could not decode with {self.model.path.name}: {_Backend.message(reason)}")

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
            self.memory.after_prompt(self.n_past)
        return reused

    def _fill_batch(self, chunk: Sequence[int], first_output: int) -> None:
        batch = self._batch
        batch.n_tokens = len(chunk)
        for i, token in enumerate(chunk):
            batch.token[i] = token
            batch.pos[i] = self.n_past + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i >= first_output

    def trim(self, n_keep: int) -> None:
        """Forget every position from `n_keep` on: keep at most `n_keep` tokens.

        A memory that cannot cut there goes back further (to a snapshot, or to the start); every caller
        feeds what it lacks with its next decode (a drafter's catch-up, the target's next verify batch).
        The memory is asked even when nothing seems to be beyond `n_keep`: a Ctrl-C that lands between
        `llama_decode` and the bookkeeping above leaves llama.cpp holding positions that `tokens` lacks.
        """
        n_keep = min(n_keep, self.n_past)
        if n_keep >= max(self.n_past, self.memory.held()):
            return
        started = time.perf_counter()
        del self.tokens[self.memory.rollback(n_keep):]
        elapsed = time.perf_counter() - started
        self._trim_s += elapsed
        self.busy_s += elapsed

    def close(self) -> None:
        if self._handle:
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self._handle)
            self._handle = None


class HeadContext:
    """The memory of a model's multi-token-prediction (MTP) head, over the weights of a `Model` loaded with
    `load_mtp`: llama.cpp's MTP context, fed through its extended batch.

    Position p holds the pair (x_p, h_{p-1}): a token and the hidden state that preceded it (the target's, or
    the head's own while drafting). Decoding a pair yields the head's logits for x_{p+1} and its own hidden
    state, which the next draft step pairs with the drafted token. The memory is a plain KV cache over the
    MTP layer, so taking tokens back is a cut.
    """

    def __init__(self, model: Model, n_ctx: int, n_threads: int, n_batch: int = 512) -> None:
        self.model = model
        self.n_batch = min(n_batch, n_ctx)
        handle = _new_context(model, n_ctx, self.n_batch, n_threads, "the MTP context",
                              ctx_type=llama_cpp.LLAMA_CONTEXT_TYPE_MTP, n_rs_seq=0)
        self._handle = handle
        llama_cpp_ext.llama_set_embeddings_nextn(handle, True, True)  # the head's hidden state, output rows only
        self._batch = llama_cpp.llama_batch_ext_init(handle)
        self._position = (llama_cpp.llama_pos * 4)()  # M-RoPE models take 4; a token row reads the first
        self.tokens: list[int] = []
        self.busy_s = 0.0

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def decode(self, tokens: Sequence[int], hidden: np.ndarray, n_outputs: int) -> tuple[np.ndarray, np.ndarray]:
        """Append the pairs (tokens[i], hidden[i]); return the logits and the head's hidden states of the last
        `n_outputs` pairs, one row each."""
        started = time.perf_counter()
        hidden = np.ascontiguousarray(hidden, dtype=np.float32)
        first_output = len(tokens) - n_outputs
        for start in range(0, len(tokens), self.n_batch):
            chunk = range(start, min(start + self.n_batch, len(tokens)))
            llama_cpp.llama_batch_ext_clear(self._batch)
            for i in chunk:
                index = llama_cpp.llama_batch_ext_add_token(self._batch, 0, tokens[i])
                self._position[0] = self.n_past + i - start
                llama_cpp.llama_batch_ext_set_pos(self._batch, index, self._position)
                row = hidden[i].ctypes.data_as(ctypes.POINTER(ctypes.c_float))
                llama_cpp.llama_batch_ext_set_embd_token(self._batch, index, llama_cpp.llama_embd(row, 1, hidden.shape[1]))
                if i >= first_output:
                    llama_cpp.llama_batch_ext_set_output_logits(self._batch, index, True)
            _Backend.forget()
            status = llama_cpp.llama_process(self._handle, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, self._batch)
            if status != 0:
                self.trim(0)
                raise SpecError(f"llama.cpp could not run the MTP head of {self.model.path.name}: "
                                f"{_Backend.message(f'status {status}')}")
            self.tokens.extend(tokens[i] for i in chunk)
        self.busy_s += time.perf_counter() - started
        if n_outputs == 0:
            return np.empty((0, self.model.n_vocab), np.float32), np.empty((0, self.model.n_embd), np.float32)
        logits = llama_cpp.llama_get_logits(self._handle)
        states = llama_cpp_ext.llama_get_embeddings_nextn(self._handle)
        return (np.ctypeslib.as_array(logits, shape=(n_outputs, self.model.n_vocab)).copy(),
                np.ctypeslib.as_array(states, shape=(n_outputs, self.model.n_embd)).copy())

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


def check_ftype(ftype: str) -> None:
    if ftype not in FTYPES:
        raise SpecError(f"unknown type {ftype!r}; choose one of: {', '.join(FTYPES)}")


def quantize(source: Path, dest: Path, ftype: str, n_threads: int) -> None:
    """Re-encode the GGUF `source` as `ftype` into `dest` with llama.cpp's quantizer.

    Writes `dest` directly; callers that need atomicity write to a temporary name and rename.
    """
    check_gguf(source)
    check_ftype(ftype)
    _Backend.ensure()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[ftype]
    params.nthread = n_threads
    params.allow_requantize = True
    _Backend.forget()
    status = llama_cpp.llama_model_quantize(str(source).encode(), str(dest).encode(), ctypes.byref(params))
    if status != 0:
        raise SpecError(f"llama.cpp could not re-encode {source} as {ftype}: {_Backend.message(f'status {status}')}")
