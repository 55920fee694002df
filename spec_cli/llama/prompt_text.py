"""A prompt's text with its message text marked, so that a chat template's markers are control tokens and what a
user typed never is.

llama.cpp tokenizes with `parse_special` over the whole rendered prompt: the text of a control token anywhere
becomes that token, so a user who types `<|im_end|><|im_start|>system` closes their own turn and writes a system
one. Here the template is rendered once more with each message's text replaced by a random sentinel, which shows
where message text sits; the prompt is then split as llama.cpp's tokenizer splits it (`tokenizer_st_partition`:
control tokens longest first, each found left to right, whitespace stripped beside those that ask for it), except
that no control token is found inside message text, and every other fragment is tokenized as plain text.
A prompt whose messages spell no control token is tokenized exactly as llama.cpp would.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from spec_cli.errors import SpecError

Span = tuple[int, int]
IMAGE_MARKER = f"<__image_{secrets.token_hex(6)}__>"  # where message text holds an image: no user can type it
WHITESPACE = " \t\n\v\f\r"  # C's isspace, which llama.cpp strips beside a token marked lstrip or rstrip


def with_images(text: str, n_images: int) -> str:
    """`text` after `n_images` image markers, each on a line of its own (an image, then what to do with it)."""
    return "".join(f"{IMAGE_MARKER}\n" for _ in range(n_images)) + text


@dataclass(frozen=True)
class PromptText:
    """Text to tokenize, and the spans of it (character offsets, ascending) that are message text: no control
    token is parsed there. Text with no spans (a raw prompt) is parsed as llama.cpp parses it."""

    text: str
    plain: tuple[Span, ...] = ()

    def after(self, start: int) -> PromptText:
        """The text from `start` on, with its spans."""
        spans = tuple((max(a, start) - start, b - start) for a, b in self.plain if b > start)
        return PromptText(self.text[start:], spans)


@dataclass(frozen=True)
class ControlToken:
    id: int
    text: str
    lstrip: bool  # llama.cpp strips the whitespace before it (LLAMA_TOKEN_ATTR_LSTRIP)
    rstrip: bool  # and after it


class ControlTokens:
    """The tokens llama.cpp's tokenizer parses out of text when asked to (control and unknown ones), in the order
    it tries them: longest text first."""

    def __init__(self, tokens: Sequence[ControlToken]) -> None:
        self.tokens = sorted(tokens, key=lambda t: len(t.text.encode()), reverse=True)
        alternatives = "|".join(re.escape(t.text) for t in self.tokens)
        self._pattern = re.compile(f"(?=({alternatives}))") if self.tokens else None  # overlapping matches too

    def found_in(self, text: str) -> list[ControlToken]:
        """The tokens whose text occurs in `text`, in the order they are tried: one pass over the text, which
        finds the longest token starting at each position (a shorter one starting at the same place is found
        elsewhere in the text, or the longer one takes it, as in llama.cpp)."""
        if self._pattern is None:
            return []
        seen = {match.group(1) for match in self._pattern.finditer(text)}
        return [t for t in self.tokens if t.text in seen]

    def partition(self, prompt: PromptText) -> list[Span | int]:
        """`prompt` as llama.cpp's tokenizer splits it: control token ids and spans of text between them, with
        no control token taken from inside a plain span."""
        text = prompt.text
        fragments: list[Span | int] = [(0, len(text))] if text else []
        for token in self.found_in(text):
            fragments = [piece for fragment in fragments
                         for piece in ([fragment] if isinstance(fragment, int) else
                                       _split(text, fragment, token, prompt.plain))]
        return fragments


def _split(text: str, fragment: Span, token: ControlToken, plain: tuple[Span, ...]) -> list[Span | int]:
    """One text fragment split at each occurrence of `token` outside the plain spans, left to right."""
    start, end = fragment
    pieces: list[Span | int] = []
    at = start
    while (found := text.find(token.text, at, end)) >= 0:
        stop = found + len(token.text)
        inside = next((b for a, b in plain if a < stop and found < b), None)
        if inside is not None:  # in message text: the next match that may count starts where that text ends
            at = inside
            continue
        left = found
        while token.lstrip and left > start and text[left - 1] in WHITESPACE:
            left -= 1
        if left > start:
            pieces.append((start, left))
        pieces.append(token.id)
        start = stop
        while token.rstrip and start < end and text[start] in WHITESPACE:
            start += 1
        at = start
    if start < end:
        pieces.append((start, end))
    return pieces


def render_chat(render: Callable[[list[dict[str, Any]]], str], messages: Sequence[dict[str, Any]],
                controls: ControlTokens) -> PromptText:
    """The chat template's text for `messages` (`render` applies the template), with the message text in it marked.

    The template runs twice: as it is, and with each message's text replaced by a random sentinel. Where putting
    the texts back in place of the sentinels gives the same prompt (templates that copy message text as it is),
    that is the prompt, its spans exact. A template that rewrites message text (trims it, drops a thought) gives
    another prompt: it is kept as rendered when no message spells a control token, since then there is nothing to
    guard; otherwise the texts go back verbatim where the sentinels were.
    """
    rendered = render(list(messages))
    nonce = secrets.token_hex(6)
    marks = [f"\ue000{nonce}:{i}\ue001" if message.get("content") else "" for i, message in enumerate(messages)]
    texts = {mark: message["content"] for mark, message in zip(marks, messages) if mark}
    marked = render([{**message, "content": mark} for mark, message in zip(marks, messages)])
    text, spans = "", []
    for piece in re.split(f"(\ue000{nonce}:\\d+\ue001)", marked):
        if piece in texts:
            spans.append((len(text), len(text) + len(texts[piece])))
            piece = texts[piece]
        text += piece
    intact = marked.count("\ue000") == len(spans)  # a template that cuts message text cuts its sentinel
    if intact and text == rendered:
        return PromptText(text, tuple(spans))
    if not any(controls.found_in(content) for content in texts.values()):
        return PromptText(rendered)
    if intact:
        return PromptText(text, tuple(spans))
    raise SpecError("a message spells a control token, and the chat template cuts message text, so the two cannot "
                    "be told apart: remove the control token's text from the message")
