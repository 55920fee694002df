"""Verification rules: how many drafted tokens a round keeps, and what the token after them is drawn from.

Each rule is a pure function of the target's distributions p_1..p_{K+1} (p_i given the sequence and
x_1..x_{i-1}), the draft's q_1..q_K, the drafted tokens x_1..x_K and uniforms η_1..η_K. Position i is
*decided* by η_i ≤ h_i for a threshold h_i the rule computes (`thresholds`), so a test can enumerate every
outcome of a round exactly. Both rules keep the output distributed as p; greedy decoding does not use them.

- Token verification (Leviathan et al. 2023; Chen et al. 2023): keep x_i while η_i ≤ min(1, p_i(x_i)/q_i(x_i));
  at the first failure draw from norm(max(0, p_i − q_i)).
- Block verification (Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh, "Block Verification
  Accelerates Speculative Decoding", ICLR 2025, arXiv 2403.10444, Algorithm 2) decides on the block as a
  whole. With w_0 = 1 and w_i = min(1, w_{i-1} · p_i(x_i)/q_i(x_i)) (the mass of the path x_1..x_i the target
  still owes), the block stops at i with probability
      h_i = r_i / (r_i + 1 − w_i),  r_i = Σ_x max(0, w_i · p_{i+1}(x) − q_{i+1}(x))   for i < K,
      h_K = w_K,
  it keeps x_1..x_τ for the largest τ with η_τ ≤ h_τ (0 if none), and draws the next token from
  norm(max(0, w_τ · p_{τ+1} − q_{τ+1})), or from p_{K+1} when τ = K. The paper proves it exact and never
  worse than token verification in expected kept tokens; a rejection early in the block can be undone by
  a later position that the target favours more than the draft did. It stays exact when the draft stops
  early on its own (the confidence stop): the proof only uses the distributions along the drafted path.
- Gumbel verification (drafter-invariant; Daliri, Musco & Suresh 2024, arXiv 2408.07978; `noise`) draws no
  uniforms: position i's token is the target's own Gumbel-max pick argmax log p_i + g_i, and x_i is kept iff
  it is that pick. The output is the target alone's seeded text whatever was drafted; drafts are kept less
  often than by the rules above.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from spec_cli.decoding.sampling import Law, excess_mass, residual

Distributions = Sequence[Law | np.ndarray]


@dataclass(frozen=True)
class Verdict:
    """A round's outcome: τ drafted tokens kept, and the distribution of the one token that follows them."""

    accepted: int
    next_token: Law | np.ndarray


def token_thresholds(p: Distributions, q: Distributions, draft: Sequence[int]) -> list[float]:
    """h_i = min(1, p_i(x_i) / q_i(x_i)): the chance each drafted token passes on its own."""
    return [min(1.0, p[i][x] / q[i][x]) for i, x in enumerate(draft)]


def token_verification(p: Distributions, q: Distributions, draft: Sequence[int],
                       uniforms: Sequence[float]) -> Verdict:
    """Keep drafted tokens up to the first with η_i > min(1, p_i(x_i)/q_i(x_i)); correct from the residual.

    p is read in order and only as far as the first rejection, so the caller may compute it lazily."""
    for i, x in enumerate(draft):
        if uniforms[i] * q[i][x] > p[i][x]:
            return Verdict(i, residual(p[i], q[i]))
    return Verdict(len(draft), p[len(draft)])


def _path_weights(p: Distributions, q: Distributions, draft: Sequence[int]) -> list[float]:
    """w_0..w_K with w_0 = 1 and w_i = min(1, w_{i-1} · p_i(x_i) / q_i(x_i))."""
    weights = [1.0]
    for i, x in enumerate(draft):
        weights.append(min(1.0, weights[-1] * p[i][x] / q[i][x]))
    return weights


def _stop_threshold(i: int, weights: list[float], p: Distributions, q: Distributions, k: int) -> float:
    """h_i of block verification for 1 ≤ i ≤ K."""
    if i == k:
        return weights[k]
    r = excess_mass(p[i], q[i], weights[i])
    return r / (r + 1.0 - weights[i]) if r > 0 else 0.0


def block_thresholds(p: Distributions, q: Distributions, draft: Sequence[int]) -> list[float]:
    """h_1..h_K of block verification."""
    weights = _path_weights(p, q, draft)
    return [_stop_threshold(i, weights, p, q, len(draft)) for i in range(1, len(draft) + 1)]


def block_verification(p: Distributions, q: Distributions, draft: Sequence[int],
                       uniforms: Sequence[float]) -> Verdict:
    """Keep x_1..x_τ for the largest τ with η_τ ≤ h_τ; draw the next token from the block residual.

    Positions are tried from the end, so the residual sums of positions before τ are never computed."""
    k = len(draft)
    weights = _path_weights(p, q, draft)
    for tau in range(k, 0, -1):
        if uniforms[tau - 1] <= _stop_threshold(tau, weights, p, q, k):
            break
    else:
        tau = 0
    if tau == k:
        return Verdict(k, p[k])
    return Verdict(tau, residual(p[tau], q[tau], weights[tau]))


def gumbel_verification(p: Distributions, draft: Sequence[int],
                        pick: Callable[[Law | np.ndarray, int], int]) -> Verdict:
    """Keep x_i while it equals the target's pick `pick(p_i, i)` for row i; the first pick that differs (or
    p_{K+1}'s, when every draft is kept) is the next token, as a law with all its mass there."""
    def picked(i: int) -> Law:
        return Law.one_hot(pick(p[i], i), Law.of(p[i]).size)

    for i, x in enumerate(draft):
        law = picked(i)
        if law.tokens[0] != x:
            return Verdict(i, law)
    return Verdict(len(draft), picked(len(draft)))


Rule = Callable[[Distributions, Distributions, Sequence[int], Sequence[float]], Verdict]
RULES: dict[str, Rule] = {"block": block_verification, "token": token_verification}
THRESHOLDS = {"block": block_thresholds, "token": token_thresholds}
GUMBEL = "gumbel"
VERIFY_RULES = (*RULES, GUMBEL)
DEFAULT_VERIFY = "block"
