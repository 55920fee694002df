"""Tiny vision projectors (llama.cpp's `clip` GGUF, an "mmproj") and PNG images, for real image input in tests.

A Qwen2-VL merger (M-RoPE: an image's tokens advance positions by its grid, not their count) over one tiny
ViT layer, its output as wide as the text model it feeds (`tiny_models.write_model(arch="qwen2vl")`); random
weights from a fixed seed. Images are a few lines of zlib: llama.cpp decodes them with stb_image.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import gguf
import numpy as np

V_EMBD, V_HEAD, V_FF, PATCH = 16, 2, 32, 2


def write_mmproj(path: Path, seed: int, *, text_width: int, image_size: int = 16, max_pixels: int = 64 * 64) -> Path:
    """Write a Qwen2-VL vision tower with its merger to `path`, projecting into `text_width`-wide embeddings.

    Patches are PATCH² pixels, merged 2×2: an image resized to w×h pixels gives (w/4)·(h/4) tokens."""
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_string("general.name", f"tiny-mmproj-{seed}")
    writer.add_string("clip.projector_type", "qwen2vl_merger")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_uint32("clip.vision.embedding_length", V_EMBD)
    writer.add_uint32("clip.vision.attention.head_count", V_HEAD)
    writer.add_uint32("clip.vision.feed_forward_length", V_FF)
    writer.add_uint32("clip.vision.block_count", 1)
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

    merged = 4 * V_EMBD
    tensors = {
        "v.patch_embd.weight": weight(V_EMBD, 3, PATCH, PATCH, scale=4.0),
        "v.patch_embd.weight.1": weight(V_EMBD, 3, PATCH, PATCH, scale=4.0),
        "v.blk.0.ln1.weight": ones(V_EMBD), "v.blk.0.ln1.bias": weight(V_EMBD, scale=0.1),
        "v.blk.0.ln2.weight": ones(V_EMBD), "v.blk.0.ln2.bias": weight(V_EMBD, scale=0.1),
        "v.post_ln.weight": ones(V_EMBD), "v.post_ln.bias": weight(V_EMBD, scale=0.1),
        "mm.0.weight": weight(merged, merged), "mm.0.bias": weight(merged, scale=0.1),
        "mm.2.weight": weight(text_width, merged, scale=8.0), "mm.2.bias": weight(text_width, scale=0.1),
    }
    for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
        tensors[f"v.blk.0.{name}.weight"] = weight(V_EMBD, V_EMBD)
        tensors[f"v.blk.0.{name}.bias"] = weight(V_EMBD, scale=0.1)
    tensors["v.blk.0.ffn_up.weight"], tensors["v.blk.0.ffn_up.bias"] = weight(V_FF, V_EMBD), weight(V_FF, scale=0.1)
    tensors["v.blk.0.ffn_down.weight"], tensors["v.blk.0.ffn_down.bias"] = weight(V_EMBD, V_FF), weight(V_EMBD, scale=0.1)
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
