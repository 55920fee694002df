"""Cutting streamed text at stop strings, as OpenAI's `stop` field asks.

Text arrives a token's piece at a time, and a stop string can span several pieces, so a tail that could be
the start of one is held back until the next piece settles it. Released text therefore never contains the
beginning of a stop string, and the text is cut before the first stop string to be completed.
"""

from __future__ import annotations

from typing import Sequence


class StopStrings:
    """Feed pieces in order; each call returns what can be released now. After a match, `stopped` is set
    and the text before the stop string has been released."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [stop for stop in stops if stop]
        self.stopped = False
        self._held = ""

    def feed(self, piece: str) -> str:
        text = self._held + piece
        found = [i for i in (text.find(stop) for stop in self.stops) if i >= 0]
        if found:
            self.stopped, self._held = True, ""
            return text[:min(found)]
        keep = self._open_tail(text)
        self._held = text[len(text) - keep:]
        return text[:len(text) - keep]

    def flush(self) -> str:
        """The held tail, once no more text will come (no stop string completed)."""
        held, self._held = self._held, ""
        return held

    def _open_tail(self, text: str) -> int:
        """The length of the longest end of `text` that begins some stop string."""
        for size in range(min(len(text), max((len(s) for s in self.stops), default=0) - 1), 0, -1):
            tail = text[-size:]
            if any(stop.startswith(tail) for stop in self.stops):
                return size
        return 0
