"""The Gumbel rule: a seed's sampled text is the target alone's whatever drafts it (mode, K, several sequences a
pass), and every position is distributed as p."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from support.exactness import REPETITIVE, SIGNIFICANCE, chi_square_p_value, finish
from test_scheduler import run as run_scheduled

from spec_cli import GenerationRequest, Pair
from spec_cli.decoding.noise import GumbelNoise
from spec_cli.decoding.sampling import Law, SamplingParams, probabilities
from spec_cli.decoding.scheduler import Scheduler
from spec_cli.decoding.stats import Stats
from spec_cli.bench.ties import logits_after

SEEDS = range(200)
# The whole law: a filter's edge is a float tie too (a top-k cut between two near-equal logits of the tiny model
# falls one way in a lone row and the other in a row of a multi-sequence pass), which no rule can remove.
SAMPLED = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
BASE = GenerationRequest(sampling=SAMPLED, max_tokens=10)  # no rule named: a seeded request verifies by gumbel
# Every way of drafting the tiny pair allows, at several K: none may change a seed's text.
DRAFTED = [dict(draft_mode="model", draft_max=2), dict(draft_mode="model", draft_max=5),
           dict(draft_mode="ngram", draft_max=3), dict(draft_mode="hybrid", draft_max=4)]


def test_a_pick_follows_the_law_and_depends_on_the_seed_and_position_alone() -> None:
    """argmax log p + g over positions is distributed as p (χ² at α = SIGNIFICANCE over 4000 positions); the
    same (seed, position) picks the same token from a dense vector or from its support, another seed differs."""
    law = Law(np.array([0.5, 0.3, 0.15, 0.05]), np.array([3, 17, 40, 41]), 64)
    noise = GumbelNoise(7)
    picks = Counter(noise.pick(law, t) for t in range(4000))
    expected = {(int(x),): float(p) for x, p in zip(law.tokens, law.probs)}
    assert chi_square_p_value(Counter({(x,): n for x, n in picks.items()}), expected, 4000) > SIGNIFICANCE
    dense = np.asarray(law)
    assert all(noise.pick(dense, t) == noise.pick(law, t) for t in range(200))
    assert [GumbelNoise(7).pick(law, t) for t in range(200)] == [noise.pick(law, t) for t in range(200)]
    assert [GumbelNoise(8).pick(law, t) for t in range(200)] != [noise.pick(law, t) for t in range(200)]


def texts(pair: Pair, prompt: list[int], request: GenerationRequest) -> list[list[int]]:
    return [finish(pair.generate(prompt, replace(request, seed=seed))).token_ids for seed in SEEDS]


@pytest.fixture(scope="module")
def prompt(alone: Pair) -> list[int]:
    return alone.prompt_tokens(REPETITIVE, raw=True)


@pytest.fixture(scope="module")
def target_alone(alone: Pair, prompt: list[int]) -> list[list[int]]:
    """What 200 seeds give with no draft at all."""
    return texts(alone, prompt, replace(BASE, draft_mode="none"))


def test_every_draft_and_k_gives_the_seed_s_target_alone_text(other: Pair, prompt: list[int],
                                                              target_alone: list[list[int]]) -> None:
    """Each seed drafted one of the ways (model at K 2 and 5, n-gram, hybrid), the drafts partly kept."""
    totals = {i: Stats(draft_max=0) for i in range(len(DRAFTED))}
    drafted = []
    for seed in SEEDS:
        generation = finish(other.generate(prompt, replace(BASE, seed=seed, **DRAFTED[seed % len(DRAFTED)])))
        drafted.append(generation.token_ids)
        totals[seed % len(DRAFTED)].merge(generation.stats)
    assert drafted == target_alone
    assert all(0 <= t.accepted < t.drafted for t in totals.values())
    assert totals[0].accepted > 0 and totals[1].accepted > 0  # the draft model's picks share the target's noise


def test_several_sequences_a_pass_give_each_seed_its_target_alone_text(other: Pair, prompt: list[int],
                                                                       target_alone: list[list[int]]) -> None:
    """Four at a time on one context, each with another drafting, verified in one pass a step."""
    slots = other.slots(4)
    scheduler = Scheduler()
    together: dict[int, list[int]] = {}
    for first in range(0, len(SEEDS), len(slots)):
        generations = {seed: slot.generate(prompt, replace(BASE, seed=seed, **DRAFTED[seed % len(DRAFTED)]))
                       for seed, slot in zip(SEEDS[first:first + len(slots)], slots)}
        emitted = run_scheduled(scheduler, {0: list(generations.values())})
        together.update({seed: emitted[id(generation)] for seed, generation in generations.items()})
    assert [together[seed] for seed in SEEDS] == target_alone


def test_a_draft_that_is_the_target_is_always_kept(same: Pair, prompt: list[int]) -> None:
    """The draft draws with the noise of the positions its tokens land at: drafting for itself, it proposes
    exactly the target's picks, so every drafted token is kept."""
    totals = Stats(draft_max=0)
    for seed in range(20):
        totals.merge(finish(same.generate(prompt, replace(BASE, seed=seed, draft_mode="model", draft_max=4))).stats)
    assert totals.drafted > 0 and totals.accepted == totals.drafted


def test_the_target_alone_samples_its_law_by_the_noise(alone: Pair, prompt: list[int]) -> None:
    """The first token of each seed is the pick of p_1 at its position: the rule adds no randomness of its own."""
    p = probabilities(logits_after(alone.target, prompt), SAMPLED)
    firsts = [tokens[0] for tokens in texts(alone, prompt, replace(BASE, draft_mode="none", max_tokens=1))]
    assert firsts == [GumbelNoise(seed).pick(p, len(prompt)) for seed in SEEDS]

