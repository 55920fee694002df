"""Running llama.cpp's `llama-speculative-simple` for the benchmarks that measure spec-cli against it, and
reading its figures off its log."""

from __future__ import annotations

import re
import subprocess

DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
DRAFTED = re.compile(r"n_drafted\s+=\s+(\d+)")
ACCEPTED = re.compile(r"n_accept\s+=\s+(\d+)")


def run(command: list[str], tries: int = 3) -> tuple[int, float, int, int]:
    """(tokens decoded, seconds, tokens drafted, drafts accepted) of one run of the tool. It now and then
    exits before printing its figures; it is run again then."""
    for _ in range(tries):
        output = subprocess.run(command, capture_output=True, text=True, errors="replace", check=True).stderr
        decoded, drafted, accepted = DECODED.search(output), DRAFTED.search(output), ACCEPTED.search(output)
        if decoded and drafted and accepted:
            return (int(decoded.group(1)), float(decoded.group(2)), int(drafted.group(1)),
                    int(accepted.group(1)))
    raise RuntimeError(f"{command[0]} printed no figures in {tries} runs:\n{output[-2000:]}")
