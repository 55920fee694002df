"""What a target hands a drafter trained on its hidden states (EAGLE-3, DFlash): the inputs of a few of its
layers at every position it decodes, and which drafter files and targets can do that.

llama.cpp exports the calls that turn those outputs on and read them only under their C++ names
(`src/llama-ext.h`); they are bound here, once. A target whose graph does not record its layer inputs makes
llama.cpp abort (`GGML_ASSERT … layer input tensor is null`), so `check_pair` refuses such a pair, and any
other mismatch of drafter and target, in one line before a context is made.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

from spec_cli.errors import SpecError
from spec_cli.llama.model import Model

EAGLE3, DFLASH = "eagle3", "dflash"

# The architectures whose graph in the pinned llama.cpp sets `t_layer_inp` (src/models/*.cpp), by their
# `general.architecture` names: only these can feed an EAGLE-3 or DFlash drafter.
FEEDING_ARCHS = frozenset({
    "bailingmoe3", "deepseek4", "gemma4", "gpt-oss", "hunyuan_vl", "lfm2", "llama", "mimo2", "minimax-01",
    "minimax-m2", "muse-glimmer", "nanbeige", "nemotron_h", "qwen3", "qwen35", "qwen35moe", "qwen3moe",
    "qwen3next", "qwen4exp",
})

DFLASH_BLOCK_DEFAULT = 16  # what llama.cpp assumes when `dflash.block_size` is missing

_lib = llama_cpp.llama_cpp._lib
_set_layer_inp = _lib["_Z30llama_set_embeddings_layer_inpP13llama_contextjb"]
_set_layer_inp.argtypes = [llama_cpp.llama_context_p_ctypes, ctypes.c_uint32, ctypes.c_bool]
_set_layer_inp.restype = None
_get_layer_inp = _lib["_Z30llama_get_embeddings_layer_inpP13llama_contextj"]
_get_layer_inp.argtypes = [llama_cpp.llama_context_p_ctypes, ctypes.c_uint32]
_get_layer_inp.restype = ctypes.POINTER(ctypes.c_float)
_target_layer_ids = _lib["_Z28llama_model_target_layer_idsPK11llama_model"]
_target_layer_ids.argtypes = [llama_cpp.llama_model_p_ctypes]
_target_layer_ids.restype = ctypes.POINTER(ctypes.c_int32)
_target_layer_ids_n = _lib["_Z30llama_model_target_layer_ids_nPK11llama_model"]
_target_layer_ids_n.argtypes = [llama_cpp.llama_model_p_ctypes]
_target_layer_ids_n.restype = ctypes.c_uint32


@dataclass(frozen=True)
class DrafterFile:
    """What a drafter GGUF says of itself: its kind, the target layers whose inputs it reads (in the order
    its fc concatenates them), the target width it was trained on, and for DFlash its block size, mask
    token and whether the block attends causally (`dflash.attention.causal`; DFlash's own is non-causal)."""

    kind: str
    target_layers: tuple[int, ...]
    target_width: int
    block_size: int = 0
    mask_token: int = -1
    causal: bool = False
    variant: str = ""  # "DFlash2" or "DSpark" for the DFlash variants whose drafts are not the block's rows

    @property
    def label(self) -> str:
        return "EAGLE-3 head" if self.kind == EAGLE3 else "DFlash block"

    def describe(self) -> str:
        """The drafter in words, for reports."""
        layers = ", ".join(map(str, self.target_layers))
        if self.kind == EAGLE3:
            return f"EAGLE-3 head reading target layers {layers} (trained on a target {self.target_width} wide)"
        return (f"DFlash block of {self.block_size} (up to {self.block_size - 1} drafts a pass) reading target "
                f"layers {layers}; mask token {self.mask_token}")


def drafter_file(model: Model) -> DrafterFile | None:
    """The drafter `model` is, None for an ordinary model. It must be loaded (memory-mapped is enough): a
    vocabulary-only load leaves out the target layers and widths."""
    kind = model.metadata("general.architecture")
    if kind not in (EAGLE3, DFLASH):
        return None
    ids = _target_layer_ids(model._handle)  # an array: llama.cpp keeps no text of it
    layers = tuple(ids[i] for i in range(_target_layer_ids_n(model._handle))) if ids else ()
    if kind == EAGLE3:
        return DrafterFile(kind, layers, int(model.metadata(f"{kind}.target_hidden_size") or 0))
    block = int(model.metadata(f"{kind}.block_size") or DFLASH_BLOCK_DEFAULT)
    variant = ("DFlash2" if model.metadata(f"{kind}.selector_top_k") else
               "DSpark" if any(model.metadata(f"{kind}.{key}") is not None
                               for key in ("sample_from_anchor", "has_confidence_head")) else "")
    return DrafterFile(kind, layers, model.n_embd, block, llama_cpp.llama_vocab_mask(model._vocab),
                       model.metadata(f"{kind}.attention.causal") == "true", variant)


def is_drafter(path: Path) -> bool:
    """Whether the GGUF in `path` is an EAGLE-3 or DFlash drafter, read without its weights."""
    model = Model(path, vocab_only=True)
    try:
        return model.metadata("general.architecture") in (EAGLE3, DFLASH)
    finally:
        model.close()


def check_pair(target: Model, drafter: Model, found: DrafterFile) -> None:
    """One line for each way the pair cannot work, before llama.cpp would abort over it: a target that does
    not record its layer inputs, another width, layer count or vocabulary than the drafter was trained on,
    a DFlash file without a mask token."""
    name, arch = drafter.path.name, target.metadata("general.architecture") or "unknown"
    if arch not in FEEDING_ARCHS:
        raise SpecError(f"{target.path.name} ({arch}) cannot feed the {found.label} {name}: llama.cpp records "
                        f"layer inputs only for {', '.join(sorted(FEEDING_ARCHS))}")
    if found.target_width != target.n_embd:
        raise SpecError(f"{name} was trained on a target {found.target_width} wide, but {target.path.name} is "
                        f"{target.n_embd} wide: give the target it was made for")
    n_layer = target.n_layer
    if found.kind == EAGLE3 and len(found.target_layers) != 3:
        raise SpecError(f"{name} is not a usable EAGLE-3 head: it reads {len(found.target_layers)} target "
                        "layers, not 3")
    if not found.target_layers or max(found.target_layers) >= n_layer or min(found.target_layers) < 0:
        last = " (the last one's output, which spec-cli does not feed yet)" if n_layer in found.target_layers else ""
        raise SpecError(f"{name} reads target layers {list(found.target_layers)}{last}, but {target.path.name} "
                        f"has {n_layer}: give the target it was made for")
    if drafter.n_vocab != target.n_vocab:
        raise SpecError(f"{name} has a vocabulary of {drafter.n_vocab} tokens, {target.path.name} one of "
                        f"{target.n_vocab}: give the target it was made for")
    if found.variant:
        raise SpecError(f"{name} is a {found.variant} drafter, whose drafts are not read off its block's rows: "
                        "spec-cli drafts with plain DFlash files only")
    if found.kind == DFLASH and found.mask_token < 0:
        raise SpecError(f"{name} names no mask token (tokenizer.ggml.mask_token_id): DFlash cannot draft with it")


def record_layer_inputs(context: llama_cpp.llama_context_p, layers: tuple[int, ...]) -> None:
    """Make every decode on `context` keep the inputs of `layers` for each of its rows."""
    for layer in layers:
        _set_layer_inp(context, layer, True)


def layer_inputs(context: llama_cpp.llama_context_p, layer: int) -> object:
    """Where llama.cpp holds the input of `layer` for the rows of the last decode on `context`, row after row
    (overwritten by the next one)."""
    return _get_layer_inp(context, layer)
