"""Several generations at once on sequences of one target context: each sequence's output is what it would be
alone, greedy token for token and sampled in law, whatever joins and leaves the batch and whatever its memory."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
from support.exactness import (N_SAMPLES, REPETITIVE, SAMPLED, SIGNIFICANCE, chi_square_p_value,
                               exact_pair_distribution, finish, greedy_agreement)
from support.tiny_models import write_model

from spec_cli import GenerationRequest, Pair, load_pair
from spec_cli.decoding import scheduler as scheduling
from spec_cli.decoding.engine import Generation
from spec_cli.decoding.sampling import SamplingParams
from spec_cli.decoding.scheduler import Scheduler, _batches
from spec_cli.llama.context import Context, Part, decode_together
from spec_cli.llama.grammar import Grammar, GrammarError

GREEDY = SamplingParams()
PROMPTS = [REPETITIVE, "hello there", "a b c a b c a", "zz top"]
# Fixed K, K by the batch's goodput, n-gram lookup, the target alone, and the hybrid: all in one batch.
REQUESTS = [GenerationRequest(sampling=GREEDY, draft_max=3, draft_mode="model", max_tokens=24),
            GenerationRequest(sampling=GREEDY, draft_max="auto", draft_mode="model", max_tokens=24),
            GenerationRequest(sampling=GREEDY, draft_max=2, draft_mode="ngram", max_tokens=24),
            GenerationRequest(sampling=GREEDY, draft_max=0, draft_mode="none", max_tokens=24),
            GenerationRequest(sampling=GREEDY, draft_max=4, draft_mode="hybrid", max_tokens=24)]


@pytest.fixture(scope="module")
def slots(other: Pair) -> list:
    return other.slots(4)


def run(scheduler: Scheduler, joining: dict[int, list[Generation]], leaving: dict[int, Generation] | None = None
        ) -> dict[int, list[int]]:
    """Step until no generation runs; `joining[s]` join before step s, `leaving[s]` leaves before it. Returns
    each generation's emitted tokens, by id."""
    emitted: dict[int, list[int]] = {}
    step = 0
    while len(scheduler) or any(s >= step for s in joining):
        for generation in joining.get(step, []):
            scheduler.join(generation)
        if leaving and step in leaving:
            scheduler.leave(leaving[step])
        for generation, events in scheduler.step():
            emitted.setdefault(id(generation), []).extend(event.token for event in events)
        step += 1
    return emitted


def alone(pair: Pair, prompt: str, request: GenerationRequest) -> list[int]:
    return finish(pair.generate(pair.prompt_tokens(prompt, raw=True), request)).token_ids


def same_rows(together: np.ndarray, alone: np.ndarray) -> None:
    np.testing.assert_allclose(together, alone, rtol=1e-4, atol=1e-4)
    assert list(together.argmax(axis=1)) == list(alone.argmax(axis=1))


def test_decoded_together_every_row_is_the_row_decoded_alone(other: Pair) -> None:
    """A row's logits are those of the same tokens decoded alone, to float32 rounding (the kernels sum in another
    order at another batch size, as a verify pass of K + 1 rows already does against one-token steps)."""
    first = Context(other.target, n_ctx=64, n_threads=1, sequences=3)
    contexts = [first, first.sequence(1), first.sequence(2)]
    lone = Context(other.target, n_ctx=64, n_threads=1)
    try:
        feeds = [[5, 6, 7, 8], [9], [10, 11]]
        rows = decode_together([Part(c, feed, len(feed), len(feed)) for c, feed in zip(contexts, feeds)])
        for feed, together in zip(feeds, rows):
            lone.trim(0)
            same_rows(together, lone.decode(feed, len(feed)))
        assert [c.tokens for c in contexts] == feeds
        contexts[1].trim(0)  # one sequence's cut leaves the others
        rows = decode_together([Part(contexts[0], [12], 1, 1), Part(contexts[2], [13], 1, 1)])
        lone.trim(0)
        same_rows(rows[1], lone.decode([10, 11, 13], 1))
    finally:
        for context in (*contexts, lone):
            context.close()


