"""Text as users hand it over (arguments, stdin, prompt files, chat input), made valid Unicode.

Bytes that are not UTF-8 reach Python as lone surrogates (argv, and stdin under a C locale) or as a decode
error; either way they would end in a traceback when the prompt is encoded for the tokenizer. They become
U+FFFD instead, and the caller says so in one line.
"""

from __future__ import annotations

NOT_UTF8_NOTE = "not valid UTF-8; the undecodable bytes were replaced with U+FFFD (�)"


def decode_user_text(data: bytes | str) -> tuple[str, bool]:
    """(`data` as valid text, whether any bytes had to be replaced)."""
    if isinstance(data, str):
        try:
            data = data.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:  # a surrogate that stands for no byte
            return data.encode("utf-8", "replace").decode("utf-8"), True
    try:
        return data.decode("utf-8"), False
    except UnicodeDecodeError:
        return data.decode("utf-8", "replace"), True
