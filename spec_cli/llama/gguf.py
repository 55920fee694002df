"""What a GGUF file is, read without loading its weights (architecture, type, memory, MTP layers, the
sampling it recommends), and re-encoding one with llama.cpp's quantizer.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

from spec_cli.errors import SpecError
from spec_cli.llama import memory
from spec_cli.llama.context import Context
from spec_cli.llama.model import Backend, Model, check_gguf

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


def check_ftype(ftype: str) -> None:
    if ftype not in FTYPES:
        raise SpecError(f"unknown type {ftype!r}; choose one of: {', '.join(FTYPES)}")


def quantize(source: Path, dest: Path, ftype: str, n_threads: int) -> None:
    """Re-encode the GGUF `source` as `ftype` into `dest` with llama.cpp's quantizer.

    Writes `dest` directly; callers that need atomicity write to a temporary name and rename.
    """
    check_gguf(source)
    check_ftype(ftype)
    Backend.ensure()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[ftype]
    params.nthread = n_threads
    params.allow_requantize = True
    Backend.forget()
    status = llama_cpp.llama_model_quantize(str(source).encode(), str(dest).encode(), ctypes.byref(params))
    if status != 0:
        raise SpecError(f"llama.cpp could not re-encode {source} as {ftype}: {Backend.message(f'status {status}')}")
