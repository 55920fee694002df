"""The acceptance and residual math on hand-made p and q, and the logit transforms."""

from __future__ import annotations

import numpy as np
import pytest

from spec_cli.errors import SpecError
from spec_cli.sampling import SamplingParams, accept, probabilities, residual, sample


def test_residual_is_normalised_positive_part_of_p_minus_q() -> None:
    p = np.array([0.5, 0.3, 0.2, 0.0])
    q = np.array([0.2, 0.5, 0.2, 0.1])
    np.testing.assert_allclose(residual(p, q), [1.0, 0.0, 0.0, 0.0])


def test_residual_keeps_p_where_the_draft_gives_zero() -> None:
    # q = 0 where p > 0: the draft can never propose token 2, so the residual must supply all its mass.
    p = np.array([0.25, 0.25, 0.5])
    q = np.array([0.5, 0.5, 0.0])
    np.testing.assert_allclose(residual(p, q), [0.0, 0.0, 1.0])


def test_residual_falls_back_to_p_when_p_equals_q() -> None:
    p = np.array([0.1, 0.9])
    np.testing.assert_allclose(residual(p, p.copy()), p)


def test_accept_probability_is_min_one_p_over_q() -> None:
    rng = np.random.default_rng(0)
    n = 20000
    rate = np.mean([accept(0.2, 0.5, rng) for _ in range(n)])
    # Binomial(n, 0.4): standard error ~0.0035, so 5 standard errors is far beyond chance.
    assert abs(rate - 0.4) < 0.0175
    assert all(accept(0.6, 0.5, rng) for _ in range(1000))
    assert not any(accept(0.0, 0.5, rng) for _ in range(1000))


def test_speculative_step_reproduces_p_exactly() -> None:
    """Draft from q, accept with min(1, p/q), else draw from the residual: the result is distributed as p.

    Computed exactly (no sampling): P(x) = q(x)·min(1, p(x)/q(x)) + P(reject)·residual(x).
    """
    p = np.array([0.1, 0.4, 0.3, 0.2, 0.0])
    q = np.array([0.3, 0.1, 0.0, 0.2, 0.4])
    accepted = q * np.minimum(1.0, np.divide(p, q, out=np.ones_like(p), where=q > 0))
    result = accepted + (1.0 - accepted.sum()) * residual(p, q)
    np.testing.assert_allclose(result, p, atol=1e-12)


def test_sample_follows_the_distribution() -> None:
    rng = np.random.default_rng(1)
    probs = np.array([0.5, 0.0, 0.3, 0.2])
    counts = np.bincount([sample(probs, rng) for _ in range(20000)], minlength=4)
    assert counts[1] == 0
    np.testing.assert_allclose(counts / counts.sum(), probs, atol=0.02)


def test_temperature_scales_logits() -> None:
    logits = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    expected = np.exp(logits / 0.5) / np.exp(logits / 0.5).sum()
    np.testing.assert_allclose(probabilities(logits, SamplingParams(temperature=0.5)), expected, rtol=1e-6)


def test_top_k_keeps_k_most_likely() -> None:
    logits = np.array([0.0, 3.0, 1.0, 2.0], dtype=np.float32)
    probs = probabilities(logits, SamplingParams(temperature=1.0, top_k=2))
    assert probs[0] == 0 and probs[2] == 0
    np.testing.assert_allclose(probs[[1, 3]], np.exp([3.0, 2.0]) / np.exp([3.0, 2.0]).sum(), rtol=1e-6)


def test_top_p_keeps_smallest_set_reaching_p() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    probs = probabilities(logits, SamplingParams(temperature=1.0, top_p=0.8))
    np.testing.assert_allclose(probs, [0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0], rtol=1e-6)


def test_min_p_drops_tokens_below_fraction_of_top() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    probs = probabilities(logits, SamplingParams(temperature=1.0, min_p=0.25))
    np.testing.assert_allclose(probs, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0], rtol=1e-6)


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": -1.0}, "temperature"),
    ({"top_k": -1}, "top-k"),
    ({"top_p": 0.0}, "top-p"),
    ({"min_p": 1.0}, "min-p"),
])
def test_invalid_settings_are_user_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        SamplingParams(**kwargs)
