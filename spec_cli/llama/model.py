"""A GGUF model loaded through llama-cpp-python's low-level API: weights, vocabulary, metadata, the chat
template; and llama.cpp's backend, initialised once with its log collected for our one-line errors.

llama-cpp-python's high-level `Llama` class is not used: it keeps logits for every position, offers no way
to drive two models in lock-step, and turns on kernels that crash on some CPUs (`kernels`).
"""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import llama_cpp
import numpy as np
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from spec_cli.errors import SpecError
from spec_cli.llama import kernels, rpc
from spec_cli.llama.prompt_text import IMAGE_MARKER, ControlToken, ControlTokens, PromptText, render_chat

GGUF_MAGIC = b"GGUF"
_GGML_LOG_LEVEL_WARN = 3
_GGML_LOG_LEVEL_ERROR = 4
_GGML_LOG_LEVEL_CONT = 5


class Backend:
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
        target = Backend._continued
        if level == _GGML_LOG_LEVEL_CONT and target:
            target[-1] = f"{target[-1]} {line}".strip()
        elif level in (_GGML_LOG_LEVEL_ERROR, _GGML_LOG_LEVEL_WARN):
            Backend._continued = Backend.errors if level == _GGML_LOG_LEVEL_ERROR else Backend.warnings
            Backend._continued.append(line)
        else:
            Backend._continued = None

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
    Backend.ensure()
    return llama_cpp.__version__, llama_cpp.llama_print_system_info().decode("utf-8", errors="replace").strip()


