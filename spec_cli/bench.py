"""Target-only against speculative decoding on the same pair, in one run, interleaved.

Runs alternate (target alone, speculative, target alone, …) over every prompt so that drift in machine load
hits both sides alike; figures are medians over runs. Both sides use the same loaded models and the same
code path (`draft_max = 0` is target-only decoding), so the ratio measures speculation and nothing else.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable, Sequence

from spec_cli.pair import Pair
from spec_cli.stats import Stats

DEFAULT_PROMPTS = (
    "Explain speculative decoding in one paragraph.",
    "Write a Python function that checks whether a string is a palindrome.",
    "List five tips for staying focused while working from home.",
    "Summarise the plot of Romeo and Juliet in a few sentences.",
)


@dataclass
class Side:
    """The runs of one configuration (target alone, or speculative with K drafts)."""

    label: str
    draft_max: int
    runs: list[Stats] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return statistics.median(s.tokens_per_second for s in self.runs)

    @property
    def acceptance_rate(self) -> float:
        drafted = sum(s.drafted for s in self.runs)
        return sum(s.accepted for s in self.runs) / drafted if drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        rounds = sum(s.rounds for s in self.runs)
        return 1 + sum(s.accepted for s in self.runs) / rounds if rounds else 0.0

    @property
    def overhead_share(self) -> float:
        """Fraction of decode time spent outside llama.cpp's decode calls (Python, sampling, bookkeeping)."""
        decode = sum(s.decode_s for s in self.runs)
        return sum(s.overhead_s for s in self.runs) / decode if decode else 0.0

    @property
    def draft_share(self) -> float:
        decode = sum(s.decode_s for s in self.runs)
        return sum(s.draft_s for s in self.runs) / decode if decode else 0.0


def compare(pair: Pair, draft_max: int, prompts: Sequence[str] = DEFAULT_PROMPTS, max_tokens: int = 128,
            repeat: int = 1, raw: bool = False,
            progress: Callable[[str], None] = lambda _label: None) -> tuple[Side, Side]:
    """Greedy runs of every prompt, alternating target-only and speculative; returns (alone, speculative)."""
    alone, speculative = Side("target alone", 0), Side(f"speculative K={draft_max}", draft_max)
    for _ in range(repeat):
        for prompt in prompts:
            for side in (alone, speculative):
                progress(side.label)
                generation = pair.generate(prompt, draft_max=side.draft_max, max_tokens=max_tokens, raw=raw,
                                           seed=0)
                for _event in generation:
                    pass
                side.runs.append(generation.stats)
    return alone, speculative
