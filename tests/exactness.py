"""Exactness checks shared by the engine and memory tests: the exact distribution of the first two sampled
tokens, computed from the target's logits, and a χ² goodness-of-fit test against it."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from spec_cli import Pair, SamplingParams
from spec_cli.llama import Context
from spec_cli.sampling import probabilities

SAMPLED = SamplingParams(temperature=1.0, top_k=4)
SIGNIFICANCE = 0.001  # per χ² test; seeds are fixed, so a pass is reproducible
REPETITIVE = "the cat sat. the cat sat. the cat"  # so that n-gram lookup proposes tokens too


def exact_pair_distribution(pair: Pair, prompt: list[int],
                            sampling: SamplingParams = SAMPLED) -> dict[tuple[int, int], float]:
    """P(x1, x2) = p(x1 | prompt) · p(x2 | prompt, x1) computed from the target's logits."""
    context = Context(pair.target, n_ctx=64, n_threads=1)
    try:
        p1 = probabilities(context.decode(prompt, 1)[0], sampling, sampling.recent(prompt))
        result = {}
        for x1 in np.flatnonzero(p1):
            context.trim(len(prompt))  # a recurrent memory may go back further: feed what it lacks
            p2 = probabilities(context.decode([*prompt[context.n_past:], int(x1)], 1)[0], sampling,
                               sampling.recent([*prompt, int(x1)]))
            for x2 in np.flatnonzero(p2):
                result[(int(x1), int(x2))] = float(p1[x1] * p2[x2])
        return result
    finally:
        context.close()


def chi_square_p_value(observed: Counter, expected: dict, n: int) -> float:
    """Goodness of fit of observed pair counts to exact probabilities; cells expecting < 5 are pooled."""
    stat, pooled_obs, pooled_exp, cells = 0.0, 0, 0.0, 0
    for key, prob in expected.items():
        if prob * n >= 5:
            stat += (observed[key] - prob * n) ** 2 / (prob * n)
            cells += 1
        else:
            pooled_obs += observed[key]
            pooled_exp += prob * n
    pooled_obs += sum(count for key, count in observed.items() if key not in expected)
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        cells += 1
    return chi2_survival(stat, cells - 1)


def chi2_survival(x: float, dof: int) -> float:
    """P(χ²_dof > x) by the series of the regularised lower incomplete gamma function."""
    a, z = dof / 2, x / 2
    if z > a + 40 * math.sqrt(a) + 40:
        return 0.0  # far in the tail (p < 1e-30); the series below would overflow
    term = total = 1.0 / a
    for n in range(1, 1000):
        term *= z / (a + n)
        total += term
    return max(0.0, 1.0 - math.exp(-z + a * math.log(z) - math.lgamma(a)) * total) if z > 0 else 1.0