def test_each_sequence_gets_its_lone_greedy_text_while_others_join_and_leave(other: Pair, slots: list) -> None:
    expected = [alone(other, p, r) for p, r in zip(PROMPTS, REQUESTS)]
    tokens = [other.prompt_tokens(p, raw=True) for p in PROMPTS]
    generations = [slot.generate(t, r) for slot, t, r in zip(slots, tokens, REQUESTS)]
    emitted = run(Scheduler(), {0: generations[:2], 3: generations[2:]})
    for generation, lone in zip(generations, expected):
        assert emitted[id(generation)] == generation.token_ids == lone
        assert generation.finish_reason == "length" and generation.stats.batch_size > 1
    assert generations[0].stats.drafted > generations[0].stats.accepted  # rejections, rolled back per sequence
    assert sum(g.stats.accepted for g in generations) > 0
    # The hybrid on the first slot again: its memory keeps the earlier sequence's prompt, and it still agrees.
    # A grammar and sampling share the pass too.
    hybrid = slots[0].generate(tokens[1], REQUESTS[4])
    quitter = slots[1].generate(tokens[2], REQUESTS[0])
    constrained = replace(REQUESTS[1], grammar=r'root ::= [a-e ]+ "."', draft_mode="ngram")
    sampled = replace(REQUESTS[0], sampling=SAMPLED, seed=7)
    others = [slots[2].generate(tokens[0], constrained), slots[3].generate(tokens[3], sampled)]
    emitted = run(Scheduler(), {0: [hybrid, quitter, *others]}, leaving={2: quitter})
    assert emitted[id(hybrid)] == alone(other, PROMPTS[1], REQUESTS[4])
    assert [emitted[id(g)] for g in others] == [alone(other, PROMPTS[0], constrained),
                                                alone(other, PROMPTS[3], sampled)]
    assert set(others[0].text) <= set("abcde .")
    assert quitter.finish_reason == "interrupted" and 0 < len(quitter.token_ids) < 24


