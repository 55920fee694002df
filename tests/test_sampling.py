"""The logit transforms in llama.cpp's order and with its definitions, the residual, and recommended settings."""

from __future__ import annotations

import numpy as np
import pytest

from spec_cli.decoding.sampling import (MIN_TEMPERATURE, PENALTY_LIMIT, SAMPLE_SIZE, Law, SamplingParams,
                                        excess_mass, greedy_token, penalized, probabilities, recommended, residual,
                                        row_laws, resolve_sampling, sample, shares_candidates)
from spec_cli.errors import SpecError

PLAIN = dict(top_k=0, top_p=1.0, min_p=0.0)  # no filters: only the temperature


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def test_residual_is_normalised_positive_part_of_p_minus_q() -> None:
    p = np.array([0.5, 0.3, 0.2, 0.0])
    q = np.array([0.2, 0.5, 0.2, 0.1])
    np.testing.assert_allclose(residual(p, q), [1.0, 0.0, 0.0, 0.0])


def test_residual_keeps_p_where_the_draft_gives_zero() -> None:
    # q = 0 where p > 0: the draft can never propose token 2, so the residual must supply all its mass.
    p = np.array([0.25, 0.25, 0.5])
    q = np.array([0.5, 0.5, 0.0])
    np.testing.assert_allclose(residual(p, q), [0.0, 0.0, 1.0])


def test_residual_weighs_p_by_what_the_path_still_owes() -> None:
    """Block verification's norm(max(0, w·p − q)): with w = 0.5, only token 0 keeps positive mass."""
    p = np.array([0.6, 0.3, 0.1])
    q = np.array([0.1, 0.5, 0.4])
    np.testing.assert_allclose(residual(p, q, 0.5), [1.0, 0.0, 0.0])
    np.testing.assert_allclose(residual(p, q), [1.0, 0.0, 0.0])
    np.testing.assert_allclose(residual(p, np.array([0.2, 0.1, 0.7]), 0.5), [0.1 / 0.15, 0.05 / 0.15, 0.0])


def test_residual_falls_back_to_p_when_p_equals_q() -> None:
    p = np.array([0.1, 0.9])
    np.testing.assert_allclose(residual(p, p.copy()), p)


def test_sample_follows_the_distribution() -> None:
    rng = np.random.default_rng(1)
    probs = np.array([0.5, 0.0, 0.3, 0.2])
    counts = np.bincount([sample(probs, rng) for _ in range(20000)], minlength=4)
    assert counts[1] == 0
    np.testing.assert_allclose(counts / counts.sum(), probs, atol=0.02)


class FixedDraw:
    """A generator whose every uniform is `u`: which token a given draw gives."""

    def __init__(self, u: float) -> None:
        self.u = u

    def random(self) -> float:
        return self.u


def test_a_long_vector_is_sampled_by_its_cdf_and_never_at_a_zero_weight() -> None:
    """The two-step search (block sums, then the block) finds the token one cumulative sum would, for draws
    all along [0, 1); whole blocks and scattered tokens without mass are never drawn, at either end either."""
    rng = np.random.default_rng(2)
    weights = rng.random(5000) * (rng.random(5000) < 0.3)
    weights[1024:2100] = 0.0
    weights[-7:] = 0.0
    cumulative = np.cumsum(weights)
    for u in [*np.linspace(0.0, 1.0, 4001)[:-1], 1.0 - 2.0 ** -53]:
        token = sample(weights, FixedDraw(u))
        assert weights[token] > 0, u
        expected = int(np.searchsorted(cumulative, u * cumulative[-1], side="right"))
        assert token == min(expected, int(np.flatnonzero(weights)[-1])), u
    assert sample(weights, FixedDraw(0.0)) == int(np.flatnonzero(weights)[0])


def test_a_law_on_its_support_reads_and_samples_like_its_dense_vector() -> None:
    dense = np.zeros(1000)
    dense[[3, 500, 999]] = [0.2, 0.5, 0.3]
    law = Law(dense[[3, 500, 999]], np.array([3, 500, 999]), 1000)
    np.testing.assert_array_equal(np.asarray(law), dense)
    assert law[500] == 0.5 and law[4] == 0.0 and law[0] == 0.0 and law.max() == 0.5
    np.testing.assert_array_equal(law[[999, 998, 3]], [0.3, 0.0, 0.2])
    for u in np.linspace(0.0, 1.0, 101)[:-1]:
        assert sample(law, FixedDraw(u)) == sample(dense, FixedDraw(u))


