"""Bytes to tokens and back for one vocabulary, exact to the byte: what drafting across vocabularies stands on.

Two models with different vocabularies can only meet in text. A `Speller` renders tokens as the bytes they
add to a text and spells bytes as tokens, with three things the plain tokenizer gets wrong for a *fragment*
of a text:
- bytes that are not UTF-8 (a byte-fallback token emits half a character) are spelled with the vocabulary's
  single-byte tokens, not handed to a tokenizer that expects whole characters;
- SentencePiece vocabularies that add a space prefix (Llama 2's) would put a space before every fragment;
- a model's control tokens (BOS, a chat template's turn markers) are text to another model, and the other
  model's own control token of the same text (ChatML's `<|im_start|>` in both) is parsed as such.
"""

from __future__ import annotations

from typing import Sequence

from spec_cli.llama.model import Model

_NEWLINE = b"\n"


class Speller:
    """One model's vocabulary as bytes: each token's piece, and spelling bytes with it."""

    def __init__(self, model: Model) -> None:
        self.model = model
        info = model.vocab_info()
        self.bos, self.add_bos = info.bos, info.add_bos
        self._space_prefix = model.adds_space_prefix
        n = model.n_vocab
        self.control = [model.is_control(token) for token in range(n)]
        # A control token's piece is its text (spelt like any other text by another model); a normal
        # token's is the bytes it adds to generated text.
        self.pieces = [model.piece(token, special=self.control[token]) for token in range(n)]
        self.byte_tokens: dict[int, int] = {}
        for token in range(n - 1, -1, -1):  # the lowest id wins: byte-fallback tokens come first
            piece = self.pieces[token]
            if len(piece) == 1 and not self.control[token]:
                self.byte_tokens[piece[0]] = token

    def render(self, tokens: Sequence[int]) -> bytes:
        return b"".join(self.pieces[token] for token in tokens)

    def spell(self, data: bytes) -> list[int]:
        """Tokens whose pieces concatenate to `data` where the vocabulary can spell it (a vocabulary without
        byte tokens may spell an unknown character as its unknown token)."""
        tokens: list[int] = []
        for run, valid in utf8_runs(data):
            if valid:
                tokens += self._spell_text(run)
            else:
                tokens += [self.byte_tokens[b] for b in run if b in self.byte_tokens]
        return tokens

    def spell_control(self, text: bytes) -> list[int]:
        """Another model's control token, by its text: this vocabulary's control token of that text if it
        has one (parsed as special), else the text spelt plainly."""
        tokens = self.model.tokenize_bytes(text, add_special=False, parse_special=True)
        return tokens if len(tokens) == 1 and self.control[tokens[0]] else self.spell(text)

    def _spell_text(self, text: bytes) -> list[int]:
        if not self._space_prefix:
            return self._tokenize(text)
        if text.startswith(b" ") and len(text) > 1:
            return self._tokenize(text[1:])  # the prefix puts the space back (an empty text gets none)
        # The prefix would add a space: let it land before a newline and cut both off, where they stay apart.
        tokens = self._tokenize(_NEWLINE + text)
        rendered = 0
        for i, token in enumerate(tokens):
            rendered += len(self.pieces[token])
            if rendered == len(_NEWLINE) + 1:
                return tokens[i + 1:]
            if rendered > len(_NEWLINE) + 1:
                break
        return self._tokenize(text)  # merged across the cut: the text with a space too many, rarely

    def _tokenize(self, text: bytes) -> list[int]:
        return self.model.tokenize_bytes(text, add_special=False, parse_special=False)


def utf8_runs(data: bytes) -> list[tuple[bytes, bool]]:
    """`data` cut into maximal runs of valid UTF-8 (True) and of bytes that are not (False)."""
    runs: list[tuple[bytes, bool]] = []
    start = 0
    while start < len(data):
        try:
            data[start:].decode("utf-8")
        except UnicodeDecodeError as error:
            if error.start:
                runs.append((data[start:start + error.start], True))
            bad = data[start + error.start:start + error.end]
            if runs and not runs[-1][1]:
                bad = runs.pop()[0] + bad
            runs.append((bad, False))
            start += error.end
        else:
            runs.append((data[start:], True))
            break
    return runs


def incomplete_tail(data: bytes) -> int:
    """How many bytes at the end of `data` begin a character that is not complete yet (0 to 3)."""
    for back in range(1, min(4, len(data)) + 1):
        lead = data[-back]
        if lead & 0xC0 != 0x80:  # not a continuation byte: the start of the last character
            size = _sequence_length(lead)
            return back if size > back else 0
    return 0


def _sequence_length(lead: int) -> int:
    if lead < 0x80:
        return 1
    if 0xC2 <= lead <= 0xDF:
        return 2
    if 0xE0 <= lead <= 0xEF:
        return 3
    if 0xF0 <= lead <= 0xF4:
        return 4
    return 0
