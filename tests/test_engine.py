"""The draft-and-verify loop on tiny real models: greedy identity, sampling exactness, stopping."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from pathlib import Path
from statistics import NormalDist
from typing import Iterator

import numpy as np
import pytest
from support.exactness import (N_SAMPLES, REPETITIVE, REST, SAMPLED, SIGNIFICANCE, chi_square_p_value,
                       exact_pair_distribution, priced_to_draft, sampled_pairs)
from support.tiny_models import write_model

from spec_cli import Generation, GenerationRequest, Pair, SamplingParams, SpecError, load_pair
from spec_cli.decoding.drafter import Terms
from spec_cli.decoding.planner import Planner
from spec_cli.decoding.scheduler import PREFILL_CHUNK, Scheduler
from spec_cli.decoding.stats import Stats
from spec_cli.drafting.hybrid import HybridDrafter
from spec_cli.llama.context import Context

PROMPT = "the cat and the dog"


def finish(generation: Generation) -> Generation:
    for _ in generation:
        pass
    return generation


@pytest.fixture(scope="module")
def reference(alone: Pair) -> Generation:
    return finish(alone.generate(PROMPT, raw=True, max_tokens=48, draft_mode="none"))


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_greedy_with_perfect_draft_equals_target_alone(same: Pair, reference: Generation, k: int) -> None:
    generation = finish(same.generate(PROMPT, raw=True, max_tokens=48, draft_max=k, draft_mode="model"))
    assert generation.token_ids == reference.token_ids
    assert generation.text == reference.text
    assert generation.stats.acceptance_rate == 1.0
    assert generation.stats.drafted > 0


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_greedy_with_unrelated_draft_equals_target_alone(other: Pair, reference: Generation, k: int) -> None:
    generation = finish(other.generate(PROMPT, raw=True, max_tokens=48, draft_max=k, draft_mode="model"))
    assert generation.token_ids == reference.token_ids
    assert generation.stats.acceptance_rate < 0.5
    assert len(generation.stats.position_acceptance) == k  # positions never accepted count as 0%


@pytest.mark.parametrize("drafter", ["same", "other"])
@pytest.mark.parametrize("mode, k, p_min", [
    ("ngram", 4, 0.0), ("hybrid", 4, 0.0), ("model", "auto", 0.0), ("hybrid", "auto", 0.0), ("model", 4, 0.5),
])
def test_greedy_in_every_mode_equals_target_alone(request: pytest.FixtureRequest, reference: Generation,
                                                  drafter: str, mode: str, k: int | str, p_min: float) -> None:
    pair: Pair = request.getfixturevalue(drafter)
    priced_to_draft(pair)
    generation = finish(pair.generate(PROMPT, raw=True, max_tokens=48, draft_max=k, draft_mode=mode,
                                      draft_p_min=p_min))
    assert generation.token_ids == reference.token_ids
    assert generation.stats.drafted > 0


def test_the_target_alone_spends_its_rounds_in_llama_cpp(reference: Generation) -> None:
    """`llama_s` counts the verify passes the scheduler decodes for a generation: the target alone spends most of its
    verification time in llama.cpp, and what is left (`overhead_s`) is the loop's own work."""
    stats = reference.stats
    assert 0.5 * stats.verify_s <= stats.llama_s <= stats.decode_s
    assert stats.overhead_s <= stats.decode_s - 0.5 * stats.verify_s


def test_ngram_needs_no_draft_model(alone: Pair, reference: Generation) -> None:
    generation = finish(alone.generate(PROMPT, raw=True, max_tokens=48, draft_max=6, draft_mode="ngram"))
    assert generation.token_ids == reference.token_ids
    assert generation.stats.accepted > 0  # the tiny model repeats itself, so lookups pay off