def test_residual_on_supports_equals_the_dense_residual() -> None:
    """p and q held on supports that overlap only in part: norm(max(0, w·p − q)) and block verification's r
    are those of the dense vectors."""
    p = Law(np.array([0.5, 0.3, 0.2]), np.array([1, 4, 7]), 10)
    q = Law(np.array([0.1, 0.6, 0.3]), np.array([0, 4, 7]), 10)
    for w in (1.0, 0.6):
        excess = np.maximum(w * np.asarray(p) - np.asarray(q), 0.0)
        np.testing.assert_allclose(np.asarray(residual(p, q, w)), excess / excess.sum(), rtol=1e-12)
        assert excess_mass(p, q, w) == pytest.approx(excess.sum(), rel=1e-12)
        assert excess_mass(p, np.asarray(q), w) == pytest.approx(excess.sum(), rel=1e-12)


def test_defaults_are_llama_cpps() -> None:
    params = SamplingParams()
    assert (params.temperature, params.top_k, params.top_p, params.min_p) == (0.0, 40, 0.95, 0.05)
    assert (params.repeat_penalty, params.repeat_last_n, params.presence_penalty, params.frequency_penalty) == \
        (1.0, 64, 0.0, 0.0)
    assert params.greedy and not params.penalizes


def test_temperature_scales_logits() -> None:
    logits = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    np.testing.assert_allclose(probabilities(logits, SamplingParams(temperature=0.5, **PLAIN)),
                               softmax(logits / 0.5), rtol=1e-6)


def test_temperature_zero_is_all_mass_on_the_greedy_token() -> None:
    np.testing.assert_array_equal(probabilities(np.array([0.0, 3.0, 1.0]), SamplingParams()), [0.0, 1.0, 0.0])


def test_top_k_keeps_exactly_k_most_likely() -> None:
    logits = np.array([0.0, 3.0, 1.0, 2.0], dtype=np.float32)
    probs = probabilities(logits, SamplingParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0))
    assert probs[0] == 0 and probs[2] == 0
    np.testing.assert_allclose(probs[[1, 3]], softmax(np.array([3.0, 2.0])), rtol=1e-6)


def test_top_p_keeps_smallest_set_reaching_p() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    probs = probabilities(logits, SamplingParams(temperature=1.0, top_k=0, top_p=0.8, min_p=0.0))
    np.testing.assert_allclose(probs, [0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0], rtol=1e-6)


def test_min_p_drops_tokens_below_fraction_of_top() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    probs = probabilities(logits, SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.25))
    np.testing.assert_allclose(probs, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0], rtol=1e-6)


def test_filters_look_at_temperature_one_and_temperature_comes_last() -> None:
    """llama.cpp's order: at T = 1, top-p 0.75 keeps {0.5, 0.3} and min-p 0.25 keeps {0.5, 0.3, 0.15}; the
    temperature then reshapes what they kept. Temperature first (at T = 0.5: 0.70, 0.25, 0.06, 0.01) would
    let top-p 0.75 keep the same two and min-p 0.25 keep only two."""
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    top_p = probabilities(logits, SamplingParams(temperature=0.5, top_k=0, top_p=0.75, min_p=0.0))
    np.testing.assert_allclose(top_p, [*softmax(logits[:2] / 0.5), 0.0, 0.0], rtol=1e-9)
    min_p = probabilities(logits, SamplingParams(temperature=0.5, top_k=0, top_p=1.0, min_p=0.25))
    np.testing.assert_allclose(min_p, [*softmax(logits[:3] / 0.5), 0.0], rtol=1e-9)


def test_repeat_penalty_divides_positive_and_multiplies_negative_logits() -> None:
    logits = np.array([2.0, -1.0, 1.0, 0.5])
    params = SamplingParams(repeat_penalty=2.0)
    np.testing.assert_allclose(penalized(logits, params, [0, 1, 0]), [1.0, -2.0, 1.0, 0.5])


def test_frequency_counts_occurrences_and_presence_counts_once() -> None:
    logits = np.zeros(4)
    params = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)
    np.testing.assert_allclose(penalized(logits, params, [2, 2, 2, 1]), [0.0, -0.75, -1.75, 0.0])