def supports_gpu_offload() -> bool:
    """True when this llama.cpp build can place layers on a GPU of this machine (CUDA, Metal, Vulkan …).
    llama.cpp's own `llama_supports_gpu_offload` also says yes for a CPU-only build with RPC, whose only
    devices are other machines."""
    Backend.ensure()
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
        Backend.ensure()
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
        Backend.forget()
        handle = llama_cpp.llama_model_load_from_file(str(self.path).encode(), params)
        if not handle:
            raise SpecError(f"llama.cpp could not load {self.path}: {Backend.message('unknown error')}")
        self._handle = handle
        self._vocab = llama_cpp.llama_model_get_vocab(handle)
        self.n_vocab: int = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self.n_ctx_train: int = llama_cpp.llama_model_n_ctx_train(handle)
        self.size: int = llama_cpp.llama_model_size(handle)  # bytes of weights: what a pass reads
        self.n_embd: int = llama_cpp.llama_model_n_embd(handle)
        self.n_layer: int = llama_cpp.llama_model_n_layer(handle)
        self.n_layer_mtp: int = llama_cpp.llama_model_n_layer_nextn(handle)
        self.mtp_loaded = load_mtp and self.n_layer_mtp > 0
        self.placement = "CPU" if gpu_layers == 0 else "the devices llama.cpp finds"  # `placement.load_model` says which

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

    def tokenize_prompt(self, prompt: PromptText, add_special: bool = True,
                        images: Sequence[Sequence[int]] = ()) -> list[int]:
        """Tokens for `prompt`: as `tokenize` where it marks no message text; else split at the control tokens
        outside its message text, as llama.cpp splits text, and each fragment tokenized as plain text.
        `images`: the ids of each image (`vision.Projector.see`), in the place of each `IMAGE_MARKER` in turn."""
        pending = list(images)
        if not prompt.plain:
            tokens = self._with_images(prompt.text, add_special, True, pending)
        else:
            info = self.vocab_info()
            tokens = [info.bos] if add_special and info.add_bos else []
            for piece in self.control_tokens.partition(prompt):
                if isinstance(piece, int):
                    tokens.append(piece)
                else:
                    tokens += self._with_images(prompt.text[piece[0]:piece[1]], False, False, pending)
            tokens += [info.eos] if add_special and info.add_eos else []
        if pending:
            raise SpecError(f"the chat template of {self.path.name} left out {len(pending)} of the prompt's images")
        return tokens

    def _with_images(self, text: str, add_special: bool, parse_special: bool, pending: list[Sequence[int]]) -> list[int]:
        """Tokens for `text`, each `IMAGE_MARKER` in it replaced by the next of `pending`."""
        fragments = text.split(IMAGE_MARKER)
        tokens = self.tokenize_bytes(fragments[0].encode("utf-8"), add_special, parse_special)
        for fragment in fragments[1:]:
            if not pending:
                raise SpecError(f"the chat template of {self.path.name} repeats the prompt's images")
            tokens += pending.pop(0)
            tokens += self.tokenize_bytes(fragment.encode("utf-8"), False, parse_special) if fragment else []
        return tokens

    @functools.cached_property
    def control_tokens(self) -> ControlTokens:
        """The tokens llama.cpp parses out of text with `parse_special` (control and unknown ones)."""
        found = []
        for token in range(self.n_vocab):
            attr = llama_cpp.llama_vocab_get_attr(self._vocab, token)
            text = self.token_text(token).decode("utf-8", errors="replace")
            if attr & (llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN) and text:
                found.append(ControlToken(token, text, bool(attr & llama_cpp.LLAMA_TOKEN_ATTR_LSTRIP),
                                          bool(attr & llama_cpp.LLAMA_TOKEN_ATTR_RSTRIP)))
        return ControlTokens(found)

    @functools.cached_property
    def end_of_generation_tokens(self) -> np.ndarray:
        return np.array([t for t in range(self.n_vocab) if self.is_end_of_generation(t)], dtype=np.int64)

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

    @property
    def vocab(self) -> llama_cpp.llama_vocab_p:
        """The vocabulary's handle, for llguidance's tokenizer bridge (`grammar`)."""
        return self._vocab

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

    @functools.cached_property
    def fim_tokens(self) -> dict[str, int]:
        """The fill-in-the-middle tokens the vocabulary names, by llama.cpp's names: pre, suf and mid, and rep and
        sep where it has the repo-level pattern's (those it lacks are left out)."""
        found = {name: getattr(llama_cpp, f"llama_vocab_fim_{name}")(self._vocab)
                 for name in ("pre", "suf", "mid", "rep", "sep")}
        return {name: token for name, token in found.items() if token != llama_cpp.LLAMA_TOKEN_NULL}

    @property
    def kv_bytes_per_token(self) -> int:
        """At most what one token of context holds in the KV cache: F16 keys and values in every layer, over the
        key/value heads (a sliding-window or recurrent layer holds less)."""
        n_head = llama_cpp.llama_model_n_head(self._handle)
        n_head_kv = llama_cpp.llama_model_n_head_kv(self._handle)
        return 2 * 2 * self.n_layer * self.n_embd * max(n_head_kv, 1) // max(n_head, 1)

    @property
    def rope_scaled(self) -> bool:
        """Whether the GGUF declares RoPE scaling (YaRN, linear…): a context past the trained one is meant."""
        scaling = self.metadata(f"{self.metadata('general.architecture')}.rope.scaling.type")
        return (scaling not in (None, "none")) or llama_cpp.llama_model_rope_freq_scale_train(self._handle) != 1.0

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

    def format_chat(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True,
                    template: str | None = None, tools: Sequence[dict[str, Any]] | None = None) -> PromptText:
        """Render `messages` with `template` (a Jinja chat template), by default the model's own, ready for
        `tokenize_prompt`: the template's markers are control tokens, the messages' text is text
        (`prompt_text.render_chat`). `tools` (OpenAI's tool objects) are handed to templates that take them.

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

        def render(listed: list[dict[str, Any]]) -> str:
            try:
                return formatter(messages=listed, tools=tools).prompt
            except Exception as exc:  # a broken template is the model file's fault, not ours
                raise SpecError(f"the chat template of {self.path.name} failed: {exc}") from exc

        prompt = render_chat(render, messages, self.control_tokens)
        if info.add_bos and bos_text and prompt.text.startswith(bos_text):
            prompt = prompt.after(len(bos_text))
        return prompt

    def close(self) -> None:
        if self._handle:
            llama_cpp.llama_model_free(self._handle)
            self._handle = None