def test_confidence_stop_drafts_fewer_tokens(other: Pair) -> None:
    eager = finish(other.generate(PROMPT, raw=True, max_tokens=48, draft_max=4, draft_mode="model"))
    cautious = finish(other.generate(PROMPT, raw=True, max_tokens=48, draft_max=4, draft_mode="model", draft_p_min=0.6))
    assert cautious.token_ids == eager.token_ids
    assert cautious.stats.drafted < eager.stats.drafted


def test_modes_needing_a_draft_model_say_so(alone: Pair) -> None:
    with pytest.raises(SpecError, match="draft mode 'model' needs a draft model"):
        alone.generate(PROMPT, raw=True, draft_mode="model")
    with pytest.raises(SpecError, match="unknown draft mode 'fast'"):
        alone.generate(PROMPT, raw=True, draft_mode="fast")
    with pytest.raises(SpecError, match="draft-max must be a number from 0 to 64 or 'auto', got 'many'"):
        alone.generate(PROMPT, raw=True, draft_max="many", draft_mode="model")


def test_auto_k_reports_its_current_k(same: Pair) -> None:
    generation = finish(same.generate(PROMPT, raw=True, max_tokens=60, draft_max="auto", draft_mode="model"))
    assert generation.stats.adaptive and generation.stats.draft_max == 16
    assert 1 <= generation.stats.current_k <= 16


