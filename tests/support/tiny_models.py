"""Tiny GGUF models written with the `gguf` package, for real llama.cpp loading in tests.

Llama, sliding-window, recurrent and hybrid architectures, and a Qwen3.5 with an MTP head; two layers,
64-wide, a 320-token SentencePiece vocabulary (3 specials, 256 byte tokens, letters and a few pieces),
random weights from a fixed seed. Models written with different seeds share the vocabulary, so
they pair with each other; `rename_token` makes a vocabulary that does not, and `tokenizer` writes the
same model over another vocabulary altogether (`Tokenizer`: other merges of the same bytes, other special
tokens, byte-level BPE), for drafting through text.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import gguf
import numpy as np

N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2
N_LAYER = 2
N_CTX_TRAIN = 512
FIM_TOKENS = {"pre": (316, "<|fim_prefix|>"), "suf": (317, "<|fim_suffix|>"), "mid": (318, "<|fim_middle|>")}
UNKNOWN, CONTROL, NORMAL, BYTE = 2, 3, 1, 6

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)


FIRST_BYTE_TOKEN = 3  # the default vocabulary's <0x00>: its byte tokens follow <unk>, <s> and </s>


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


@dataclass(frozen=True)
class Tokenizer:
    """A vocabulary as a GGUF holds it: `model` "llama" (SentencePiece) or "gpt2" (byte-level BPE)."""

    model: str
    tokens: list[str]
    types: list[int]
    bos: int
    eos: int
    add_bos: bool
    scores: list[float] = field(default_factory=list)
    merges: list[str] = field(default_factory=list)
    space_prefix: bool = True

    def text(self, token: int) -> bytes | None:
        """The bytes a normal or byte token spells (None for special tokens)."""
        piece, kind = self.tokens[token], self.types[token]
        if kind == BYTE:
            return bytes([int(piece[3:5], 16)])
        if kind != NORMAL:
            return None
        if self.model == "gpt2":
            return bytes(_GPT2_BYTE[c] for c in piece)
        return piece.replace("▁", " ").encode()


def _gpt2_chars() -> dict[int, str]:
    """GPT-2's byte → printable character map (its byte-level BPE spells every byte as one of these)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


_GPT2_CHAR = _gpt2_chars()
_GPT2_BYTE = {c: b for b, c in _GPT2_CHAR.items()}


