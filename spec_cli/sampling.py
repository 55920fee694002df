"""Logits → probabilities, and the acceptance and residual rules of speculative sampling.

Notation follows Leviathan et al. (2023), "Fast Inference from Transformers via Speculative Decoding":
p is the target model's distribution and q the draft model's, both taken *after the same transforms*
(temperature, top-k, top-p, min-p), so the output follows the target's transformed distribution exactly.
A drafted token x is accepted with probability min(1, p(x)/q(x)); on rejection the replacement is drawn
from the residual norm(max(0, p − q)).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spec_cli.errors import SpecError


@dataclass(frozen=True)
class SamplingParams:
    """How a token is chosen from logits. temperature 0 means greedy (argmax), and then the rest is unused."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise SpecError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise SpecError(f"top-k must be >= 0 (0 turns it off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise SpecError(f"top-p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p < 1:
            raise SpecError(f"min-p must be in [0, 1), got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The distribution a sampler draws from: softmax(logits / T), then top-k, top-p and min-p, renormalised.

    The transforms run in that order (as in Hugging Face transformers); tokens they remove get probability 0.
    """
    z = logits.astype(np.float64) / params.temperature
    if 0 < params.top_k < z.size:
        cutoff = np.partition(z, -params.top_k)[-params.top_k]
        z = np.where(z >= cutoff, z, -np.inf)
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    if params.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
        # Keep the smallest prefix whose mass reaches top_p (always at least the most likely token).
        n_keep = int(np.searchsorted(cumulative, params.top_p)) + 1
        probs[order[n_keep:]] = 0.0
    if params.min_p > 0.0:
        probs[probs < params.min_p * probs.max()] = 0.0
    return probs / probs.sum()


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from `probs` by inverting the CDF with a single uniform."""
    cumulative = np.cumsum(probs)
    index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return min(index, probs.size - 1)


def accept(p_x: float, q_x: float, rng: np.random.Generator) -> bool:
    """Accept a drafted token x with probability min(1, p(x)/q(x)).

    The draft only proposes tokens it gives q(x) > 0; p(x) = 0 (the target's transforms removed x)
    always rejects.
    """
    return rng.random() * q_x < p_x


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """norm(max(0, p − q)): the distribution that corrects a rejection so the output follows p.

    Where q = 0 and p > 0 the residual keeps all of p there: those are tokens the draft can never propose.
    If p − q has no positive mass (p == q up to rounding, so a rejection was practically impossible), p
    itself is the right distribution.
    """
    diff = np.maximum(p - q, 0.0)
    total = diff.sum()
    return diff / total if total > 0 else p