def test_penalties_look_only_at_the_last_n_tokens() -> None:
    params = SamplingParams(repeat_penalty=2.0, repeat_last_n=2)
    np.testing.assert_allclose(penalized(np.ones(3), params, [0, 1, 2]), [1.0, 0.5, 0.5])
    assert params.recent([5, 6, 7, 8]) == [7, 8]
    off = SamplingParams(repeat_penalty=2.0, repeat_last_n=0)
    assert not off.penalizes and off.recent([1, 2]) == []
    np.testing.assert_allclose(penalized(np.ones(3), off, [0, 1]), np.ones(3))


def test_penalties_come_first_and_change_the_greedy_choice() -> None:
    logits = np.array([3.0, 2.5, 0.0])
    params = SamplingParams(repeat_penalty=1.5)
    assert greedy_token(logits, SamplingParams(), [0]) == 0
    assert greedy_token(logits, params, [0]) == 1
    # Top-k 1 after the penalty keeps token 1, not token 0.
    sampled = SamplingParams(temperature=1.0, top_k=1, repeat_penalty=1.5)
    np.testing.assert_array_equal(probabilities(logits, sampled, [0]), [0.0, 1.0, 0.0])


def test_recommended_settings_come_from_the_gguf_keys() -> None:
    metadata = {"general.sampling.temp": "0.6", "general.sampling.top_k": "20", "general.sampling.top_p": "0.9",
                "general.sampling.min_p": "0.000000", "general.sampling.penalty_repeat": "1.1",
                "general.sampling.penalty_last_n": "-1"}
    assert recommended(metadata.get) == {"temperature": 0.6, "top_k": 20, "top_p": 0.9, "min_p": 0.0,
                                         "repeat_penalty": 1.1, "repeat_last_n": 0}


def test_recommended_settings_skip_values_that_do_not_parse_or_are_out_of_range() -> None:
    metadata = {"general.sampling.temp": "warm", "general.sampling.top_p": "1.5", "general.sampling.top_k": "64"}
    assert recommended(metadata.get) == {"top_k": 64}
    assert recommended({}.get) == {}


def test_describe_names_what_changes_the_distribution() -> None:
    assert SamplingParams().describe() == "greedy"
    assert SamplingParams(temperature=0.7).describe() == "temp 0.7 · top-k 40 · top-p 0.95 · min-p 0.05"
    assert "repeat-penalty 1.1 over 64" in SamplingParams(repeat_penalty=1.1).describe()


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": -1.0}, "temperature"),
    ({"top_k": -1}, "top-k"),
    ({"top_p": 0.0}, "top-p"),
    ({"min_p": 1.0}, "min-p"),
    ({"repeat_penalty": 0.0}, "repeat-penalty"),
    ({"repeat_last_n": -1}, "repeat-last-n"),
    ({"temperature": float("nan")}, "temperature must be a finite number, got nan"),
    ({"temperature": float("inf")}, "temperature must be a finite number, got inf"),
    ({"top_p": float("nan")}, "top-p must be a finite number"),
    ({"presence_penalty": float("-inf")}, "presence-penalty must be a finite number"),
])
def test_invalid_settings_are_user_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        SamplingParams(**kwargs)


EXTREMES = [
    {"presence_penalty": -1e308}, {"frequency_penalty": -1e308}, {"repeat_penalty": 1e-300},
    {"repeat_penalty": 1e300, "frequency_penalty": 1e300, "presence_penalty": 1e300},
    {"repeat_penalty": 1e-300, "frequency_penalty": 1e300},
]


@pytest.mark.parametrize("extreme", EXTREMES)
@pytest.mark.parametrize("filters", [{}, PLAIN, {"top_k": 0}], ids=["top-k", "none", "top-p-min-p"])
@pytest.mark.parametrize("temperature", [1.0, 1e-30, 1e30])
def test_any_finite_penalty_gives_a_finite_law_that_sums_to_one(extreme: dict, filters: dict,
                                                                  temperature: float) -> None:
    """Penalties are clamped to ±10³⁰ (a factor in [10⁻³⁰, 10³⁰]): a penalized logit stays finite in float32, so
    no row turns into inf − inf = NaN, whatever the temperature."""
    z = np.random.default_rng(0).normal(0, 4, 5000).astype(np.float32)
    recent = [int(z.argmax()), int(z.argmin()), 7, 7, 7]
    law = np.asarray(probabilities(z, SamplingParams(temperature=temperature, **filters, **extreme), recent),
                     dtype=np.float64)
    assert np.isfinite(law).all() and law.min() >= 0 and law.sum() == pytest.approx(1.0)


