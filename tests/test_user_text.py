"""The user's text made valid Unicode (`formats.user_text`): whatever bytes arrive, the tokenizer gets text, and the
caller learns whether any had to be replaced."""

from __future__ import annotations

import os

import pytest

from spec_cli.formats.user_text import decode_user_text


@pytest.mark.parametrize("data, text, replaced", [
    ("Grüße, 世界", "Grüße, 世界", False),
    ("Grüße".encode(), "Grüße", False),
    (b"Say \xff\xfe hi", "Say \ufffd\ufffd hi", True),
    (b"caf\xc3", "caf\ufffd", True),  # a sequence cut short
    (os.fsdecode(b"Say \xff hi"), "Say \ufffd hi", True),  # argv's lone surrogate for a byte
    ("\ud800 alone", "? alone", True),  # a surrogate that stands for no byte
    ("", "", False),
])
def test_text_is_valid_unicode_and_says_whether_bytes_were_replaced(data: bytes | str, text: str,
                                                                    replaced: bool) -> None:
    decoded, changed = decode_user_text(data)
    assert (decoded, changed) == (text, replaced)
    decoded.encode("utf-8")  # never raises