def sentencepiece_merged_otherwise() -> Tokenizer:
    """Gemma-like: other special tokens at other ids (EOS 1, BOS 2, a turn marker), no space prefix, and
    other merges of the same bytes ("th", "▁th", "at", "▁ca" … where the default has "▁the", "er")."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [CONTROL, CONTROL, CONTROL, UNKNOWN, CONTROL] + [BYTE] * 256
    pieces = ["▁", *string.ascii_lowercase, "th", "he", "at", "an", "▁t", "▁th", "▁a", "▁c", "▁ca", "▁s",
              "▁sa", "▁h", "▁he", *[f"▁{c}" for c in "bdefgijklmnopqruvwxyz"]]
    tokens += pieces
    types += [NORMAL] * len(pieces)
    scores = [0.0] * 261 + [-float(i) for i in range(len(pieces))]
    return Tokenizer("llama", tokens, types, bos=2, eos=1, add_bos=True, scores=scores, space_prefix=False)


def byte_level_bpe() -> Tokenizer:
    """GPT-2 style, like SmolLM2's: ChatML's specials first (<|endoftext|> both BOS and EOS), the 256 byte
    characters (Ġ is the space), then merges; no BOS added."""
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [_GPT2_CHAR[b] for b in range(256)]
    types = [CONTROL] * 3 + [NORMAL] * 256
    merges = [f"Ġ {c}" for c in string.ascii_lowercase] + ["t h", "Ġt h", "Ġth e", "a t", "e r", "i n", "Ġa n", "Ġan d"]
    for merge in merges:
        tokens.append(merge.replace(" ", ""))
        types.append(NORMAL)
    return Tokenizer("gpt2", tokens, types, bos=0, eos=0, add_bos=False, merges=merges)


def default_tokenizer(size: int = 320, eos: int = 2) -> Tokenizer:
    """The SentencePiece vocabulary of `vocabulary`, BOS added."""
    tokens, scores, types = vocabulary(size)
    return Tokenizer("llama", tokens, types, bos=1, eos=eos, add_bos=True, scores=scores)


def write_tokenizer(writer: gguf.GGUFWriter, tokenizer: Tokenizer, chat_template: str | None) -> None:
    """The vocabulary, its special tokens, F32 weights, and a chat template."""
    writer.add_file_type(0)
    writer.add_tokenizer_model(tokenizer.model)
    writer.add_token_list(tokenizer.tokens)
    writer.add_token_types(tokenizer.types)
    if tokenizer.model == "gpt2":
        writer.add_tokenizer_pre("gpt-2")
        writer.add_token_merges(tokenizer.merges)
    else:
        writer.add_token_scores(tokenizer.scores)
        writer.add_unk_token_id(tokenizer.types.index(UNKNOWN))
        writer.add_add_space_prefix(tokenizer.space_prefix)
    writer.add_bos_token_id(tokenizer.bos)
    writer.add_eos_token_id(tokenizer.eos)
    writer.add_add_bos_token(tokenizer.add_bos)
    writer.add_add_eos_token(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)


def rows_for(tokenizer: Tokenizer) -> tuple[list[int], list[int]]:
    """(tokenizer ids, default-vocabulary ids) of the tokens that spell the same bytes in both, BOS and EOS
    matched by role: a model written over `tokenizer` reuses the default model's embedding and output rows
    there, so it computes what the default model computes on text both spell alike."""
    base = default_tokenizer()
    by_text: dict[bytes, int] = {}
    for token in range(len(base.tokens)):
        text = base.text(token)
        if text is not None and (text not in by_text or base.types[by_text[text]] == BYTE):
            by_text[text] = token
    pairs = {tokenizer.bos: base.bos, tokenizer.eos: base.eos}
    for token in range(len(tokenizer.tokens)):
        text = tokenizer.text(token)
        if text in by_text:
            pairs[token] = by_text[text]
    return list(pairs), list(pairs.values())


ARCHS = ("llama", "gemma3", "mamba", "lfm2", "jamba", "qwen2vl")
ROPE_SECTIONS = [4, 2, 2, 0]  # qwen2vl's M-RoPE: time, height, width (a 16-wide head turns in 8 pairs)
D_CONV, D_STATE, DT_RANK, L_CACHE = 4, 8, 8, 3
EMBEDDING_SCALE = {"gemma3": 0.3}  # gemma3 multiplies embeddings by √n_embd: large ones make it repeat itself


def write_model(path: Path, seed: int, *, arch: str = "llama", vocab_size: int = 320, rename_token: int | None = None,
                chat_template: str | None = None, eos: int = 2, output_scale: float = 1.0, noise: float = 0.0,
                sliding_window: int = 4, n_embd: int = N_EMBD, n_layer: int = N_LAYER,
                layer_scale: float = 1.0, sampling: dict[str, float] | None = None,
                tokenizer: Tokenizer | None = None, plain_output: bool = False,
                kept_layers: int | None = None, rope_scaling: float | None = None, fim: bool = False) -> Path:
    """Write a tiny random model of `arch` to `path`; `output_scale` widens the logits (fewer near-ties).

    `noise` > 0 perturbs every weight of the seed's model by that fraction (drawn from another seed): a
    draft that agrees with the seed's model most of the time, but not always. The architectures cover
    every kind of memory: llama (attention), gemma3 (sliding window of `sliding_window` tokens),
    mamba (recurrent), lfm2 (hybrid that llama.cpp rolls back in place), jamba (hybrid that it cannot); qwen2vl
    is llama with M-RoPE (positions in time, height and width, for images).
    `n_embd` and `n_layer` make larger models for benchmarks (the feed-forward width follows n_embd);
    `layer_scale` < 1 shrinks what each layer adds to the residual stream, for a model that follows its
    input closely (predictable, so a quantized copy of it drafts well). `sampling` writes recommended
    settings as `general.sampling.<key>` (top_k and penalty_last_n as integers). `tokenizer`: the same model
    (same seed, same layers) over another vocabulary (see `rows_for`). `plain_output` zeroes the output rows
    of the default vocabulary's byte and unused tokens, so the model writes mostly letters and words (text
    that two vocabularies can both spell) while byte-fallback tokens still spell what the prompt holds.
    `kept_layers`: write only the first layers of the seed's model, with its embeddings and output (a draft cut
    from it). `rope_scaling`: declare linear RoPE scaling by that factor (a context past the trained one meant).
    `fim`: three unused tokens become a code model's fill-in-the-middle tokens (`FIM_TOKENS`), as the GGUF names them.
    """
    n_ff = 2 * n_embd
    rng = np.random.default_rng(seed)
    noise_rng = np.random.default_rng(seed + 10_000)
    own = default_tokenizer(vocab_size, eos)
    if fim:
        for token, text in FIM_TOKENS.values():
            own.tokens[token], own.types[token] = text, CONTROL
    if rename_token is not None:
        own.tokens[rename_token] = own.tokens[rename_token] + "_renamed"
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-{arch}-{seed}")
    writer.add_context_length(N_CTX_TRAIN)
    for name, (token, _text) in FIM_TOKENS.items() if fim else ():
        writer.add_uint32(f"tokenizer.ggml.fim_{name}_token_id", token)
    if rope_scaling is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope_scaling)
    for key, value in (sampling or {}).items():
        if key in ("top_k", "penalty_last_n"):
            writer.add_int32(f"general.sampling.{key}", int(value))
        else:
            writer.add_float32(f"general.sampling.{key}", value)
    writer.add_embedding_length(n_embd)
    kept = n_layer if kept_layers is None else kept_layers
    writer.add_block_count(kept)
    writer.add_feed_forward_length(n_ff)
    writer.add_layer_norm_rms_eps(1e-5)
    write_tokenizer(writer, tokenizer or own, chat_template)

    def weight(*shape: int, scale: float = 1.0) -> np.ndarray:
        w = rng.standard_normal(shape) * scale / np.sqrt(shape[-1])
        w = w + noise * noise_rng.standard_normal(shape) * scale / np.sqrt(shape[-1])
        return w.astype(np.float32)

    def vocabulary_rows(scale: float, plain: bool = False) -> np.ndarray:
        """The default vocabulary's rows, moved to `tokenizer`'s ids where both spell alike (fresh elsewhere);
        with `plain`, zero for byte and unused tokens."""
        rows = weight(vocab_size, n_embd, scale=scale)
        if plain:
            rows[[i for i, (text, kind) in enumerate(zip(own.tokens, own.types))
                  if kind == BYTE or text.startswith("[unused")]] = 0.0
        if tokenizer is None:
            return rows
        fresh = np.random.default_rng(seed + 20_000).standard_normal((len(tokenizer.tokens), n_embd))
        moved = (fresh * scale / np.sqrt(n_embd)).astype(np.float32)
        ids, base_ids = rows_for(tokenizer)
        moved[ids] = rows[base_ids]
        return moved

    def add(name: str, tensor: np.ndarray) -> None:
        """Add a tensor, unless it belongs to a layer past `kept` (drawn all the same: the seed's model stays one)."""
        if not name.startswith("blk.") or int(name.split(".")[1]) < kept:
            writer.add_tensor(name, tensor)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    head_dim = n_embd // N_HEAD
    d_inner = 2 * n_embd
    every = list(range(n_layer))
    recurrent = {"mamba": every, "lfm2": every[::2], "jamba": every[::2]}.get(arch, [])
    writer.add_head_count(0 if arch == "mamba" else N_HEAD)
    writer.add_head_count_kv([0 if i in recurrent else N_HEAD_KV for i in range(kept)])
    if arch in ("llama", "gemma3", "qwen2vl"):
        writer.add_rope_dimension_count(head_dim)
    if arch == "qwen2vl":
        writer.add_rope_dimension_sections(ROPE_SECTIONS)
    if arch == "gemma3":
        writer.add_sliding_window(sliding_window)
    if arch in ("mamba", "jamba"):
        writer.add_ssm_conv_kernel(D_CONV)
        writer.add_ssm_inner_size(d_inner)
        writer.add_ssm_state_size(D_STATE)
        writer.add_ssm_time_step_rank(DT_RANK)
    if arch == "lfm2":
        writer.add_shortconv_l_cache(L_CACHE)

    add("token_embd.weight", vocabulary_rows(EMBEDDING_SCALE.get(arch, 8.0)))
    for i in range(n_layer):
        blk = f"blk.{i}"
        add(f"{blk}.attn_norm.weight", ones(n_embd))
        if i in recurrent and arch == "lfm2":
            add(f"{blk}.shortconv.conv.weight", weight(n_embd, L_CACHE))
            add(f"{blk}.shortconv.in_proj.weight", weight(3 * n_embd, n_embd))
            add(f"{blk}.shortconv.out_proj.weight", weight(n_embd, n_embd, scale=layer_scale))
        elif i in recurrent:
            add(f"{blk}.ssm_in.weight", weight(2 * d_inner, n_embd))
            add(f"{blk}.ssm_conv1d.weight", weight(d_inner, D_CONV))
            add(f"{blk}.ssm_conv1d.bias", weight(d_inner, scale=0.1))
            add(f"{blk}.ssm_x.weight", weight(DT_RANK + 2 * D_STATE, d_inner))
            add(f"{blk}.ssm_dt.weight", weight(d_inner, DT_RANK))
            add(f"{blk}.ssm_dt.bias", weight(d_inner, scale=0.1))
            add(f"{blk}.ssm_a", -np.exp(rng.uniform(-1, 1, (d_inner, D_STATE))).astype(np.float32))
            add(f"{blk}.ssm_d", ones(d_inner))
            add(f"{blk}.ssm_out.weight", weight(n_embd, d_inner, scale=layer_scale))
            if arch == "jamba":
                add(f"{blk}.ssm_dt_norm.weight", ones(DT_RANK))
                add(f"{blk}.ssm_b_norm.weight", ones(D_STATE))
                add(f"{blk}.ssm_c_norm.weight", ones(D_STATE))
        else:
            add(f"{blk}.attn_q.weight", weight(n_embd, n_embd))
            add(f"{blk}.attn_k.weight", weight(N_HEAD_KV * head_dim, n_embd))
            add(f"{blk}.attn_v.weight", weight(N_HEAD_KV * head_dim, n_embd))
            add(f"{blk}.attn_output.weight", weight(n_embd, n_embd, scale=layer_scale))
            if arch in ("lfm2", "gemma3"):
                add(f"{blk}.attn_q_norm.weight", ones(head_dim))
                add(f"{blk}.attn_k_norm.weight", ones(head_dim))
            if arch == "gemma3":
                add(f"{blk}.post_attention_norm.weight", ones(n_embd))
        if arch != "mamba":
            add(f"{blk}.ffn_norm.weight", ones(n_embd))
            add(f"{blk}.ffn_gate.weight", weight(n_ff, n_embd))
            add(f"{blk}.ffn_up.weight", weight(n_ff, n_embd))
            add(f"{blk}.ffn_down.weight", weight(n_embd, n_ff, scale=layer_scale))
        if arch == "gemma3":
            add(f"{blk}.post_ffw_norm.weight", ones(n_embd))
    add("token_embd_norm.weight" if arch == "lfm2" else "output_norm.weight", ones(n_embd))
    add("output.weight", vocabulary_rows(4.0 * output_scale, plain_output))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_qwen35_mtp(path: Path, seed: int = 1, *, n_embd: int = N_EMBD, n_trunk: int = 4, layer_scale: float = 0.1,
                     head_noise: float = 0.1, chat_template: str | None = None, eos: int = 2) -> Path:
    """A tiny Qwen3.5 (`qwen35`: gated-delta-net recurrent layers and attention layers in turn, hybrid memory)
    with one MTP block, written as llama.cpp's `src/models/qwen35.cpp` loads it.

    Its drafts are often right and often wrong: each trunk layer adds little to the residual stream
    (`layer_scale`), so the target mostly predicts from the current token alone, like a bigram model; the
    head's eh_proj keeps the token's half of its input, [I | 0] plus `head_noise`, and its block adds little
    too, so it predicts that same bigram from x_p. Where the trunk's layers tip the target's choice, the head
    is wrong. `qwen35.block_count` counts the MTP block; `nextn_predict_layers` = 1.
    """
    rng = np.random.default_rng(seed)
    vocab_size = len(vocabulary()[0])
    n_head, n_head_kv, head_dim, n_ff = 4, 2, 16, 2 * n_embd
    d_state, n_group, n_v_heads = 16, 2, 4  # gated delta net: head size, key heads, value heads
    key_dim, value_dim = d_state * n_group, d_state * n_v_heads
    writer = gguf.GGUFWriter(str(path), "qwen35")
    writer.add_name(f"tiny-qwen35-mtp-{seed}")
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_trunk + 1)
    writer.add_nextn_predict_layers(1)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_dimension_sections([4, 2, 2, 0])  # required by qwen35's multi-section rope
    writer.add_rope_freq_base(10000.0)
    writer.add_ssm_conv_kernel(D_CONV)
    writer.add_ssm_inner_size(value_dim)
    writer.add_ssm_state_size(d_state)
    writer.add_ssm_time_step_rank(n_v_heads)
    writer.add_ssm_group_count(n_group)
    writer.add_full_attention_interval(2)  # layers 1, 3, … attend; 0, 2, … are recurrent
    write_tokenizer(writer, default_tokenizer(eos=eos), chat_template)

    def weight(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale / np.sqrt(shape[-1])).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    def attention_and_ffn(blk: str, recurrent: bool) -> None:
        writer.add_tensor(f"{blk}.attn_norm.weight", ones(n_embd))
        writer.add_tensor(f"{blk}.post_attention_norm.weight", ones(n_embd))
        if recurrent:
            writer.add_tensor(f"{blk}.attn_qkv.weight", weight(2 * key_dim + value_dim, n_embd))
            writer.add_tensor(f"{blk}.attn_gate.weight", weight(value_dim, n_embd))
            writer.add_tensor(f"{blk}.ssm_conv1d.weight", weight(2 * key_dim + value_dim, D_CONV))
            writer.add_tensor(f"{blk}.ssm_dt.bias", weight(n_v_heads, scale=0.1))
            writer.add_tensor(f"{blk}.ssm_a", -np.exp(rng.uniform(-1, 0, n_v_heads)).astype(np.float32))
            writer.add_tensor(f"{blk}.ssm_beta.weight", weight(n_v_heads, n_embd))
            writer.add_tensor(f"{blk}.ssm_alpha.weight", weight(n_v_heads, n_embd))
            writer.add_tensor(f"{blk}.ssm_norm.weight", ones(d_state))
            writer.add_tensor(f"{blk}.ssm_out.weight", weight(n_embd, value_dim, scale=layer_scale))
        else:
            writer.add_tensor(f"{blk}.attn_q.weight", weight(2 * n_head * head_dim, n_embd))  # queries and gate
            writer.add_tensor(f"{blk}.attn_k.weight", weight(n_head_kv * head_dim, n_embd))
            writer.add_tensor(f"{blk}.attn_v.weight", weight(n_head_kv * head_dim, n_embd))
            writer.add_tensor(f"{blk}.attn_output.weight", weight(n_embd, n_head * head_dim, scale=layer_scale))
            writer.add_tensor(f"{blk}.attn_q_norm.weight", ones(head_dim))
            writer.add_tensor(f"{blk}.attn_k_norm.weight", ones(head_dim))
        writer.add_tensor(f"{blk}.ffn_gate.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"{blk}.ffn_up.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"{blk}.ffn_down.weight", weight(n_embd, n_ff, scale=layer_scale))

    writer.add_tensor("token_embd.weight", weight(vocab_size, n_embd, scale=8.0))
    for i in range(n_trunk):
        attention_and_ffn(f"blk.{i}", recurrent=(i + 1) % 2 != 0)
    head = f"blk.{n_trunk}"
    attention_and_ffn(head, recurrent=False)
    eh_proj = np.hstack([np.eye(n_embd), np.zeros((n_embd, n_embd))]) + weight(n_embd, 2 * n_embd, scale=head_noise)
    writer.add_tensor(f"{head}.nextn.eh_proj.weight", eh_proj.astype(np.float32))
    writer.add_tensor(f"{head}.nextn.enorm.weight", ones(n_embd))
    writer.add_tensor(f"{head}.nextn.hnorm.weight", ones(n_embd))
    writer.add_tensor(f"{head}.nextn.shared_head_norm.weight", ones(n_embd))
    writer.add_tensor("output_norm.weight", ones(n_embd))
    writer.add_tensor("output.weight", weight(vocab_size, n_embd, scale=4.0))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _write_drafter_header(writer: gguf.GGUFWriter, arch: str, n_embd: int, target_layers: list[int],
                          mask_token: int | None = None) -> None:
    """What EAGLE-3 and DFlash drafters share: one block of `n_embd` with one attention head, the target's
    vocabulary (with a mask token for DFlash), and the target layers they read."""
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(1)
    writer.add_feed_forward_length(2 * n_embd)
    writer.add_head_count(1)
    writer.add_head_count_kv(1)
    writer.add_rope_dimension_count(n_embd)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_array(f"{arch}.target_layers", target_layers)
    tokenizer = default_tokenizer()
    write_tokenizer(writer, tokenizer, None)
    if mask_token is not None:
        writer.add_mask_token_id(mask_token)