def test_a_drafter_of_several_ways_under_a_fixed_k_is_told_what_the_answer_may_still_emit(
        same: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under `-k auto` the planner's offer brings the default drafting the tokens a generation may still emit, which its
    regimes' entry and leave weigh; under a fixed K no offer is asked for, so each round tells it the same terms
    (`Drafter.expect`): what the request leaves, what was emitted, no pass shared."""
    told: list[Terms] = []
    expect = HybridDrafter.expect

    def telling(drafter: HybridDrafter, terms: Terms) -> None:
        told.append(terms)
        expect(drafter, terms)

    monkeypatch.setattr(HybridDrafter, "expect", telling)
    generation = finish(same.generate(PROMPT, raw=True, max_tokens=24, draft_mode="hybrid", draft_max=3))
    assert len(told) >= generation.stats.rounds > 0
    assert [terms.emitted for terms in told] == sorted(terms.emitted for terms in told) and told[0].emitted == 0
    assert all(terms.left + terms.emitted == 24 and not terms.shared for terms in told)
    told.clear()
    finish(same.generate(PROMPT, raw=True, max_tokens=24, draft_mode="hybrid", draft_max="auto"))
    assert not told


@pytest.mark.parametrize("k", [0, 1])
def test_a_round_given_no_draft_feeds_a_drafter_of_one_way_none_of_its_backlog(other: Pair, k: int,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a scheduler a drafter that lacks more than a chunk of its sequence takes it in a chunk a round, as a price
    of drafting: where the planner gives every round K = 0 it takes in nothing (the draft model pinned under `-k auto`
    took in each new request's prompt while the planner drafted nothing); where it gives K = 1 the backlog is fed."""
    monkeypatch.setattr(Planner, "ks", lambda _planner, generating, _chunk, _shared: [k] * len(generating))
    prompt = other.prompt_tokens("the cat sat on the mat " * 30, raw=True)
    assert len(prompt) > PREFILL_CHUNK
    request = GenerationRequest(sampling=SamplingParams(), max_tokens=8, draft_max="auto", draft_mode="model")
    scheduler, generations = Scheduler(), [slot.generate(prompt, request) for slot in other.slots(2)]
    for generation in generations:
        scheduler.join(generation)
    while len(scheduler):
        scheduler.step()
    assert all(len(generation.token_ids) == 8 for generation in generations)
    caught_up = [generation.stats.caught_up for generation in generations]
    assert caught_up == [0, 0] if k == 0 else sum(caught_up) >= PREFILL_CHUNK


def test_reference_is_long_enough_to_mean_something(reference: Generation) -> None:
    assert reference.finish_reason == "length"
    assert len(reference.token_ids) == 48
    assert len(set(reference.token_ids)) > 3


def test_events_carry_provenance_and_text(other: Pair) -> None:
    generation = other.generate(PROMPT, raw=True, max_tokens=40, draft_max=4, draft_mode="model")
    events = list(generation)
    assert [e.token for e in events] == generation.token_ids
    assert "".join(e.text for e in events) == generation.text
    assert sum(e.from_draft for e in events) == generation.stats.accepted


def test_statistics_arithmetic(same: Pair) -> None:
    generation = finish(same.generate(PROMPT, raw=True, max_tokens=30, draft_max=4, draft_mode="model"))
    s = generation.stats
    assert generation.finish_reason == "length"
    # Every round emits its accepted drafts plus one target token.
    assert s.generated_tokens == len(generation.token_ids) == s.accepted + s.rounds == 30
    assert s.mean_accepted_length == pytest.approx(1 + s.accepted / s.rounds)
    assert s.acceptance_rate == pytest.approx(s.accepted / s.drafted)
    assert s.tokens_per_second == pytest.approx(s.generated_tokens / s.decode_s)
    assert s.position_acceptance[0] == 1.0
    assert s.drafted_at[0] == s.rounds


def test_draft_length_shrinks_to_fit_max_tokens(same: Pair) -> None:
    generation = finish(same.generate(PROMPT, raw=True, max_tokens=3, draft_max=8, draft_mode="model"))
    assert len(generation.token_ids) == 3
    assert generation.stats.rounds == 1 and generation.stats.drafted == 2


def test_context_full_is_a_finish_reason(target_path: Path) -> None:
    with load_pair(target_path, target_path, n_ctx=24) as pair, load_pair(target_path, None, n_ctx=24) as solo:
        prompt = pair.prompt_tokens(PROMPT, raw=True)
        generation = finish(pair.generate(prompt, max_tokens=100, draft_max=4, draft_mode="model"))
        plain = finish(solo.generate(prompt, max_tokens=100))
    assert generation.finish_reason == plain.finish_reason == "context"
    assert len(prompt) + len(generation.token_ids) == 24
    assert generation.token_ids == plain.token_ids


def test_end_of_generation_token_stops_and_is_not_emitted(tmp_path: Path, reference: Generation) -> None:
    stop_token = reference.token_ids[5]
    first = reference.token_ids.index(stop_token)
    stopping = write_model(tmp_path / "stopping.gguf", seed=1, eos=stop_token)
    with load_pair(stopping, stopping) as pair:
        generation = finish(pair.generate(PROMPT, raw=True, max_tokens=48, draft_max=4, draft_mode="model"))
    assert generation.finish_reason == "stop"
    assert generation.token_ids == reference.token_ids[:first]


def test_after_a_stop_the_draft_keeps_the_whole_sequence(tmp_path: Path, reference: Generation) -> None:
    """A chat's next turn starts from what the draft still holds: after an end-of-generation token nothing
    of the sequence is wrong for it, the last token included."""
    stopping = write_model(tmp_path / "stopping.gguf", seed=1, eos=reference.token_ids[5])
    with load_pair(stopping, stopping) as pair:
        generation = finish(pair.generate(PROMPT, raw=True, max_tokens=48, draft_max=8, draft_mode="model"))
        assert generation.finish_reason == "stop"
        assert pair.draft_context.tokens == [*generation.prompt, *generation.token_ids]


def test_stopping_early_marks_interrupted_and_keeps_caches_consistent(same: Pair, reference: Generation) -> None:
    generation = same.generate(PROMPT, raw=True, max_tokens=48, draft_max=4, draft_mode="model")
    events = iter(generation)
    for _ in range(7):
        next(events)
    events.close()
    assert generation.finish_reason == "interrupted"
    assert generation.token_ids == reference.token_ids[:len(generation.token_ids)]
    # The next generation reuses the caches; it must be unaffected by the abandoned one.
    again = finish(same.generate(PROMPT, raw=True, max_tokens=48, draft_max=4, draft_mode="model"))
    assert again.token_ids == reference.token_ids


def test_same_seed_same_text(other: Pair) -> None:
    """With the drafting mode and K pinned (the default chooses by measured costs, and block verification's
    text follows the drafts), one seed gives one text."""
    pinned = dict(raw=True, max_tokens=30, sampling=SamplingParams(temperature=1.0), draft_mode="model", draft_max=4)
    first = finish(other.generate(PROMPT, seed=7, **pinned))
    second = finish(other.generate(PROMPT, seed=7, **pinned))
    third = finish(other.generate(PROMPT, seed=8, **pinned))
    assert first.token_ids == second.token_ids
    assert first.token_ids != third.token_ids


def test_kv_trim_after_rejection_matches_fresh_evaluation(target_path: Path, alone: Pair) -> None:
    """Decode prefix + 3 drafts, reject the last two (trim), feed a correction: its logits must be those
    of a context that only ever saw prefix + first draft + correction."""
    model = alone.target
    prefix = model.tokenize(PROMPT)
    drafted, correction = [40, 41, 42], 43
    trimmed = Context(model, n_ctx=64, n_threads=1)
    fresh = Context(model, n_ctx=64, n_threads=1)
    try:
        trimmed.decode(prefix + drafted, len(drafted))
        trimmed.trim(len(prefix) + 1)
        after_trim = trimmed.decode([correction], 1)[0]
        expected = fresh.decode(prefix + drafted[:1] + [correction], 1)[0]
    finally:
        trimmed.close()
        fresh.close()
    np.testing.assert_allclose(after_trim, expected, rtol=1e-4, atol=1e-4)
    assert int(after_trim.argmax()) == int(expected.argmax())


# --- sampling exactness -------------------------------------------------------------------------------

PENALIZED = replace(SAMPLED, repeat_penalty=1.5, repeat_last_n=16, presence_penalty=0.3, frequency_penalty=0.2)


@pytest.mark.parametrize("drafter, k, mode, verify, p_min", [
    ("alone", 0, "none", "block", 0.0), ("same", 2, "model", "block", 0.0), ("alone", 2, "ngram", "block", 0.0),
    ("other", 2, "hybrid", "block", 0.0), ("alone", 2, "ngram", "token", 0.0), ("same", "auto", "model", "block", 0.0),
    ("other", 4, "model", "block", 0.3),  # the confidence stop ends blocks early, depending on the draft
    *[("other", k, "model", verify, 0.0) for k in (1, 2, 4) for verify in ("block", "token")],
])
def test_sampled_first_two_tokens_follow_the_target(request: pytest.FixtureRequest, alone: Pair, drafter: str,
                                                    k: int | str, mode: str, verify: str, p_min: float) -> None:
    pair: Pair = request.getfixturevalue(drafter)
    priced_to_draft(pair)
    prompt = alone.prompt_tokens(REPETITIVE, raw=True)
    observed, totals = sampled_pairs(pair, prompt, SAMPLED, k, mode, verify, p_min)
    assert (totals.drafted > 0) == (k != 0)
    if drafter == "other":
        assert totals.acceptance_rate < 0.8  # a draft far from the target: the rules are really at work
    assert chi_square_p_value(observed, exact_pair_distribution(alone, prompt), N_SAMPLES) > SIGNIFICANCE


LARGE_VOCAB = 32_000  # Llama 2's: above it every shortcut of the sampler is taken (candidates, CDF blocks)
LARGE_SAMPLES = 2000  # generations per test: a step over this vocabulary costs several times a tiny one's


@pytest.fixture(scope="module")
def large(models_dir: Path) -> Iterator[Pair]:
    """A target over a large vocabulary and a draft that agrees with it about half the time; logits wide
    enough that a few dozen tokens hold most of the unfiltered law."""
    shape = dict(vocab_size=LARGE_VOCAB, n_embd=16, output_scale=1.5)
    target = write_model(models_dir / "large-target.gguf", seed=1, **shape)
    draft = write_model(models_dir / "large-draft.gguf", seed=1, noise=0.1, **shape)
    with load_pair(target, draft) as pair:
        yield pair


@pytest.mark.parametrize("sampling, verify", [
    (SamplingParams(temperature=0.8), "block"),  # llama.cpp's (and `spec chat`'s) defaults
    (SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0), "token"),  # the whole vocabulary
])
def test_sampled_first_two_tokens_follow_the_target_at_a_large_vocabulary(large: Pair, sampling: SamplingParams,
                                                                         verify: str) -> None:
    """p and q held on the filters' candidates, and a law over every token, give the target's law: χ² at
    α = SIGNIFICANCE over the pairs expected at least 5 times, the rest pooled."""
    prompt = large.prompt_tokens(REPETITIVE, raw=True)
    expected = exact_pair_distribution(large, prompt, sampling, least=5 / LARGE_SAMPLES)
    assert expected[REST] < 0.4  # most of the law is in cells of its own
    observed, totals = sampled_pairs(large, prompt, sampling, 3, "model", verify, n=LARGE_SAMPLES)
    assert 0.2 < totals.acceptance_rate < 0.8
    assert chi_square_p_value(observed, expected, LARGE_SAMPLES) > SIGNIFICANCE


