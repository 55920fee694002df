"""How many tokens to draft next round: a fixed K, or K chosen from measured acceptance and costs.

With per-token acceptance probability α, a round that drafts K tokens emits on average
E[tokens](K) = (1 − α^(K+1)) / (1 − α) (Leviathan et al. 2023) and costs K·c_d + c_v(K), where c_d is a draft
step and c_v(K) a target pass over K + 1 tokens; `AdaptiveK` refines E with acceptance measured per draft
position. `AdaptiveK` estimates α and both costs as it goes and
moves K towards the value that maximises E[tokens](K) / (K·c_d + c_v(K)), at most 2 a round; until it has
measured enough it follows the transformers heuristic (K + 2 after a fully accepted round, K − 1
otherwise), which also explores K.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class DraftLength(Protocol):
    k_max: int
    """The most tokens a round may draft."""

    def next_k(self) -> int:
        """K for the next round (the engine still shrinks it to fit max_tokens and the context)."""

    def update(self, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        """Learn from a finished round: `accepted` of `drafted` kept; seconds spent drafting and verifying."""


class FixedK:
    def __init__(self, k: int) -> None:
        self.k_max = k

    def next_k(self) -> int:
        return self.k_max

    def update(self, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        pass


def expected_tokens(alpha: float, k: int) -> float:
    """E[tokens per round] = (1 − α^(K+1)) / (1 − α): accepted drafts plus the target's own token."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class AdaptiveK:
    """Chooses K to maximise expected tokens per second from running estimates of acceptance, c_d and c_v(K).

    A single α assumes every draft position is accepted alike, but later positions are accepted less often
    (the draft drifts from the target), so the geometric formula overrates long drafts. Acceptance is
    therefore tracked per position: a_i = P(d_i accepted | d_1..d_{i−1} accepted), and
    E[tokens](K) = 1 + Σ_{i≤K} a_1·…·a_i. Positions seen too rarely fall back to the overall α̂, the
    truncated-geometric estimate Σ accepted / (Σ accepted + rounds that ended in a rejection). Counts decay
    by `decay` a round so the estimates follow the text (code and prose differ).
    c_v(K) is fitted as a + b·(K + 1) over the verify times seen so far, and never taken below half the
    cheapest verify measured (a fit through few, noisy points can dip towards zero for small K).
    """

    def __init__(self, k_max: int, k_start: int = 4, warmup_rounds: int = 3, decay: float = 0.98) -> None:
        self.k_max = k_max
        self.k = min(k_start, k_max)
        self.warmup_rounds = warmup_rounds
        self.decay = decay
        self.rounds = 0
        self.accepted = 0.0
        self.rejections = 0.0
        self.reached = np.zeros(k_max)
        self.accepted_at = np.zeros(k_max)
        self.draft_time = 0.0
        self.drafted = 0.0
        self.verify_samples: dict[int, tuple[float, int]] = {}

    @property
    def alpha(self) -> float:
        total = self.accepted + self.rejections
        return self.accepted / total if total else 0.5

    def expected_tokens(self, k: int) -> float:
        """E[tokens](K) = 1 + Σ_{i≤K} Π_{j≤i} a_j, with per-position rates where there is evidence."""
        seen = self.reached[:k] >= 2.0
        rates = np.where(seen, self.accepted_at[:k] / np.maximum(self.reached[:k], 1e-9), self.alpha)
        rates = np.concatenate([rates, np.full(k - len(rates), self.alpha)])
        return 1.0 + float(np.cumprod(rates).sum())

    def next_k(self) -> int:
        return self.k

    def update(self, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        if drafted == 0:
            return
        self.rounds += 1
        self.accepted = self.accepted * self.decay + accepted
        self.rejections = self.rejections * self.decay + (1 if accepted < drafted else 0)
        self.reached *= self.decay
        self.accepted_at *= self.decay
        reached = min(accepted + 1, drafted)  # positions drafted with every earlier one accepted
        self.reached[:reached] += 1
        self.accepted_at[:accepted] += 1
        self.draft_time += draft_s
        self.drafted += drafted
        total, count = self.verify_samples.get(drafted, (0.0, 0))
        self.verify_samples[drafted] = (total + verify_s, count + 1)
        self.k = self._heuristic(drafted, accepted) if self.rounds < self.warmup_rounds else self._best_k()

    def _heuristic(self, drafted: int, accepted: int) -> int:
        return min(self.k_max, self.k + 2) if accepted == drafted else max(1, self.k - 1)

    def verify_cost(self) -> tuple[float, float]:
        """(a, b) of c_v(K) = a + b·(K + 1), least squares over the mean verify time of each K seen,
        weighted by how often each K was seen."""
        ks = np.array([k + 1 for k in self.verify_samples], dtype=float)
        means = np.array([total / count for total, count in self.verify_samples.values()])
        counts = np.array([count for _total, count in self.verify_samples.values()], dtype=float)
        if len(ks) < 2:
            return float(means[0]), 0.0
        b, a = np.polyfit(ks, means, 1, w=np.sqrt(counts))
        return float(a), max(float(b), 0.0)

    def _best_k(self) -> int:
        """The K with the highest modelled rate within ±2 of the current one.

        Moving by at most 2 a round keeps one noisy cost fit (a busy machine, few K values seen yet) from
        throwing K to an extreme; each move also measures a new K, which improves the fit.
        """
        a, b = self.verify_cost()
        floor = 0.5 * min(total / count for total, count in self.verify_samples.values())
        draft_step = self.draft_time / self.drafted
        candidates = range(max(1, self.k - 2), min(self.k_max, self.k + 2) + 1)
        return max(candidates, key=lambda k: self.expected_tokens(k)
                   / (k * draft_step + max(a + b * (k + 1), floor)))
