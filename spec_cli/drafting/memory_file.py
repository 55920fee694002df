"""The memory's file (`--memory FILE`): the outputs a process remembered, kept for the next one.

One NumPy archive, loaded without pickle (a file from elsewhere runs no code): the documents' tokens separated
by -1, and a JSON header naming the format and the target's vocabulary (`vocabulary_key`), so that a file
written for another tokenizer is never drafted from. Writing merges: under an exclusive lock on a side file, it
reads what other processes saved meanwhile, appends this process's new documents, keeps the newest `capacity`
tokens, and replaces the file atomically (a temporary file in the same folder, then `os.replace`). A reader
never sees half a file, and two processes that share one lose neither's outputs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Sequence

import numpy as np

from spec_cli.drafting.suffix import END
from spec_cli.llama.model import Model
from spec_cli.paths import locked

FORMAT = "spec-cli memory"
VERSION = 1
SAMPLED_TOKENS = 4096  # token texts the vocabulary key reads (spread over the vocabulary, and the last ones)


class MemoryFileError(Exception):
    """A memory file that cannot be used: unreadable, corrupt, of another format or another vocabulary."""


def vocabulary_key(model: Model) -> str:
    """What identifies the target's tokenizer: its size, kind and pre-tokenizer, and the texts of tokens spread
    over it (reading all 150,000 would take a tenth of a second at every start)."""
    n = model.n_vocab
    step = max(1, n // SAMPLED_TOKENS)
    ids = sorted({*range(0, n, step), *range(max(0, n - 256), n)})
    digest = hashlib.sha256(f"{n}|{model.metadata('tokenizer.ggml.model')}|"
                            f"{model.metadata('tokenizer.ggml.pre')}".encode())
    for token in ids:
        digest.update(model.token_text(token) + b"\0")
    return digest.hexdigest()[:24]


def read(path: Path, vocabulary: str) -> list[list[int]]:
    """The documents saved in `path` for this vocabulary; MemoryFileError says why a file cannot be used (none
    at all is an empty memory)."""
    if not path.exists():
        return []
    try:
        with np.load(path, allow_pickle=False) as archive:
            header = json.loads(bytes(archive["header"]).decode())
            tokens = archive["tokens"]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, UnicodeDecodeError) as exc:
        raise MemoryFileError(f"it is not a spec-cli memory file ({type(exc).__name__})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT or header.get("version") != VERSION:
        raise MemoryFileError("it is not a spec-cli memory file of this version")
    if header.get("vocabulary") != vocabulary:
        raise MemoryFileError("it was written for another vocabulary (another target's tokenizer)")
    if tokens.ndim != 1 or tokens.dtype.kind != "i" or (len(tokens) and int(tokens.min()) < END):
        raise MemoryFileError("its tokens are damaged")
    return split(tokens)


def write(path: Path, vocabulary: str, new: Sequence[Sequence[int]], capacity: int) -> None:
    """Append the documents `new` to what `path` holds now (another process's included), keep the newest
    `capacity` tokens, and replace the file atomically. A file that cannot be used is replaced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with locked(path):
        try:
            documents = read(path, vocabulary)
        except MemoryFileError:
            documents = []
        documents = newest([*documents, *new], capacity)
        header = np.frombuffer(json.dumps({"format": FORMAT, "version": VERSION, "vocabulary": vocabulary}).encode(),
                               dtype=np.uint8)
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as file:
                np.savez(file, header=header, tokens=joined(documents))
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise


def newest(documents: Sequence[Sequence[int]], capacity: int) -> list[Sequence[int]]:
    """The newest documents that fit in `capacity` tokens together."""
    kept: list[Sequence[int]] = []
    total = 0
    for document in reversed(documents):
        total += len(document) + 1
        if total > capacity:
            break
        kept.append(document)
    return kept[::-1]


def joined(documents: Sequence[Sequence[int]]) -> np.ndarray:
    """The documents in one array, separated by `END`."""
    parts = [np.asarray([*document, END], dtype=np.int32) for document in documents]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def split(tokens: np.ndarray) -> list[list[int]]:
    """`joined`'s documents back."""
    ends = np.flatnonzero(tokens == END)
    starts = np.concatenate(([0], ends + 1))
    stops = np.concatenate((ends, [len(tokens)]))
    return [tokens[a:b].tolist() for a, b in zip(starts, stops) if b > a]