def test_a_sequence_whose_own_work_fails_leaves_alone_and_the_others_go_on(other: Pair, slots: list,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Its grammar fails at its 6th mask (as one that meets a text no token spells would): it leaves with the
    error, after what it had emitted; the sequence beside it gets its lone text, untouched."""
    expected = alone(other, PROMPTS[1], REQUESTS[0])
    masks = Counter()
    real_mask = Grammar.mask

    def failing_mask(state: Grammar) -> np.ndarray:
        masks["asked"] += 1
        if masks["asked"] > 5:
            raise GrammarError("allows nothing here (a test's failure)")
        return real_mask(state)

    monkeypatch.setattr(Grammar, "mask", failing_mask)
    constrained = replace(REQUESTS[2], grammar=r'root ::= [a-e ]+ "."')
    failing = slots[0].generate(other.prompt_tokens(PROMPTS[0], raw=True), constrained)
    going_on = slots[1].generate(other.prompt_tokens(PROMPTS[1], raw=True), REQUESTS[0])
    emitted = run(Scheduler(), {0: [failing, going_on]})
    assert isinstance(failing.error, GrammarError) and failing.finish_reason == "error"
    assert 0 < len(emitted[id(failing)]) < 24
    assert emitted[id(going_on)] == going_on.token_ids == expected and going_on.error is None


def test_a_long_prompt_is_fed_in_chunks_between_the_others_rounds(other: Pair, slots: list) -> None:
    long_prompt = other.prompt_tokens("the cat sat on the mat " * 30, raw=True)
    running = slots[0].generate(other.prompt_tokens(PROMPTS[1], raw=True), REQUESTS[3])
    newcomer = slots[1].generate(long_prompt, REQUESTS[0])
    scheduler = Scheduler()
    scheduler.join(running)
    scheduler.step()
    scheduler.join(newcomer)
    steps = 0
    while not newcomer.token_ids:
        emitted = dict((id(g), events) for g, events in scheduler.step())
        assert len(emitted.get(id(running), [])) == 1  # the other goes on generating meanwhile
        steps += 1
    assert steps >= len(long_prompt) // 64
    while len(scheduler):
        scheduler.step()
    assert newcomer.token_ids == alone(other, "the cat sat on the mat " * 30, REQUESTS[0])


def steps_to_first_token(scheduler: Scheduler, generation: Generation, others: Generation) -> int:
    """Steps until `generation` emits, each taking in at most a chunk of `others`' drafter's catch-up."""
    steps = 0
    while not generation.token_ids:
        caught_up = others.stats.caught_up
        scheduler.step()
        assert others.stats.caught_up - caught_up <= scheduling.PREFILL_CHUNK
        steps += 1
    return steps


def test_a_short_request_starts_at_once_beside_a_long_prefill_and_a_long_catch_up(roomy: Pair) -> None:
    """Thousands of prompt tokens are fed a batch a step, the shortest prompt first, and a draft that lacks them
    takes them in a chunk a step while its sequence generates plainly: a short request that joins meanwhile gets
    its first token at its second step, the long one's draft never drafts before it has caught up, and its output
    is the target alone's."""
    roomy.draft_context.throughput.seed(1e-7)  # the draft takes a stretch in cheaply: all of it, no window
    roomy.target_context.throughput.seed(1e-5)
    long_tokens = roomy.target.tokenize(" ".join(f"w{i % 37} the cat" for i in range(550)))
    assert len(long_tokens) > 4000
    slots = roomy.slots(2)
    scheduler = Scheduler()
    long = slots[0].generate(long_tokens, GenerationRequest(sampling=GREEDY, draft_max=3, draft_mode="model",
                                                            max_tokens=160))
    scheduler.join(long)
    scheduler.step()
    quick = GenerationRequest(sampling=GREEDY, draft_mode="none", max_tokens=2)
    short = slots[1].generate(roomy.prompt_tokens("hello there", raw=True), quick)
    scheduler.join(short)
    assert steps_to_first_token(scheduler, short, long) <= 2 and scheduler.phase(long)["phase"] == "prefill"
    while scheduler.phase(long)["phase"] != "catching up":
        scheduler.step()
        assert long.stats.drafted == 0
    lacks = scheduler.phase(long)["lacks"]
    assert isinstance(lacks, int) and lacks > 3000
    short = slots[1].generate(roomy.prompt_tokens("zz top", raw=True), quick)
    scheduler.join(short)
    assert steps_to_first_token(scheduler, short, long) <= 2 and scheduler.phase(long)["phase"] == "catching up"
    assert long.stats.drafted == 0
    while len(scheduler):
        scheduler.step()
    assert long.stats.caught_up > 3000 and long.stats.accepted > 0
    expected = finish(roomy.generate(long_tokens, sampling=GREEDY, max_tokens=160, draft_mode="none")).token_ids
    agreed, _tie = greedy_agreement(roomy.target, long_tokens, long.token_ids, expected)
    assert agreed == len(expected) or _tie is not None


@pytest.fixture(scope="module", params=["mamba", "jamba", "lfm2"])
def memory_pair(request: pytest.FixtureRequest, models_dir: Path) -> Iterator[Pair]:
    target = write_model(models_dir / f"batched-{request.param}.gguf", seed=1, arch=request.param)
    draft = write_model(models_dir / f"batched-{request.param}-draft.gguf", seed=2, arch=request.param)
    with load_pair(target, draft) as pair:
        yield pair


def test_recurrent_and_hybrid_memories_go_back_per_sequence(memory_pair: Pair) -> None:
    requests = [REQUESTS[0], REQUESTS[2], REQUESTS[0]]
    prompts = PROMPTS[:3]
    expected = [alone(memory_pair, p, r) for p, r in zip(prompts, requests)]
    slots = memory_pair.slots(3)
    generations = [slot.generate(memory_pair.prompt_tokens(p, raw=True), r)
                   for slot, p, r in zip(slots, prompts, requests)]
    emitted = run(Scheduler(), {0: generations[:2], 1: generations[2:]})
    assert [emitted[id(g)] for g in generations] == expected
    assert sum(g.stats.drafted - g.stats.accepted for g in generations) > 0


def test_a_sequence_sampled_in_a_batch_follows_the_target_law(other: Pair, slots: list) -> None:
    """χ² at α = 0.001: the first two tokens of sequences sampled four at a time in one batch (drafted by
    unrelated weights, so often rejected) follow p(x1, x2 | prompt) exactly."""
    prompt = other.prompt_tokens("the cat", raw=True)
    expected = exact_pair_distribution(other, prompt, SAMPLED)
    observed: Counter = Counter()
    scheduler = Scheduler()
    rejected = 0
    for batch in range(N_SAMPLES // len(slots)):
        generations = [slot.generate(prompt, GenerationRequest(sampling=SAMPLED, seed=len(slots) * batch + i,
                                                               draft_max=3, draft_mode="model", max_tokens=4))
                       for i, slot in enumerate(slots)]
        run(scheduler, {0: generations})
        observed.update(tuple(g.token_ids[:2]) for g in generations)
        rejected += sum(g.stats.rejected_rounds for g in generations)
    assert rejected > N_SAMPLES / 10  # the rule is at work
    assert chi_square_p_value(observed, expected, N_SAMPLES) > SIGNIFICANCE


def test_a_slot_refuses_a_drafter_its_pair_lacks_as_the_pair_does(other: Pair, slots: list) -> None:
    with pytest.raises(Exception, match="has no MTP layers to draft with"):
        slots[1].generate([5, 6], GenerationRequest(draft_mode="mtp"))


def test_rounds_that_do_not_fit_one_batch_run_in_several_passes(other: Pair, slots: list) -> None:
    a, b, c = slots[0].target, slots[1].target, slots[2].target
    parts = [Part(a, [1] * 300, 1, 1), Part(b, [2] * 300, 1, 1), Part(c, [3] * 100, 1, 1), Part(a, [4] * 700, 1, 1)]
    assert [[len(p.tokens) for p in group] for group in _batches(parts, 512)] == [[300], [300, 100], [700]]


def test_the_draft_models_steps_of_several_sequences_are_one_pass(other: Pair, slots: list,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    passes: list[int] = []

    def counted(parts: list) -> list:
        if parts[0][0].model is other.draft:
            passes.append(len(parts))
        return decode_together(parts)

    monkeypatch.setattr(scheduling, "decode_together", counted)
    request = GenerationRequest(sampling=GREEDY, draft_max=3, draft_mode="model", max_tokens=12)
    prompts = [other.prompt_tokens(p, raw=True) for p in PROMPTS]
    generations = [slot.generate(tokens, request) for slot, tokens in zip(slots, prompts)]
    emitted = run(Scheduler(), {0: generations})
    assert [emitted[id(g)] for g in generations] == [alone(other, p, request) for p in PROMPTS]
    assert max(passes) == len(slots) and sum(passes) >= 3 * len(slots)  # each step of all four at once


def test_planning_is_timed_alone_and_under_the_scheduler(other: Pair, slots: list) -> None:
    """`plan_s`: what choosing each round's way and K took, part of the decode time, alone and in a batch (where each
    sequence counts its share of the batch's choice), and in the JSON statistics per round."""
    request = GenerationRequest(sampling=GREEDY, draft_max="auto", max_tokens=24)  # the default drafting
    lone = finish(other.generate(other.prompt_tokens(PROMPTS[0], raw=True), request))
    assert 0 < lone.stats.plan_s < lone.stats.decode_s
    assert lone.stats.as_dict()["plan_per_round_s"] == pytest.approx(lone.stats.plan_s / lone.stats.rounds)
    generations = [slot.generate(other.prompt_tokens(p, raw=True), request) for slot, p in zip(slots[:2], PROMPTS)]
    started = time.perf_counter()
    run(Scheduler(), {0: generations})
    wall = time.perf_counter() - started
    assert all(g.stats.plan_s > 0 for g in generations) and sum(g.stats.plan_s for g in generations) < wall


def test_slots_share_the_pairs_book_of_passes_and_each_pass_is_booked_once_by_its_rows(other: Pair) -> None:
    """Every slot prices the target's passes from the pair's one book, where the scheduler books each pass over all
    their rows once: each sequence booked the whole pass against its own K + 1 rows before, in a book of its slot's."""
    slots = other.slots(2)
    passes = other.drafting.passes
    assert all(slot.drafting.passes is passes and slot.drafting.costs("none").verify is passes for slot in slots)
    request = GenerationRequest(sampling=GREEDY, draft_max=0, draft_mode="none", max_tokens=8)
    scheduler = Scheduler()
    for slot, prompt in zip(slots, PROMPTS[1:]):
        scheduler.join(slot.generate(other.prompt_tokens(prompt, raw=True), request))
    before, steps = passes.calls_recorded, 0
    while len(scheduler):
        scheduler.step()
        steps += 1
    assert 0 < passes.calls_recorded - before <= steps  # one a step at most, and only passes without prompt chunks
    assert passes.fresh(2)  # the two sequences' rows, one each


def test_a_scheduler_prices_its_first_step_from_the_pair_its_first_sequence_comes_from(other: Pair,
                                                                                       slots: list) -> None:
    """A scheduler made bare (`spec serve`'s, `spec batch`'s) reads its first passes' prices off the pair's running
    costs, as a lone generation's does: its planner has prices before it has run a step."""
    finish(other.generate("warm", raw=True, max_tokens=4, draft_max=0, draft_mode="none"))
    scheduler = Scheduler()
    assert not scheduler.planner.pass_costs.weight
    request = GenerationRequest(sampling=GREEDY, draft_max="auto", draft_mode="model", max_tokens=4)
    scheduler.join(slots[0].generate(other.prompt_tokens(PROMPTS[0], raw=True), request))
    assert scheduler.planner.pass_costs.weight
    run(scheduler, {})