def accepted_mean_and_variance(stats: Stats) -> tuple[float, float]:
    """Mean and variance of the tokens accepted per round, from how many rounds kept each position:
    P(n ≥ j) = accepted_at[j − 1] / rounds, E[n²] = Σ_j (2j − 1) P(n ≥ j)."""
    mean = stats.accepted / stats.rounds
    second = sum((2 * j + 1) * count for j, count in enumerate(stats.accepted_at)) / stats.rounds
    return mean, second - mean ** 2


def test_block_verification_keeps_more_tokens_per_round(target_path: Path, tmp_path: Path) -> None:
    """The paper's theorem on the real loop: with a draft whose tokens are accepted a third of the time or so,
    block verification keeps more tokens per round than token-wise verification (one-sided z-test, α =
    SIGNIFICANCE). At K = 8 the gain is about 17% (some 4.4 standard errors with these seeds): K = 4 gained 8%,
    3.9 standard errors from twice the seeds."""
    noisy = write_model(tmp_path / "noisy.gguf", seed=1, noise=0.1)
    totals = {}
    with load_pair(target_path, noisy) as pair:
        for verify in ("token", "block"):
            totals[verify] = Stats(draft_max=0)
            for seed in range(150):
                generation = finish(pair.generate(PROMPT, raw=True, sampling=SamplingParams(temperature=1.0),
                                                  seed=seed, max_tokens=40, draft_max=8, verify=verify,
                                                  draft_mode="model"))
                totals[verify].merge(generation.stats)
    token, block = totals["token"], totals["block"]
    (token_mean, token_var), (block_mean, block_var) = accepted_mean_and_variance(token), \
        accepted_mean_and_variance(block)
    assert 0.2 < token.acceptance_rate < 0.7
    z = (block_mean - token_mean) / math.sqrt(token_var / token.rounds + block_var / block.rounds)
    assert z > NormalDist().inv_cdf(1 - SIGNIFICANCE), z


