"""Target-only against speculative decoding configurations on the same pair, in one run, interleaved.

Runs rotate through the configurations (target alone, then each drafting setup) for every prompt, so drift
in machine load hits all of them alike; figures are medians over runs. Every configuration uses the same
loaded models and the same code path (draft mode "none" is target-only decoding), so the ratios measure
speculation and nothing else.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable, Sequence

from spec_cli.pair import Pair
from spec_cli.stats import Stats

CHAT_PROMPTS = (
    "Explain speculative decoding in one paragraph.",
    "Write a Python function that checks whether a string is a palindrome.",
    "List five tips for staying focused while working from home.",
    "Summarise the plot of Romeo and Juliet in a few sentences.",
)

_CODE = '''def summarize(orders):
    total = 0
    count = 0
    for order in orders:
        if order.status == "cancelled":
            continue
        total += order.amount
        count += 1
    average = total / count if count else 0
    print(f"{count} orders, total {total}, average {average:.2f}")
    return total, average
'''

# Input-grounded tasks: the answer repeats most of the prompt, which is where n-gram lookup shines.
REWRITE_PROMPTS = (
    f"Rename the variable `total` to `revenue` in this code. Reply with the full code only.\n\n{_CODE}",
    f"Rename the function `summarize` to `report` in this code. Reply with the full code only.\n\n{_CODE}",
    f"Add a docstring to this function. Reply with the full code only.\n\n{_CODE}",
)

TASKS = {"chat": CHAT_PROMPTS, "rewrite": REWRITE_PROMPTS}


@dataclass(frozen=True)
class Config:
    """One way of decoding: a draft mode ("none" for the target alone) and K (a number or "auto")."""

    draft_mode: str
    draft_max: int | str

    @property
    def label(self) -> str:
        return "target alone" if self.draft_mode == "none" else f"{self.draft_mode} K={self.draft_max}"


TARGET_ALONE = Config("none", 0)


@dataclass
class Side:
    """The runs of one configuration."""

    config: Config
    runs: list[Stats] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.config.label

    @property
    def tokens_per_second(self) -> float:
        return statistics.median(s.tokens_per_second for s in self.runs)

    @property
    def drafted(self) -> int:
        return sum(s.drafted for s in self.runs)

    @property
    def acceptance_rate(self) -> float:
        return sum(s.accepted for s in self.runs) / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        rounds = sum(s.rounds for s in self.runs)
        return 1 + sum(s.accepted for s in self.runs) / rounds if rounds else 0.0

    def share(self, part: str) -> float:
        """Fraction of decode time spent in `part`: "draft_s", "verify_s" or "overhead_s" (outside llama.cpp)."""
        decode = sum(s.decode_s for s in self.runs)
        return sum(getattr(s, part) for s in self.runs) / decode if decode else 0.0


def compare(pair: Pair, configs: Sequence[Config], prompts: Sequence[str] = CHAT_PROMPTS,
            max_tokens: int = 128, repeat: int = 1, raw: bool = False,
            progress: Callable[[str], None] = lambda _label: None) -> list[Side]:
    """Greedy runs of every prompt under every configuration, rotating through them; one Side each."""
    sides = [Side(config) for config in configs]
    for _ in range(repeat):
        for prompt in prompts:
            for side in sides:
                progress(side.label)
                generation = pair.generate(prompt, draft_mode=side.config.draft_mode, raw=raw, seed=0,
                                           draft_max=side.config.draft_max, max_tokens=max_tokens)
                for _event in generation:
                    pass
                side.runs.append(generation.stats)
    return sides