def test_penalties_past_the_limit_are_clamped_to_it() -> None:
    clamped = SamplingParams(presence_penalty=-1e308, frequency_penalty=1e308, repeat_penalty=1e-300)
    assert (clamped.presence_penalty, clamped.frequency_penalty, clamped.repeat_penalty) == \
        (-PENALTY_LIMIT, PENALTY_LIMIT, 1 / PENALTY_LIMIT)
    assert SamplingParams(presence_penalty=1.5).presence_penalty == 1.5


def test_a_temperature_below_float32s_range_is_greedy_the_laws_limit() -> None:
    """softmax(z / T) tends to all mass on the largest logit as T → 0: below MIN_TEMPERATURE, where 1/T has no
    float32, that limit is the law; just above it, the computed law is that limit already."""
    z = np.random.default_rng(1).normal(0, 4, 5000).astype(np.float32)
    assert SamplingParams(temperature=1e-300).greedy and SamplingParams(temperature=MIN_TEMPERATURE / 2).greedy
    assert not SamplingParams(temperature=MIN_TEMPERATURE).greedy
    for temperature in (1e-300, MIN_TEMPERATURE, 1e-30):
        law = np.asarray(probabilities(z, SamplingParams(temperature=temperature, **PLAIN)), dtype=np.float64)
        assert law[z.argmax()] == pytest.approx(1.0) and law.sum() == pytest.approx(1.0)


def test_resolve_sampling_layers_defaults_preset_and_flags() -> None:
    model = {"temperature": 0.6, "top_k": 20}
    assert resolve_sampling("greedy", model, {}) == SamplingParams()
    assert resolve_sampling("greedy", model, {"temperature": 0.7}) == SamplingParams(temperature=0.7)
    assert resolve_sampling("model", model, {}) == SamplingParams(temperature=0.6, top_k=20)
    assert resolve_sampling("model", {}, {}) == SamplingParams(temperature=0.8)
    assert resolve_sampling("model", model, {"top_k": 5, "repeat_penalty": 1.1}) == \
        SamplingParams(temperature=0.6, top_k=5, repeat_penalty=1.1)
    with pytest.raises(SpecError, match="unknown sampling 'warm'; choose one of: greedy, model"):
        resolve_sampling("warm", model, {})


# --- the candidate shortcut against the whole row ------------------------------------------------------------

def full_law(logits: np.ndarray, params: SamplingParams, recent: list[int]) -> np.ndarray:
    """The law by its definition, with no shortcut: every token sorted by its penalized logit, the filters on the
    softmax at T = 1 of what the previous one kept, then the softmax at T of the rest, in float64."""
    z = penalized(logits, params, recent).astype(np.float64)
    order = np.argsort(-z, kind="stable")
    if 0 < params.top_k < z.size:
        order = order[:params.top_k]
    keep = order.size
    if params.top_p < 1.0:
        keep = int(np.argmax(np.cumsum(softmax(z[order])) >= params.top_p)) + 1
    at_one = softmax(z[order[:keep]])
    if params.min_p > 0.0:
        keep = int(np.count_nonzero(at_one >= params.min_p * at_one[0]))
    law = np.zeros(z.size)
    law[order[:keep]] = softmax(z[order[:keep]] / params.temperature)
    return law


