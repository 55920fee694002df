"""Drafting from memory (`--draft-mode memory`): suffix matching over this request's tokens, every earlier
output of the process (and of earlier processes, through `--memory FILE`), and an optional corpus.

Extraction pipes, agents and code edits repeat their own structure: the keys of a JSON answer, a phrasing,
the code a prompt quotes. SuffixDecoding (arXiv 2411.04975) drafts those from suffix trees over earlier
outputs, with a length that follows the match (`suffix`). Here one `OutputMemory` per pair serves every
sequence (each slot of `spec batch`, `spec serve`, every turn of `spec chat`): each generation that ends adds
its output, after the last `CONTEXT` tokens of its prompt, so the start of the next answer to a like prompt
matches too. The memory holds at most `capacity` tokens of outputs, oldest dropped first. A drafter proposes
the best-scoring of the request's own match and the memory's.

A proposal is deterministic given the sequence and the memory, which changes only between rounds. So its q is
one-hot, as n-gram lookup's is, and verification keeps the output exactly the target's.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from spec_cli.decoding.drafter import Draft, Drafter
from spec_cli.decoding.sampling import Law, SamplingParams
from spec_cli.drafting import memory_file
from spec_cli.drafting.suffix import NO_MATCH, Match, SuffixIndex
from spec_cli.errors import SpecError
from spec_cli.llama.grammar import Grammar
from spec_cli.llama.vision import text_of, up_to_image

CONTEXT = 8  # prompt tokens remembered before each output (a chat template's assistant header, about)
CAPACITY = 1 << 18  # tokens of outputs a memory holds (about 1 MB of text, 10 MB of index)
CORPUS_TOKENS = 1 << 21  # the most tokens a corpus gives (about 8 MB of text)
CORPUS_FILE_BYTES = 1 << 20  # a corpus file larger than this is skipped (data, not text to quote)


class OutputMemory:
    """The outputs a process has written (and those its memory file held), and a corpus, searchable by suffix.

    `vocabulary`: the target's `memory_file.vocabulary_key`, which a memory file must carry to be read."""

    def __init__(self, vocabulary: str, capacity: int = CAPACITY) -> None:
        self.vocabulary = vocabulary
        self.capacity = capacity
        self.outputs = SuffixIndex()
        self.corpus = SuffixIndex()
        self._sizes: list[int] = []  # each output's tokens, oldest first, END included
        self._total = 0
        self._new: list[list[int]] = []  # outputs since the file was last read or written

    @property
    def documents(self) -> int:
        return len(self._sizes)

    def remember(self, tokens: Sequence[int]) -> None:
        """Add a document of outputs; past `capacity`, the oldest go (down to three quarters of it, so that
        the index is rebuilt once in a while, not at every output)."""
        tokens = list(tokens)[-(self.capacity - 1):]
        if not tokens:
            return
        self.outputs.add_document(tokens)
        self._sizes.append(len(tokens) + 1)
        self._total += len(tokens) + 1
        self._new.append(tokens)
        if self._total > self.capacity:
            dropped = 0
            while self._total - dropped > 3 * self.capacity // 4:
                dropped += self._sizes.pop(0)
            self._total -= dropped
            self.outputs = SuffixIndex(self.outputs.tokens[dropped:].copy())

    def forget(self) -> None:
        """Drop every output held (the corpus stays): a benchmark that runs the same prompt again must not
        draft its answer from the last run's."""
        self.outputs, self._sizes, self._total, self._new = SuffixIndex(), [], 0, []

    def match(self, context: Sequence[int], k: int) -> Match:
        """The better-scoring of the outputs' and the corpus's continuations of `context`."""
        found = [index.match(context, k) for index in (self.outputs, self.corpus) if len(index)]
        return max(found, key=lambda m: m.score, default=NO_MATCH)

    def load(self, path: Path) -> int:
        """Add the documents saved in `path`, older than those held (MemoryFileError: it cannot be used), and
        index them all at once; return how many were saved."""
        saved = memory_file.read(path, self.vocabulary)
        kept = memory_file.newest([*saved, *memory_file.split(self.outputs.tokens)], self.capacity)
        self.outputs = SuffixIndex(memory_file.joined(kept)[:-1])  # as `remember` leaves it: no END after the last
        self._sizes = [len(document) + 1 for document in kept]
        self._total = sum(self._sizes)
        return len(saved)

    def save(self, path: Path) -> None:
        """Add this process's new outputs to `path` (see `memory_file.write`); nothing new, nothing written."""
        if not self._new:
            return
        memory_file.write(path, self.vocabulary, self._new, self.capacity)
        self._new = []

    def read_corpus(self, paths: Sequence[Path], tokenize: Callable[[str], list[int]]) -> tuple[int, int]:
        """Add the text files under `paths` (files, or folders searched through, hidden ones skipped) as
        documents to draft from, up to `CORPUS_TOKENS`; return (files read, tokens). Files that are not UTF-8
        text, or larger than `CORPUS_FILE_BYTES`, are skipped."""
        files = tokens = 0
        for file in corpus_files(paths):
            try:
                data = file.read_bytes()
            except OSError:
                continue
            if len(data) > CORPUS_FILE_BYTES or b"\0" in data:
                continue
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            document = tokenize(text)[:CORPUS_TOKENS - tokens]
            self.corpus.add_document(document)
            files, tokens = files + 1, tokens + len(document)
            if tokens >= CORPUS_TOKENS:
                break
        return files, tokens


def corpus_files(paths: Sequence[Path]) -> list[Path]:
    """The files `paths` name, folders searched through (hidden files and folders skipped), in name order; a
    path that does not exist is one line."""
    found: list[Path] = []
    for path in paths:
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            for root, folders, names in os.walk(path):
                folders[:] = sorted(f for f in folders if not f.startswith("."))
                found += [Path(root) / name for name in sorted(names) if not name.startswith(".")]
        else:
            raise SpecError(f"--lookup-corpus {path}: no such file or folder")
    return found


class MemoryDrafter(Drafter):
    """Drafts the best-scoring continuation of the sequence's suffix found in the sequence itself or in the
    pair's `OutputMemory`, and adds its output to the memory when the generation ends."""

    def __init__(self, memory: OutputMemory, n_vocab: int) -> None:
        self.memory = memory
        self.n_vocab = n_vocab
        self._own = SuffixIndex()

    def prefill(self, tokens: Sequence[int]) -> list[tuple[int, float]]:
        self._own = SuffixIndex(tokens)
        return []

    def propose(self, tokens: Sequence[int], k: int, sampling: SamplingParams, rng: np.random.Generator,
                grammar: Grammar | None = None) -> Draft:
        """The continuation; a grammar is the loop's to apply (it cuts the draft)."""
        self._own.extend(tokens[len(self._own):])
        match = max(self._own.match(tokens, k), self.memory.match(tokens, k), key=lambda m: m.score)
        draft = Draft(tokens=up_to_image(list(match.tokens)), match=match.length)
        if not sampling.greedy:
            draft.q = [Law.one_hot(token, self.n_vocab) for token in draft.tokens]
        return draft

    def rewind(self, n_keep: int) -> None:
        self._own.truncate(n_keep)

    def done(self, tokens: Sequence[int], n_prompt: int, ended: bool = False) -> None:
        """Remember the output, after the end of its prompt (without images)."""
        if len(tokens) > n_prompt:
            self.memory.remember(text_of(tokens[max(0, n_prompt - CONTEXT):]))
