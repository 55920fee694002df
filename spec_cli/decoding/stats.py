"""Counters of a speculative generation and the figures derived from them.

Counts are exact; the derived figures are computed from them on demand so they can never disagree:
α̂ = accepted / drafted (acceptance rate) and mean accepted length = 1 + accepted / rounds, the tokens each
target pass yields (1 when nothing is drafted, K + 1 when every draft is accepted).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spec_cli.decoding.costs import LoopCosts


@dataclass
class Stats:
    """Live statistics; the engine updates them as it goes, so a UI can show them mid-generation."""

    draft_max: int
    adaptive: bool = False
    draft_mode: str = "none"  # what drafted: model, mtp (the target's MTP head), ngram, hybrid or none
    ways: dict[str, list[int]] = field(default_factory=dict)  # the hybrid's: per way, [rounds, drafted, accepted]
    current_k: int = 0
    prompt_tokens: int = 0
    prompt_cached: int = 0  # prompt tokens already in the target's cache, not evaluated again
    generated_tokens: int = 0
    rounds: int = 0
    rejected_rounds: int = 0  # rounds in which a drafted token was rejected
    caught_up: int = 0  # tokens the drafter took in between rounds (chunks of a long catch-up)
    drafted: int = 0
    accepted: int = 0
    accepted_at: list[int] = field(default_factory=list)
    drafted_at: list[int] = field(default_factory=list)
    reached_at: list[int] = field(default_factory=list)  # rounds that drafted position i with all before it kept
    prompt_s: float = 0.0
    decode_s: float = 0.0
    draft_s: float = 0.0
    convert_s: float = 0.0  # of draft_s: translating between two vocabularies (drafting through text)
    verify_s: float = 0.0
    llama_s: float = 0.0
    rollback_s: float = 0.0  # taking back rejected tokens: snapshots, restores, replays (within the above)
    plan_s: float = 0.0  # choosing each round's way and K: the K controller, a drafter's choice of way, the batch's
    batched: int = 0  # Σ over rounds of the sequences verified in that round's pass (1 for a generation alone)
    memory: dict[str, dict[str, str]] = field(default_factory=dict)  # per model: kind, rollback method
    placement: dict[str, str] = field(default_factory=dict)  # per model: "CPU", or the devices it runs on
    threads: tuple[int, int] = (0, 0)  # the target's thread count as it ended, and the most (`llama/threads.py`)
    costs: LoopCosts = field(default_factory=LoopCosts)  # each call's seconds, for the cost model

    def merge(self, other: Stats) -> None:
        """Add another generation's counts and times to these (a chat session's totals)."""
        for name in ("prompt_tokens", "prompt_cached", "generated_tokens", "rounds", "rejected_rounds", "caught_up",
                     "drafted",
                     "accepted", "batched",
                     "prompt_s", "decode_s", "draft_s", "convert_s", "verify_s", "llama_s", "rollback_s", "plan_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for mine, theirs in ((self.drafted_at, other.drafted_at), (self.accepted_at, other.accepted_at),
                             (self.reached_at, other.reached_at)):
            mine.extend([0] * (len(theirs) - len(mine)))
            for i, count in enumerate(theirs):
                mine[i] += count
        for way, counts in other.ways.items():
            self.ways[way] = [mine + theirs for mine, theirs in zip(self.ways.get(way, [0, 0, 0]), counts)]
        self.costs.merge(other.costs)
        self.threads = other.threads if other.threads[1] else self.threads  # the latest

    def record_round(self, drafted: int, accepted: int, way: str = "") -> None:
        """Count one draft-and-verify round in which `accepted` of `drafted` tokens were kept, drafted by `way`
        (a hybrid's choice; "" for a pinned mode)."""
        if way:
            counts = self.ways.setdefault(way, [0, 0, 0])
            counts[0], counts[1], counts[2] = counts[0] + 1, counts[1] + drafted, counts[2] + accepted
        self.rounds += 1
        self.rejected_rounds += accepted < drafted
        self.drafted += drafted
        self.accepted += accepted
        for counts, n in ((self.drafted_at, drafted), (self.accepted_at, accepted),
                          (self.reached_at, min(accepted + 1, drafted))):
            counts.extend([0] * (n - len(counts)))
            for i in range(n):
                counts[i] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return 1.0 + self.accepted / self.rounds if self.rounds else 0.0

    @property
    def position_acceptance(self) -> list[float]:
        """How often draft position i (0-based) was accepted when it was drafted."""
        accepted = self.accepted_at + [0] * (len(self.drafted_at) - len(self.accepted_at))
        return [a / d for a, d in zip(accepted, self.drafted_at)]

    def way_shares(self) -> dict[str, dict[str, float | int]]:
        """Per way a hybrid chose: its rounds, their share of the rounds it chose for (not the last ones, where
        no token is left to draft), the tokens drafted and kept, and the tokens its rounds yielded each (kept
        drafts and the target's own token)."""
        chosen = sum(rounds for rounds, _drafted, _accepted in self.ways.values())
        return {way: {"rounds": rounds, "share": rounds / chosen, "drafted": drafted, "accepted": accepted,
                      "tokens_per_round": 1.0 + accepted / rounds}
                for way, (rounds, drafted, accepted) in self.ways.items() if rounds}

    @property
    def batch_size(self) -> float:
        """The mean number of sequences the rounds' verify passes served (1 for a generation run alone)."""
        return self.batched / self.rounds if self.batched and self.rounds else 1.0

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens over decode time (end of prompt processing to the last token)."""
        return self.generated_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def prompt_tokens_per_second(self) -> float:
        return self.prompt_tokens / self.prompt_s if self.prompt_s > 0 else 0.0

    @property
    def elapsed_s(self) -> float:
        return self.prompt_s + self.decode_s

    @property
    def convert_share(self) -> float:
        """The part of the rounds' time (drafting and verifying) spent translating between vocabularies."""
        rounds_s = self.draft_s + self.verify_s
        return self.convert_s / rounds_s if rounds_s > 0 else 0.0

    @property
    def overhead_s(self) -> float:
        """Decode time spent outside llama.cpp's decode calls: sampling, acceptance tests, bookkeeping,
        and whatever the consumer of the events does between tokens."""
        return max(0.0, self.decode_s - self.llama_s)

    def as_dict(self) -> dict[str, float | int | list[float]]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "prompt_cached": self.prompt_cached,
            "generated_tokens": self.generated_tokens,
            "rounds": self.rounds,
            "rejected_rounds": self.rejected_rounds,
            "caught_up": self.caught_up,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_length": self.mean_accepted_length,
            "batch_size": self.batch_size,
            "position_acceptance": self.position_acceptance,
            "tokens_per_second": self.tokens_per_second,
            "prompt_tokens_per_second": self.prompt_tokens_per_second,
            "elapsed_s": self.elapsed_s,
            "prompt_s": self.prompt_s,
            "decode_s": self.decode_s,
            "draft_s": self.draft_s,
            "convert_s": self.convert_s,
            "convert_share": self.convert_share,
            "verify_s": self.verify_s,
            "llama_s": self.llama_s,
            "rollback_s": self.rollback_s,
            "plan_s": self.plan_s,
            "plan_per_round_s": self.plan_s / self.rounds if self.rounds else 0.0,
            "overhead_s": self.overhead_s,
            "draft_max": self.draft_max,
            "draft_mode": self.draft_mode,
            "ways": self.way_shares(),
            "adaptive_k": self.adaptive,
            "current_k": self.current_k,
            "memory": self.memory,
            "placement": self.placement,
            "threads": {"last": self.threads[0], "most": self.threads[1]},
            "costs": self.costs.as_dict(),
        }