def _finish_drafter(writer: gguf.GGUFWriter, n: int, weight: Callable[..., np.ndarray]) -> None:
    """What ends both drafters: one feed-forward block that adds little to what the attention passes on, the
    output norm, and the file written out."""
    writer.add_tensor("blk.0.ffn_norm.weight", np.ones(n, np.float32))
    writer.add_tensor("blk.0.ffn_gate.weight", weight(2 * n, n))
    writer.add_tensor("blk.0.ffn_up.weight", weight(2 * n, n))
    writer.add_tensor("blk.0.ffn_down.weight", weight(n, 2 * n, scale=0.1))
    writer.add_tensor("output_norm.weight", np.ones(n, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_eagle3(path: Path, seed: int = 5, *, target_width: int = N_EMBD, target_layers: tuple[int, ...] = (0, 1, 1),
                 focus: float = 3.0, g_scale: float = 0.1, gain: float = 3.0, norm_g: bool = False) -> Path:
    """A tiny EAGLE-3 head for a `write_model` llama target of width `target_width`, as llama.cpp's
    `src/models/eagle3.cpp` loads it (no embeddings or output of its own: the target's, through ctx_other).

    Its drafts are often right and often wrong: the pair at position P is (x_{P+1}, g_P), and its attention
    attends to the token's own row (its one head's queries and keys are the normalised embedding times
    `focus`: a vector's product with itself outgrows its products with others; values are the embedding),
    so the head passes x_{P+1}'s embedding to the target's output layer: the target's prediction from the
    token alone, a bigram. Where the target's layers tip its choice, the head is wrong.
    g rides in the residual stream: the fused features (`g_scale`-small) at the first step, so the features
    fed matter a little; the head's own state after it, which the attention outweighs `gain` times over, so
    later steps are right less often. `norm_g` puts g normalised in the residual (`norm_before_residual`):
    then a large `gain` makes later steps right as often as the first.
    """
    rng = np.random.default_rng(seed)
    n = target_width
    writer = gguf.GGUFWriter(str(path), "eagle3")
    writer.add_name(f"tiny-eagle3-{seed}")
    _write_drafter_header(writer, "eagle3", n, list(target_layers))
    writer.add_uint32("eagle3.target_hidden_size", n)
    writer.add_bool("eagle3.norm_before_residual", norm_g)

    def weight(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale / np.sqrt(shape[-1])).astype(np.float32)

    token_half = np.hstack([np.eye(n), np.zeros((n, n))]).astype(np.float32)  # reads the embedding, not g
    writer.add_tensor("fc.weight", weight(n, len(target_layers) * n, scale=g_scale))
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(n, np.float32))
    writer.add_tensor("blk.0.attn_norm_2.weight", np.ones(n, np.float32))
    writer.add_tensor("blk.0.attn_q.weight", focus * token_half)
    writer.add_tensor("blk.0.attn_k.weight", focus * token_half)
    writer.add_tensor("blk.0.attn_v.weight", token_half)
    writer.add_tensor("blk.0.attn_output.weight", gain * np.eye(n, dtype=np.float32))
    _finish_drafter(writer, n, weight)
    return path


MASK_TOKEN = 319  # the default vocabulary's last [unused] token: DFlash drafters' mask


def write_dflash(path: Path, target: Path, *, seed: int = 6, target_layers: tuple[int, ...] = (0, 1),
                 block_size: int = 8, focus: float = 3.0, feature_scale: float = 0.3,
                 more: dict[str, int] | None = None) -> Path:
    """A tiny DFlash drafter for the `write_model` llama `target`, as llama.cpp's `src/models/dflash.cpp` loads
    it: as wide as the target, with embeddings and an output layer of its own, copied from the target's.

    Its drafts are often right and often wrong. Its one head gives every token's embedding a flag (a dimension
    rope barely turns) and the mask token's a mark instead; queries map the mark onto the flag and keys read
    the flag, so each mask row attends to the block's one real token, x_n, and passes its embedding (less those
    two dimensions) to the target's output rows: about the target's prediction from x_n alone, at every mask
    row. The first draft is often right; later ones repeat it. Keys also read the injected features a little
    (`feature_scale`), so the features fed matter. `more`: further `dflash.*` keys (unsigned integers).
    """
    rng = np.random.default_rng(seed)
    reader = gguf.GGUFReader(str(target))
    tensors = {t.name: np.array(t.data, dtype=np.float32) for t in reader.tensors
               if t.name in ("token_embd.weight", "output.weight")}
    embeddings, output = tensors["token_embd.weight"], tensors["output.weight"]
    n = embeddings.shape[1]
    flags, marks = [n // 2 - 1], [n // 2 - 2]
    embeddings = embeddings.copy()
    embeddings[:, flags + marks] = 0.0
    embeddings[:, flags] = 8.0
    embeddings[MASK_TOKEN] = 0.0
    embeddings[MASK_TOKEN, marks] = 8.0
    output = output.copy()
    output[:, flags + marks] = 0.0

    writer = gguf.GGUFWriter(str(path), "dflash")
    writer.add_name(f"tiny-dflash-{seed}")
    _write_drafter_header(writer, "dflash", n, list(target_layers), MASK_TOKEN)
    writer.add_uint32("dflash.block_size", block_size)
    for key, value in (more or {}).items():
        writer.add_uint32(f"dflash.{key}", value)

    def weight(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale / np.sqrt(shape[-1])).astype(np.float32)

    queries, keys = weight(n, n, scale=feature_scale), weight(n, n, scale=feature_scale)
    queries[flags] = 0.0
    queries[flags, marks] = 1.0
    keys[flags] = 0.0
    keys[flags, flags] = 1.0
    fc = weight(n, len(target_layers) * n)
    fc[flags] = 0.0  # the features never look like a token to the mask rows
    writer.add_tensor("token_embd.weight", embeddings)
    writer.add_tensor("output.weight", output)
    writer.add_tensor("fc.weight", fc)
    writer.add_tensor("enc.output_norm.weight", np.ones(n, np.float32))
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(n, np.float32))
    writer.add_tensor("blk.0.attn_q.weight", queries)
    writer.add_tensor("blk.0.attn_k.weight", keys)
    writer.add_tensor("blk.0.attn_v.weight", np.eye(n, dtype=np.float32))
    writer.add_tensor("blk.0.attn_output.weight", np.eye(n, dtype=np.float32))
    writer.add_tensor("blk.0.attn_q_norm.weight", np.full(n, focus, np.float32))
    writer.add_tensor("blk.0.attn_k_norm.weight", np.full(n, focus, np.float32))
    _finish_drafter(writer, n, weight)
    return path
