"""Tiny llama-architecture GGUF models written with the `gguf` package, for real llama.cpp loading in tests.

Two layers, 64-wide, a 320-token SentencePiece vocabulary (3 specials, 256 byte tokens, letters and a few
pieces), random weights from a fixed seed. Models written with different seeds share the vocabulary, so
they pair with each other; `rename_token` makes a vocabulary that does not.
"""

from __future__ import annotations

import string
from pathlib import Path

import gguf
import numpy as np

N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2
N_FF = 128
N_LAYER = 2
N_CTX_TRAIN = 512
UNKNOWN, CONTROL, NORMAL, BYTE = 2, 3, 1, 6

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)


def vocabulary(size: int = 320) -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [UNKNOWN, CONTROL, CONTROL] + [BYTE] * 256
    pieces = ["▁", *string.ascii_lowercase, *[f"▁{c}" for c in string.ascii_lowercase], "▁the", "▁and", "er", "in"]
    for piece in pieces[: size - len(tokens)]:
        tokens.append(piece)
        types.append(NORMAL)
    while len(tokens) < size:
        tokens.append(f"[unused{len(tokens)}]")
        types.append(NORMAL)
    scores = [0.0] * 259 + [-float(i) for i in range(size - 259)]
    return tokens, scores, types


def write_model(path: Path, seed: int, *, vocab_size: int = 320, rename_token: int | None = None,
                chat_template: str | None = None, eos: int = 2, output_scale: float = 1.0) -> Path:
    """Write a tiny random llama model to `path`; `output_scale` widens the logits (fewer near-ties)."""
    rng = np.random.default_rng(seed)
    tokens, scores, types = vocabulary(vocab_size)
    if rename_token is not None:
        tokens[rename_token] = tokens[rename_token] + "_renamed"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"tiny-{seed}")
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_file_type(0)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(eos)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)

    def weight(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale / np.sqrt(shape[-1])).astype(np.float32)

    head_dim = N_EMBD // N_HEAD
    writer.add_tensor("token_embd.weight", weight(vocab_size, N_EMBD, scale=8.0))
    for i in range(N_LAYER):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", weight(N_EMBD, N_EMBD))
        writer.add_tensor(f"blk.{i}.attn_k.weight", weight(N_HEAD_KV * head_dim, N_EMBD))
        writer.add_tensor(f"blk.{i}.attn_v.weight", weight(N_HEAD_KV * head_dim, N_EMBD))
        writer.add_tensor(f"blk.{i}.attn_output.weight", weight(N_EMBD, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(N_EMBD, N_FF))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    writer.add_tensor("output.weight", weight(vocab_size, N_EMBD, scale=4.0 * output_scale))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
