"""Prompt texts the real-model tests and the float-tie benchmark share, shipped with the tests so that no
input depends on the interpreter or machine that runs them."""

from __future__ import annotations

from pathlib import Path

# About 1700 tokens of Python (an early copy of spec_cli/decoding/sampling.py): past Gemma 3's 512-token window.
LONG = (Path(__file__).parent.parent / "data" / "long_prompt.txt").read_text(encoding="utf-8")

PROSE = "The history of the printing press begins"
CODE = 'def fibonacci(n):\n    """Return the n-th number."""\n'
FRENCH = "Le café à Paris est très"
JAPANESE = "東京の天気は"

# The set `pytest --ties` runs a greedy-identity test over (prose, code, a long prompt past a sliding window).
TIE_SET = {"prose": PROSE, "code": CODE, "french": FRENCH, "long": LONG}