@pytest.mark.parametrize("drafter, verify", [("same", "block"), ("same", "token"), ("other", "block")])
def test_sampled_with_penalties_follows_the_penalized_target(request: pytest.FixtureRequest, alone: Pair,
                                                            reference: Generation, drafter: str,
                                                            verify: str) -> None:
    """Each position's penalties count the drafted tokens before it, for p and q alike (with the target as
    its own draft, the second token is mostly verified at position 2, after a drafted first). The prompt
    ends with the model's own greedy text, so the tokens it favours are the ones penalised."""
    pair: Pair = request.getfixturevalue(drafter)
    prompt = [*alone.prompt_tokens(PROMPT, raw=True), *reference.token_ids[:12]]
    expected = exact_pair_distribution(alone, prompt, PENALIZED)
    plain = exact_pair_distribution(alone, prompt)
    change = sum(abs(expected.get(key, 0.0) - plain.get(key, 0.0)) for key in {*expected, *plain})
    assert change > 0.1  # the penalties change the law enough for the check to tell them apart
    observed, totals = sampled_pairs(pair, prompt, PENALIZED, 3, "model", verify, whole=True)
    assert totals.accepted > 0
    assert chi_square_p_value(observed, expected, N_SAMPLES) > SIGNIFICANCE


FILTERED = replace(PENALIZED, top_k=8, top_p=0.9, min_p=0.05)  # every filter and every penalty at once


