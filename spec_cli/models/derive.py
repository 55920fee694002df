"""Models made from other models: a GGUF re-encoded by llama.cpp's quantizer, cached and reused.

The demo pair's F32 target is made this way from its Q4_1 draft; a self-draft (a Q4_0 drafting for its own
F16 target) is the same mechanism in the other direction.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable

from spec_cli.llama import gguf
from spec_cli.llama.kernels import cpu_threads
from spec_cli.llama.model import check_gguf
from spec_cli.paths import cache_dir


def derived_path(source: Path, ftype: str) -> Path:
    """Where the `ftype` re-encoding of `source` lives in the cache.

    The name carries a digest of the source's absolute path, size and modification time, so two files
    with the same name, or a source replaced in place, never share a derived file.
    """
    info = source.stat()
    key = f"{source.resolve()}|{info.st_size}|{info.st_mtime_ns}".encode()
    digest = hashlib.sha256(key).hexdigest()[:12]
    return cache_dir() / "derived" / f"{source.stem}-{digest}.{ftype}.gguf"


def derive(source: Path, ftype: str, dest: Path | None = None, n_threads: int | None = None,
           notify: Callable[[str], None] = lambda _message: None) -> Path:
    """Re-encode `source` as `ftype` into `dest` (default: the cache) unless it is already there.

    The quantizer writes to a temporary name beside `dest` that is renamed into place only when complete,
    so an interrupted run leaves neither a half-written model nor a stray temporary file.
    """
    check_gguf(source)
    gguf.check_ftype(ftype)
    dest = dest or derived_path(source, ftype)
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    notify(f"making {dest.name} from {source.name} (first use only)")
    try:
        gguf.quantize(source, partial, ftype, n_threads or cpu_threads())
        os.replace(partial, dest)
    finally:
        partial.unlink(missing_ok=True)
    return dest
