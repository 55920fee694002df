"""Models made from other models: a GGUF re-encoded by llama.cpp's quantizer, cached and reused.

The demo pair's F32 target is made this way from its Q4_1 draft; a self-draft (a Q4_0 drafting for its own
F16 target) is the same mechanism in the other direction.
"""

from __future__ import annotations

import glob
import hashlib
import os
from pathlib import Path
from typing import Callable

from spec_cli.llama import gguf
from spec_cli.llama.kernels import cpu_threads
from spec_cli.llama.model import check_gguf
from spec_cli.paths import cache_dir


SAMPLES = 16  # the stretches, past the first, spread evenly over a source that its fingerprint reads
SAMPLE_BYTES = 64 * 1024  # each stretch's bytes


def derived_path(source: Path, ftype: str) -> Path:
    """Where the `ftype` re-encoding of `source` lives in the cache: named by what the source holds (`fingerprint`),
    not where it lies. Keyed by the source's path and modification time, every new virtual environment (a wheel's
    files are written afresh) re-encoded the demo pair's target again, 540 MB a time, and the copies were never
    removed; a source replaced in place by other bytes still gets its own."""
    return cache_dir() / "derived" / f"{source.stem}-{fingerprint(source)}.{ftype}.gguf"


def fingerprint(source: Path) -> str:
    """A digest of a file's size, its first stretch (a GGUF's header and metadata) and `SAMPLES` stretches spread
    evenly over the rest, its last included: what tells one model's bytes from another's (a fine-tune changes every
    tensor), read in a few milliseconds whatever the file's size (hashing a 7 GB model whole takes seconds each
    load)."""
    size = source.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with source.open("rb") as file:
        for i in range(SAMPLES + 1):
            file.seek(i * max(0, size - SAMPLE_BYTES) // SAMPLES)
            digest.update(file.read(SAMPLE_BYTES))
    return digest.hexdigest()[:12]


def derive(source: Path, ftype: str, dest: Path | None = None, n_threads: int | None = None,
           notify: Callable[[str], None] = lambda _message: None) -> Path:
    """Re-encode `source` as `ftype` into `dest` (default: the cache) unless it is already there.

    The quantizer writes to a temporary name beside `dest` that is renamed into place only when complete,
    so an interrupted run leaves neither a half-written model nor a stray temporary file. In the cache, the copies
    of it that earlier names left are removed (`_drop_copies`).
    """
    check_gguf(source)
    gguf.check_ftype(ftype)
    cached = dest is None
    dest = dest or derived_path(source, ftype)
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.with_name(f".{dest.name}.{os.getpid()}.part")
        notify(f"making {dest.name} from {source.name} (first use only)")
        try:
            gguf.quantize(source, partial, ftype, n_threads or cpu_threads())
            os.replace(partial, dest)
        finally:
            partial.unlink(missing_ok=True)
    if cached:
        _drop_copies(dest, source.stem, ftype, notify)
    return dest


def _drop_copies(kept: Path, stem: str, ftype: str, notify: Callable[[str], None]) -> None:
    """Remove the `ftype` re-encodings of sources named `stem` beside `kept` that hold its bytes (its size and
    `fingerprint`): the copies of a derived model that its earlier names left in the cache (named by their source's
    path and modification time, one for each virtual environment that ran it, 540 MB each for the demo pair's target).
    A file of other bytes (a model of the same name from another source) stays; one that another process removes
    first, or that cannot be removed, is left as it is."""
    size = _size(kept)
    if size is None:
        return
    copies = [path for path in kept.parent.glob(f"{glob.escape(stem)}-*.{ftype}.gguf")
              if path != kept and _size(path) == size]
    if not copies:
        return
    mine, dropped = fingerprint(kept), 0
    for path in copies:
        try:
            if fingerprint(path) == mine:
                path.unlink()
                dropped += 1
        except OSError:
            continue
    if dropped:
        notify(f"removed {dropped} older {'copy' if dropped == 1 else 'copies'} of {kept.name} from the cache "
               f"({dropped * size / 1e9:.1f} GB)")


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None