def test_gumbel_picks_follow_the_target_through_every_filter_and_penalty(alone: Pair, other: Pair,
                                                                         reference: Generation) -> None:
    """The Gumbel rule, drafted by unrelated weights, samples the target's law with top-k, top-p, min-p and the
    penalties all on: χ² at α = SIGNIFICANCE against the law computed from the target's logits, whose support
    the filters cut (top-p and min-p remove pairs that top-k alone keeps)."""
    prompt = [*alone.prompt_tokens(PROMPT, raw=True), *reference.token_ids[:12]]
    expected = exact_pair_distribution(alone, prompt, FILTERED)
    assert set(expected) < set(exact_pair_distribution(alone, prompt, replace(PENALIZED, top_k=8)))
    observed, totals = sampled_pairs(other, prompt, FILTERED, 3, "model", "gumbel", whole=True)
    assert 0 < totals.accepted < totals.drafted
    assert chi_square_p_value(observed, expected, N_SAMPLES) > SIGNIFICANCE


@pytest.mark.parametrize("drafter, mode", [("same", "model"), ("other", "model"), ("alone", "ngram")])
def test_greedy_with_penalties_equals_target_alone_with_them(request: pytest.FixtureRequest, alone: Pair,
                                                             reference: Generation, drafter: str,
                                                             mode: str) -> None:
    penalized = SamplingParams(repeat_penalty=1.3, repeat_last_n=16, frequency_penalty=0.1)
    plain = finish(alone.generate(PROMPT, raw=True, max_tokens=48, sampling=penalized, draft_mode="none"))
    assert plain.token_ids != reference.token_ids  # the penalties change the greedy text
    pair: Pair = request.getfixturevalue(drafter)
    priced_to_draft(pair)
    generation = finish(pair.generate(PROMPT, raw=True, max_tokens=48, sampling=penalized, draft_max=4,
                                      draft_mode=mode))
    assert generation.token_ids == plain.token_ids
    assert generation.stats.drafted > 0
    if drafter == "same":  # the draft penalises its own drafted tokens as the target does: all accepted
        assert generation.stats.acceptance_rate == 1.0


def test_unknown_verification_is_a_user_error(alone: Pair) -> None:
    with pytest.raises(SpecError, match="unknown verification 'joint'; choose one of: block, token, gumbel"):
        alone.generate(PROMPT, raw=True, verify="joint")


def test_chi_square_detects_a_wrong_distribution(alone: Pair) -> None:
    """The test above can fail: samples from a different temperature are rejected."""
    prompt = alone.prompt_tokens(REPETITIVE, raw=True)
    expected = exact_pair_distribution(alone, prompt)
    wrong = SamplingParams(temperature=1.6, top_k=4)
    observed: Counter = Counter()
    for seed in range(N_SAMPLES):
        generation = finish(alone.generate(prompt, sampling=wrong, seed=seed, max_tokens=2))
        observed[tuple(generation.token_ids[:2])] += 1
    assert chi_square_p_value(observed, expected, N_SAMPLES) < SIGNIFICANCE
