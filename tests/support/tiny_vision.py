"""Tiny vision projectors (llama.cpp's `clip` GGUF, an "mmproj") and PNG images, for real image input in tests.

Two projectors over one tiny ViT layer, each as wide as the text model it feeds; random weights from a fixed
seed: a Qwen2-VL merger (M-RoPE: an image's tokens advance positions by its grid, not their count; for
`tiny_models.write_model(arch="qwen2vl")`) and LLaVA-1.5's MLP (an image's tokens advance positions by their
count; for a llama). Images are a few lines of zlib: llama.cpp decodes them with stb_image.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import gguf
import numpy as np

V_EMBD, V_HEAD, V_FF, PATCH = 16, 2, 32, 2


def write_mmproj(path: Path, seed: int, *, text_width: int, projector: str = "qwen2vl_merger",
                 image_size: int = 16, max_pixels: int = 64 * 64) -> Path:
    """Write a vision tower with its `projector` to `path`, projecting into `text_width`-wide embeddings.

    "qwen2vl_merger": patches of PATCH² pixels merged 2×2, so an image resized to w×h pixels gives (w/4)·(h/4)
    tokens. "mlp" (LLaVA-1.5): every image padded to an `image_size` square, (image_size/PATCH)² tokens."""
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_string("general.name", f"tiny-mmproj-{seed}")
    writer.add_string("clip.projector_type", projector)
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_uint32("clip.vision.embedding_length", V_EMBD)
    writer.add_uint32("clip.vision.attention.head_count", V_HEAD)
    writer.add_uint32("clip.vision.feed_forward_length", V_FF)
    blocks = 1 if projector == "qwen2vl_merger" else 2  # LLaVA reads the second-to-last layer's output
    writer.add_uint32("clip.vision.block_count", blocks)
    writer.add_uint32("clip.vision.projection_dim", text_width)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_uint32("clip.vision.image_size", image_size)
    writer.add_uint32("clip.vision.patch_size", PATCH)
    writer.add_uint32("clip.vision.image_max_pixels", max_pixels)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    writer.add_bool("clip.use_gelu", True)

    def weight(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale / np.sqrt(shape[-1])).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    merged = 4 * V_EMBD if projector == "qwen2vl_merger" else V_EMBD
    tensors = {
        "v.patch_embd.weight": weight(V_EMBD, 3, PATCH, PATCH, scale=4.0),
        "mm.0.weight": weight(merged, merged), "mm.0.bias": weight(merged, scale=0.1),
        "mm.2.weight": weight(text_width, merged, scale=8.0), "mm.2.bias": weight(text_width, scale=0.1),
    }
    if projector == "qwen2vl_merger":  # a second patch kernel for video frames; a norm before the merger
        tensors["v.patch_embd.weight.1"] = weight(V_EMBD, 3, PATCH, PATCH, scale=4.0)
        tensors["v.post_ln.weight"], tensors["v.post_ln.bias"] = ones(V_EMBD), weight(V_EMBD, scale=0.1)
    else:  # learnt positions
        tensors["v.position_embd.weight"] = weight((image_size // PATCH) ** 2, V_EMBD)
    for blk in (f"v.blk.{i}" for i in range(blocks)):
        for name in ("ln1", "ln2"):
            tensors[f"{blk}.{name}.weight"], tensors[f"{blk}.{name}.bias"] = ones(V_EMBD), weight(V_EMBD, scale=0.1)
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensors[f"{blk}.{name}.weight"], tensors[f"{blk}.{name}.bias"] = weight(V_EMBD, V_EMBD), weight(V_EMBD, scale=0.1)
        tensors[f"{blk}.ffn_up.weight"], tensors[f"{blk}.ffn_up.bias"] = weight(V_FF, V_EMBD), weight(V_FF, scale=0.1)
        tensors[f"{blk}.ffn_down.weight"], tensors[f"{blk}.ffn_down.bias"] = weight(V_EMBD, V_FF), weight(V_EMBD, scale=0.1)
    for name, tensor in tensors.items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def png(width: int, height: int, seed: int) -> bytes:
    """A width × height RGB PNG of seeded noise (8 bits, no filter)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    raw = b"".join(b"\x00" + row.tobytes() for row in pixels)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