def logit_row(kind: str, n: int) -> np.ndarray:
    rng = np.random.default_rng([n, len(kind)])
    if kind == "spread":
        return (rng.standard_normal(n) * 3).astype(np.float32)
    if kind == "nearly flat":  # and below 0: the dense softmax shifts by the maximum
        return (rng.standard_normal(n) * 1e-3 - 1).astype(np.float32)
    if kind == "far above 0":  # past EXP_SAFE: the dense softmax shifts by the maximum
        return (rng.standard_normal(n) * 3 + 80).astype(np.float32)
    if kind == "one token towers over a long tail":  # top-p needs far more than the tokens near the top
        row = rng.standard_normal(n).astype(np.float32)
        row[n // 3] = 3 + np.log(n)
        return row
    # "only sampled tokens are high": the floor from the strided sample finds fewer than k, and tries lower
    row = (rng.standard_normal(n) - 10).astype(np.float32)
    row[::max(n // SAMPLE_SIZE, 1)] = np.linspace(5, 6, row[::max(n // SAMPLE_SIZE, 1)].size)
    return row


SHORTCUT_CASES = {
    "chat defaults": SamplingParams(temperature=0.8),
    "top-k alone": SamplingParams(temperature=1.0, top_k=40, top_p=1.0, min_p=0.0),
    "top-k 1": SamplingParams(temperature=1.0, top_k=1, top_p=1.0, min_p=0.0),
    "wide top-k and top-p": SamplingParams(temperature=0.8, top_k=500, top_p=0.99, min_p=0.0),
    "no filter": SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
    "no filter, hot": SamplingParams(temperature=1.7, top_k=0, top_p=1.0, min_p=0.0),
    "top-p alone": SamplingParams(temperature=0.7, top_k=0, top_p=0.95, min_p=0.0),
    "min-p alone": SamplingParams(temperature=1.3, top_k=0, top_p=1.0, min_p=0.05),
    "top-p and min-p": SamplingParams(temperature=1.0, top_k=0, top_p=0.5, min_p=0.02),
    "penalties that raise and lower": SamplingParams(temperature=0.8, repeat_penalty=0.5, presence_penalty=-0.5,
                                                     frequency_penalty=0.2),
    "penalties, no filter": SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.3,
                                           frequency_penalty=0.1),
}


@pytest.mark.parametrize("n", [50, 4000, 151_936])
@pytest.mark.parametrize("kind", ["spread", "nearly flat", "far above 0", "one token towers over a long tail",
                                  "only sampled tokens are high"])
@pytest.mark.parametrize("case", SHORTCUT_CASES)
def test_the_candidate_shortcut_gives_the_law_of_the_whole_row(case: str, kind: str, n: int) -> None:
    """`probabilities` works on a few candidates; the law must be the one the whole row defines, to float
    tolerance, on exactly the same support. The recent tokens hold the row's top tokens and some of its
    lowest, so penalties move tokens into and out of the candidates."""
    params, logits = SHORTCUT_CASES[case], logit_row(kind, n)
    ranked = np.argsort(logits)
    recent = [*ranked[-3:], *ranked[:2], *np.random.default_rng(n).integers(0, n, 20), int(ranked[-1])]
    law = np.asarray(probabilities(logits, params, recent))
    expected = full_law(logits, params, recent)
    np.testing.assert_array_equal(np.flatnonzero(law), np.flatnonzero(expected))
    np.testing.assert_allclose(law, expected, rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.8), SamplingParams(temperature=1.0, top_k=3000,
                                                                                    top_p=1.0, min_p=0.0)])
def test_a_verify_pass_finds_its_rows_candidates_together_with_the_laws_row_by_row(params: SamplingParams) -> None:
    """`row_laws` shares the floors and the pass over the rows; each law must be `probabilities`' own, bit for
    bit, a row whose floor keeps too few tokens (the last kind) included."""
    kinds = ["spread", "nearly flat", "far above 0", "one token towers over a long tail", "only sampled tokens are high"]
    rows = np.stack([logit_row(kind, 151_936) for kind in kinds])
    assert shares_candidates(params, rows.shape[1])
    for law, row in zip(row_laws(rows, params), rows, strict=True):
        alone = probabilities(row, params)
        np.testing.assert_array_equal(law.tokens, alone.tokens)
        np.testing.assert_array_equal(law.probs, alone.probs)


def test_rows_with_penalties_or_without_top_k_are_not_batched() -> None:
    assert not shares_candidates(SamplingParams(temperature=0.8, repeat_penalty=1.1), 151_936)
    assert not shares_candidates(SamplingParams(temperature=0.8, top_k=0), 151_936)
    assert not shares_candidates(SamplingParams(temperature=0.8), SAMPLE_SIZE)
    assert not shares_candidates(SamplingParams(temperature=0.8, top_k=100_000), 151_936)  # floor past the sample
    assert not shares_candidates(SamplingParams(), 151_936)
