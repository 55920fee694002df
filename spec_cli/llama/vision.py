"""Images through llama.cpp's multimodal library (libmtmd): a projector (an "mmproj" GGUF) beside a model turns
an image into embeddings its text model reads in place of tokens.

In a sequence of token ids an image is a run of one negative id, as long as the target's projector makes the
image's tokens: `Image.key`, drawn from a hash of the image's bytes, so two prompts share a prefix through an
image only when they hold the same image there (the prompt cache and slot choice compare ids). A context
decodes such a run through its model's projector (`Projector.get`), or skips it when it has none: a
text-only draft reads the text around the image, as llama.cpp's own draft does.
"""

from __future__ import annotations

import ctypes
import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Sequence

import llama_cpp
import numpy as np
from llama_cpp import mtmd_cpp as mtmd

from spec_cli.errors import BadInput, SpecError
from spec_cli.llama.model import Backend, Model, check_gguf

MAX_PIXELS = 8192 * 8192  # decoded pixels an image may have; each projector downscales to its own input size
MAX_IMAGE_BYTES = 32 << 20
KEPT_IMAGES = 32  # images a projector keeps read (a chat's history, several requests' at once), at least
_TEXT_CHUNK = 0  # MTMD_INPUT_CHUNK_TYPE_TEXT


@dataclass(frozen=True)
class Image:
    """An image's encoded bytes (PNG, JPEG, BMP, GIF…: whatever stb_image reads) and how messages name it."""

    data: bytes = field(repr=False)
    name: str

    @cached_property
    def key(self) -> int:
        """The negative id the image's run holds in a sequence: 30 bits of its bytes' SHA-256 (never -1, which
        separates documents in a suffix index)."""
        return -2 - int.from_bytes(hashlib.sha256(self.data).digest()[:4], "little") % (1 << 30)


# The first bytes of the formats stb_image reads (TGA, which has none, is left out).
SIGNATURES = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"BM", b"8BPS", b"#?RADIANCE", b"#?RGBE",
              b"P5", b"P6", b"\x53\x80\xf6\x34")
FORMATS = "PNG, JPEG, GIF, BMP, PSD, HDR, PGM/PPM or PIC"


def read_image(path: str | Path) -> Image:
    """An image file's bytes (`check_image`); one line when it cannot be read."""
    path = Path(path)
    try:
        if path.is_dir():
            raise BadInput(f"{path} is a folder, not an image")
        size = path.stat().st_size
        if size > MAX_IMAGE_BYTES:
            raise BadInput(f"{path} is {size >> 20} MiB; images are limited to {MAX_IMAGE_BYTES >> 20} MiB")
        return check_image(Image(path.read_bytes(), str(path)))
    except OSError as exc:
        raise BadInput(f"cannot read the image {path}: {exc.strerror or exc}") from None


def check_image(image: Image) -> Image:
    """`image`, unless its bytes start as no image format llama.cpp reads (a truncated one is found when it is
    decoded, `Projector.see`)."""
    if not image.data.startswith(SIGNATURES):
        raise BadInput(f"{image.name} is not an image llama.cpp reads ({FORMATS})")
    return image


def has_images(tokens: Sequence[int]) -> bool:
    return bool(tokens) and min(tokens) < 0


def whole_images(tokens: Sequence[int], n: int) -> int:
    """How many of `tokens` to feed when `n` were meant: an image at the start whole (whatever `n`), else up to
    the first image (a pass of images goes alone: they are embeddings, not tokens)."""
    if tokens and tokens[0] < 0:
        end = 1
        while end < len(tokens) and tokens[end] == tokens[0]:
            end += 1
        return end
    for i in range(min(n, len(tokens))):
        if tokens[i] < 0:
            return i
    return n


def image_end(tokens: Sequence[int], n: int) -> int:
    """n, or the end of the image the first n of `tokens` end inside (a memory never holds part of one)."""
    while 0 < n < len(tokens) and tokens[n] < 0 and tokens[n] == tokens[n - 1]:
        n += 1
    return n


def text_of(tokens: Sequence[int]) -> list[int]:
    """`tokens` without their images."""
    return [token for token in tokens if token >= 0]


def up_to_image(tokens: list[int]) -> list[int]:
    """`tokens` up to the first image: what a drafter that copies earlier tokens may propose."""
    for i, token in enumerate(tokens):
        if token < 0:
            return tokens[:i]
    return tokens


class ImageTokens:
    """One image as one projector reads it: `n_tokens` embeddings advancing positions by `n_pos` (the grid's
    larger side for M-RoPE models, else the tokens), encoded when first decoded and kept."""

    def __init__(self, projector: Projector, chunk: mtmd.mtmd_input_chunk_p) -> None:
        self._projector = projector
        self._chunk = chunk
        self.n_tokens: int = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
        self.n_pos: int = mtmd.mtmd_input_chunk_get_n_pos(chunk)
        self._embeddings: np.ndarray | None = None

    def embeddings(self) -> np.ndarray:
        if self._embeddings is None:
            self._embeddings = self._projector.encode(self._chunk, self.n_tokens)
        return self._embeddings

    def decode(self, context: llama_cpp.llama_context_p, pos: int, seq: int, n_batch: int) -> None:
        """Feed the image's embeddings to sequence `seq` of `context` from position `pos` (libmtmd places them:
        a grid for M-RoPE models, non-causal attention where the model reads images so)."""
        embeddings = self.embeddings()
        after = llama_cpp.llama_pos(0)
        Backend.forget()
        status = mtmd.mtmd_helper_decode_image_chunk(
            self._projector.handle, context, self._chunk, embeddings.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
            pos, seq, n_batch, ctypes.byref(after), mtmd.mtmd_helper_post_decode_callback(0), None)
        if status != 0:
            raise SpecError(f"llama.cpp could not decode an image with {self._projector.model.path.name}: "
                            f"{Backend.message(f'status {status}')}")

    def close(self) -> None:
        if self._chunk:
            mtmd.mtmd_input_chunk_free(self._chunk)
            self._chunk = None


