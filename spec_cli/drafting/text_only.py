"""The text of a sequence whose prompt holds images: what drafters fed with the target's states hold.

An MTP or EAGLE-3 head pairs each token with the target's state before it, and a DFlash drafter holds the
target's features at each position. An image has no token to pair, and the target keeps no state for its rows
(libmtmd decodes them). So these drafters read the text around images, as a text-only draft does: text token j
goes with the target's state at the sequence position of text token j − 1, which has seen every image before it.
Images sit in the prompt only, so past the prompt text token j is at sequence position j + (image ids).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


class TextOnly:
    """The text positions of the sequence whose prompt `see` was last given (all of them when it held no image)."""

    def __init__(self) -> None:
        self._text_at: np.ndarray | None = None  # where the prompt held images: the position of each text token
        self._images = 0  # how many image ids the prompt held
        self._prompt: list[int] = []

    def see(self, prompt: Sequence[int]) -> None:
        """A new prompt: where its images are."""
        text_at = np.flatnonzero(np.asarray(prompt) >= 0) if prompt and min(prompt) < 0 else None
        self._text_at, self._images = text_at, 0 if text_at is None else len(prompt) - len(text_at)
        self._prompt = list(prompt) if text_at is not None else []

    def length(self, n: int) -> int:
        """How many text tokens the first `n` of the sequence hold."""
        if self._text_at is None:
            return n
        return int(np.searchsorted(self._text_at, n)) if n <= len(self._prompt) else n - self._images

    def text(self, tokens: Sequence[int], start: int, end: int | None = None) -> list[int]:
        """Text tokens [start, end) of the sequence `tokens`."""
        if self._text_at is None:
            return list(tokens[start:end])
        n = len(self._text_at)
        text = [tokens[i] for i in self._text_at[start:end]] + list(tokens[max(start, n) + self._images:])
        return text if end is None else text[:end - start]

    def positions(self, start: int, end: int) -> np.ndarray | slice:
        """The sequence positions of text tokens [start, end)."""
        if self._text_at is None:
            return slice(start, end)
        n = len(self._text_at)
        at = np.arange(start, end)
        return np.where(at < n, self._text_at[np.minimum(at, n - 1)], at + self._images)

    def sequence(self, text: Sequence[int]) -> list[int]:
        """The sequence (its images included) up to the last of its first text tokens, `text`: what a drafter
        holding them holds, for a new prompt to share a prefix with."""
        if self._text_at is None or not text:
            return list(text)
        n = len(self._text_at)
        return self._prompt[:self._text_at[len(text) - 1] + 1] if len(text) <= n else [*self._prompt, *text[n:]]