class Projector:
    """A model's mmproj: reads images into `ImageTokens`, kept by `Image.key` for the contexts that decode them:
    the most recently read, `KEPT_IMAGES` of them or a whole prompt's if it has more."""

    def __init__(self, model: Model, path: str | Path, n_threads: int) -> None:
        """Load `path` for `model`; one line when it is not an mmproj for this model (its embeddings are not the
        model's width, its projector is unknown to llama.cpp, it reads no images)."""
        self.path = Path(path)
        self.model = model
        check_gguf(self.path)
        _route_log()
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = model.placement != "CPU"
        params.n_threads = n_threads
        params.print_timings = False
        params.warmup = False
        Backend.forget()
        handle = mtmd.mtmd_init_from_file(str(self.path).encode(), model._handle, params)
        if not handle:
            raise BadInput(f"{self.path.name} is not an mmproj for {model.path.name}: "
                            f"{Backend.message('llama.cpp could not load it')}")
        self.handle = handle
        if not mtmd.mtmd_support_vision(handle):
            self.close()
            raise BadInput(f"{self.path.name} reads no images (an audio projector?)")
        self.uses_mrope: bool = mtmd.mtmd_decode_use_mrope(handle)
        self._seen: OrderedDict[int, tuple[ImageTokens, list[int], list[int]]] = OrderedDict()

    def see(self, images: Sequence[Image]) -> list[tuple[ImageTokens, list[int], list[int]]]:
        """Each image as this projector reads it, with the text tokens its model writes before and after an
        image (Qwen-VL's <|vision_start|> … <|vision_end|>; none for many). One line when the bytes are not an
        image (or are truncated) or hold too many pixels."""
        seen = []
        for image in images:
            if image.key not in self._seen:
                self._seen[image.key] = self._tokenize(image)
            self._seen.move_to_end(image.key)
            seen.append(self._seen[image.key])
        while len(self._seen) > max(KEPT_IMAGES, len(images)):
            self._seen.popitem(last=False)[1][0].close()
        return seen

    def get(self, key: int) -> ImageTokens | None:
        """The image whose run holds `key`, if this projector has seen it."""
        seen = self._seen.get(key)
        return seen[0] if seen is not None else None

    def _tokenize(self, image: Image) -> tuple[ImageTokens, list[int], list[int]]:
        buffer = (ctypes.c_uint8 * len(image.data)).from_buffer_copy(image.data)
        Backend.forget()
        bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(self.handle, buffer, len(image.data), False)
        if not bitmap:
            raise BadInput(f"{image.name} is not an image llama.cpp can read ({FORMATS}), or it is truncated")
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            pixels = mtmd.mtmd_bitmap_get_nx(bitmap) * mtmd.mtmd_bitmap_get_ny(bitmap)
            if pixels > MAX_PIXELS:
                raise BadInput(f"{image.name} has {pixels:,} pixels; images are limited to {MAX_PIXELS:,} "
                                "(smaller ones are resized to what the projector reads)")
            marker = mtmd.mtmd_default_marker()
            text = mtmd.mtmd_input_text(marker, len(marker), False, True)
            status = mtmd.mtmd_tokenize(self.handle, chunks, ctypes.byref(text),
                                        (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap), 1)
            if status != 0:
                raise SpecError(f"llama.cpp could not read {image.name} through {self.path.name}: "
                                f"{Backend.message(f'status {status}')}")
            return self._split(chunks)
        finally:
            mtmd.mtmd_input_chunks_free(chunks)
            mtmd.mtmd_bitmap_free(bitmap)

    def _split(self, chunks: mtmd.mtmd_input_chunks_p) -> tuple[ImageTokens, list[int], list[int]]:
        """The image chunk (copied: `chunks` is freed) and the text tokens before and after it."""
        before: list[int] = []
        after: list[int] = []
        found: ImageTokens | None = None
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            if mtmd.mtmd_input_chunk_get_type(chunk) == _TEXT_CHUNK:
                n = ctypes.c_size_t(0)
                ids = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                (after if found else before).extend(ids[:n.value])
            else:
                found = ImageTokens(self, mtmd.mtmd_input_chunk_copy(chunk))
        assert found is not None, "libmtmd made no image chunk for an image"
        return found, before, after

    def encode(self, chunk: mtmd.mtmd_input_chunk_p, n_tokens: int) -> np.ndarray:
        Backend.forget()
        status = mtmd.mtmd_encode_chunk(self.handle, chunk)
        if status != 0:
            raise SpecError(f"llama.cpp could not encode an image with {self.path.name}: "
                            f"{Backend.message(f'status {status}')}")
        width = llama_cpp.llama_model_n_embd_inp(self.model._handle)
        rows = np.empty((n_tokens, width), dtype=np.float32)
        ctypes.memmove(rows.ctypes.data, mtmd.mtmd_get_output_embd(self.handle), rows.nbytes)
        return rows

    def close(self) -> None:
        for seen in self._seen.values():
            seen[0].close()
        self._seen.clear()
        if self.handle:
            mtmd.mtmd_free(self.handle)
            self.handle = None


def _route_log() -> None:
    """libmtmd's log into llama.cpp's (collected for one-line errors, silent otherwise)."""
    Backend.ensure()
    mtmd.mtmd_log_set(Backend._log, ctypes.c_void_p(0))
    mtmd.mtmd_helper_log_set(Backend._log, ctypes.c_void_p(0))
