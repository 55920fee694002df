"""Rollback on every kind of memory: tiny recurrent, hybrid and sliding-window models written by the tests.

mamba is recurrent (snapshot + replay), lfm2 a hybrid that llama.cpp rolls back in place, jamba a hybrid
that it cannot, gemma3 a sliding-window model with a 4-token window. Each draft is its target with noisy
weights, so most drafts are accepted and some are not: the rollback paths run in every generation.
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
from support.exactness import SAMPLED, SIGNIFICANCE, chi_square_p_value, exact_pair_distribution, priced_to_draft
from support.tiny_models import CHAT_TEMPLATE, write_model

from spec_cli import Generation, Pair, SamplingParams, SpecError, load_pair
from spec_cli.conversation.session import ChatSession, Settings
from spec_cli.llama.context import Context
from spec_cli.llama.model import Model

ARCHS = ("mamba", "lfm2", "jamba", "gemma3")
KIND = {"mamba": "recurrent", "lfm2": "hybrid", "jamba": "hybrid", "gemma3": "sliding window"}
ROLLBACK = {"mamba": "snapshot", "lfm2": "in place", "jamba": "snapshot", "gemma3": "cut"}
PROMPT = "the cat sat on the mat. the cat sat on the"  # repeats itself, so n-gram lookup proposes too
NOISE = 0.1


def finish(generation: Generation) -> Generation:
    for _ in generation:
        pass
    return generation


@pytest.fixture(scope="module", params=ARCHS)
def arch(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def paths(arch: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp(arch)
    return (write_model(folder / "target.gguf", 1, arch=arch, chat_template=CHAT_TEMPLATE),
            write_model(folder / "draft.gguf", 1, arch=arch, noise=NOISE, chat_template=CHAT_TEMPLATE))


@pytest.fixture(scope="module")
def pair(paths: tuple[Path, Path]) -> Iterator[Pair]:
    with load_pair(*paths) as loaded:
        yield loaded


@pytest.fixture(scope="module")
def alone(paths: tuple[Path, Path]) -> Iterator[Pair]:
    with load_pair(paths[0], None) as loaded:
        yield loaded


@pytest.fixture(scope="module")
def reference(alone: Pair) -> list[int]:
    return finish(alone.generate(PROMPT, raw=True, max_tokens=48, draft_mode="none")).token_ids


def test_each_model_reports_its_memory_and_rollback(pair: Pair, arch: str) -> None:
    memory = pair.memory()
    assert memory["target"]["kind"] == memory["draft"]["kind"] == KIND[arch]
    assert memory["target"]["rollback"].startswith(ROLLBACK[arch])
    # One-token draft steps are beyond any in-place rollback: a recurrent draft always uses snapshots.
    assert memory["draft"]["rollback"].startswith("cut" if arch == "gemma3" else "snapshot")


@pytest.mark.parametrize("mode", ["model", "ngram", "hybrid"])
@pytest.mark.parametrize("k", [1, 3, 8, "auto"])
def test_greedy_equals_target_alone_with_rejections(pair: Pair, reference: list[int], mode: str,
                                                   k: int | str) -> None:
    priced_to_draft(pair)
    generation = finish(pair.generate(PROMPT, raw=True, max_tokens=48, draft_max=k, draft_mode=mode))
    assert generation.token_ids == reference
    assert generation.stats.rejected_rounds > 0  # the rollback path ran
    if mode != "ngram" and k != "auto":  # -k auto may stop drafting where it does not pay (K = 0)
        assert generation.stats.accepted > 0  # and drafts were kept around it


def test_rollback_time_is_measured_apart(pair: Pair, arch: str) -> None:
    stats = finish(pair.generate(PROMPT, raw=True, max_tokens=48, draft_max=4, draft_mode="model")).stats
    assert 0 <= stats.rollback_s <= stats.llama_s
    if arch != "gemma3":
        assert stats.rollback_s > 0  # snapshots and restores take time that a cut does not


def test_sampled_first_two_tokens_follow_the_target(pair: Pair, alone: Pair) -> None:
    prompt = alone.prompt_tokens(PROMPT, raw=True)
    expected = exact_pair_distribution(alone, prompt)
    observed: Counter = Counter()
    rejected = 0
    n = 2000
    for seed in range(n):
        generation = finish(pair.generate(prompt, sampling=SAMPLED, seed=seed, max_tokens=3, draft_max=2,
                                          draft_mode="model"))
        observed[tuple(generation.token_ids[:2])] += 1
        rejected += generation.stats.rejected_rounds
    assert rejected > 0
    assert chi_square_p_value(observed, expected, n) > SIGNIFICANCE


def settings(**changes: object) -> Settings:
    base = dict(sampling=SamplingParams(), draft_max=4, draft_mode="model", draft_p_min=0.0, max_tokens=16)
    base.update(changes)
    return Settings(**base)


def test_chat_turns_reuse_the_memory_and_equal_answers_from_scratch(paths: tuple[Path, Path], pair: Pair) -> None:
    session = ChatSession(pair, settings(), system="be brief")
    messages = ["hello there", "the cat sat", "and the dog"]
    for i, message in enumerate(messages):
        for _ in session.reply(message):
            pass
        if i:  # each later turn evaluates only its new tokens
            assert session.last.stats.prompt_cached > len(session.last.prompt) // 2
        with load_pair(paths[0], None) as fresh:
            scratch = finish(fresh.generate(session.last.prompt, max_tokens=16, draft_mode="none"))
        assert session.last.token_ids == scratch.token_ids


@contextmanager
def context(model: Model, **settings: int) -> Iterator[Context]:
    made = Context(model, n_threads=1, **settings)
    try:
        yield made
    finally:
        made.close()


def assert_continues_like_a_fresh_context(reused: Context, sequence: list[int], token: int = 47) -> None:
    """Feeding `token` (after whatever of `sequence` `reused` lacks) gives the logits a fresh context gives
    for `sequence` + `token`: to within what evaluating in other batches changes (up to ~2e-3 on these
    models, f16 KV cache), far below what a state holding wrong tokens does (order 1)."""
    after = reused.decode([*sequence[reused.n_past:], token], 1)[0]
    with context(reused.model, n_ctx=reused.n_ctx) as fresh:
        expected = fresh.decode([*sequence, token], 1)[0]
    np.testing.assert_allclose(after, expected, rtol=1e-3, atol=1e-2)


def test_a_new_turn_resumes_from_the_end_of_the_last_prompt(alone: Pair) -> None:
    """What a chat turn does when the template rewrites the last answer: it shares the last prompt and
    nothing after. A memory that cannot cut there restores the snapshot taken at that prompt's end."""
    first = alone.target.tokenize(PROMPT)
    with context(alone.target, n_ctx=128) as reused:
        reused.prefill(first)
        reused.decode([40, 41, 42, 43], 1)  # the answer, later rewritten
        assert reused.prefill([*first, 44, 45]) == len(first)
        assert_continues_like_a_fresh_context(reused, [*first, 44, 45])


def test_a_long_answer_rewritten_resumes_from_the_end_of_a_long_prompt(alone: Pair) -> None:
    """The same after 300 prompt tokens and a 300-token answer: by then a sliding-window cache of 256
    cells has pruned what the next token after the prompt needs, so it too restores the prompt's snapshot."""
    history = alone.target.tokenize(PROMPT * 25)[:300]
    # Batches of 16 keep the sliding-window cache at 256 cells (it holds the window plus one batch).
    with context(alone.target, n_ctx=1024, n_batch=16) as reused:
        reused.prefill(history)
        reused.decode([40 + i % 20 for i in range(300)], 0)  # the answer, later rewritten
        assert reused.prefill([*history, 44, 45]) == len(history)
        assert_continues_like_a_fresh_context(reused, [*history, 44, 45])


def test_cutting_far_back_equals_a_fresh_evaluation(alone: Pair) -> None:
    """A prompt that shares only its first tokens with a long history (300 tokens: a sliding-window cache
    of 256 cells has wrapped and pruned them): the memory starts over rather than continue from a state
    that holds tokens it should not, or lacks ones it needs."""
    history = alone.target.tokenize(PROMPT * 25)[:300]
    second = history[:3] + alone.target.tokenize(" a bird flew", add_special=False)
    # Batches of 16 keep the sliding-window cache at 256 cells (it holds the window plus one batch).
    with context(alone.target, n_ctx=512, n_batch=16) as reused:
        reused.prefill(history)
        assert reused.prefill(second) == 0
        assert_continues_like_a_fresh_context(reused, second)


def test_trim_within_a_round_equals_a_fresh_evaluation(alone: Pair) -> None:
    """Rounds as the engine and a drafter make them: a verify batch whose first token is final, and
    one-token draft steps that are all speculative (beyond an in-place rollback, which only reaches into
    the last batch). A memory may keep less than asked; the next batch feeds what it lacks, as callers do."""
    sequence = alone.target.tokenize(PROMPT)
    with context(alone.target, n_ctx=128, max_rollback=8) as trimmed:
        trimmed.prefill(sequence)
        rounds = [([([40, 41, 42, 43], 1)], 1), ([([44], 0), ([45], 0)], 1), ([([46], 0)], 0)]
        for batches, n_keep in rounds:
            for tokens, n_final in batches:
                missing = sequence[trimmed.n_past:]
                trimmed.decode([*missing, *tokens], 1, n_final=len(missing) + n_final)
            sequence += [token for tokens, _ in batches for token in tokens][:n_keep]
            trimmed.trim(len(sequence))
            assert trimmed.tokens == sequence[:trimmed.n_past]
        assert_continues_like_a_fresh_context(trimmed, sequence)


def test_a_refused_decode_is_one_line_naming_the_model(alone: Pair) -> None:
    with context(alone.target, n_ctx=64) as refusing:
        with pytest.raises(SpecError) as caught:
            refusing.decode([alone.target.n_vocab + 5], 1)  # llama.cpp rejects a token id outside the vocabulary
        assert "target.gguf" in str(caught.value) and "\n" not in str(caught.value)
        assert "invalid token" in str(caught.value)
        assert refusing.n_past == 0  # nothing half-decoded stays behind
        assert refusing.decode(alone.target.tokenize("the cat"), 1).shape == (1, alone.target.n_vocab)


@pytest.fixture(scope="module")
def attention_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("llama") / "llama.gguf", 1)


@pytest.mark.parametrize("target_arch", ["llama", "mamba"])
def test_recurrent_and_attention_models_draft_for_each_other(tmp_path: Path, attention_target: Path,
                                                            target_arch: str) -> None:
    """A recurrent draft for an attention target, and the reverse: each memory rolls back on its own."""
    recurrent = write_model(tmp_path / "mamba.gguf", 3, arch="mamba")
    target, draft = (attention_target, recurrent) if target_arch == "llama" else (recurrent, attention_target)
    with load_pair(target, None) as solo:
        reference = finish(solo.generate(PROMPT, raw=True, max_tokens=40, draft_mode="none")).token_ids
    with load_pair(target, draft) as pair:
        for k in (2, 5):
            generation = finish(pair.generate(PROMPT, raw=True, max_tokens=40, draft_max=k, draft_mode="model"))
            assert generation.token_ids == reference
            assert generation.stats.rejected_rounds > 0


def test_sliding_window_stays_exact_far_beyond_the_window(tmp_path: Path) -> None:
    """900 tokens through a 4-token window: the cache (768 cells: the window plus a 512-token batch, in
    256s) wraps and prunes as it goes."""
    target = write_model(tmp_path / "target.gguf", 1, arch="gemma3")
    draft = write_model(tmp_path / "draft.gguf", 1, arch="gemma3", noise=NOISE)
    with load_pair(target, None, n_ctx=1024) as solo:
        reference = finish(solo.generate(PROMPT, raw=True, max_tokens=900, draft_mode="none")).token_ids
    with load_pair(target, draft, n_ctx=1024) as pair:
        generation = finish(pair.generate(PROMPT, raw=True, max_tokens=900, draft_max=6, draft_mode="model"))
    assert generation.token_ids == reference
    assert generation.stats.rejected_rounds > 10


def test_a_rollback_replays_at_most_the_round_it_takes_back(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """The target decodes each round's batch, plus, after a restore, at most that round's kept tokens
    again: a snapshot left behind earlier rounds would replay them over and over."""
    decoded: list[int] = []
    decode = Context._decode

    def counting(self: Context, tokens: list[int], n_logits: int) -> np.ndarray:
        if self is pair.target_context:
            decoded.append(len(tokens))
        return decode(self, tokens, n_logits)

    monkeypatch.setattr(Context, "_decode", counting)
    k = 2  # short rounds: fully accepted ones (no rollback) come between rejected ones
    stats = finish(pair.generate(PROMPT, raw=True, max_tokens=48, draft_max=k, draft_mode="model")).stats
    rounds = sum(decoded) - stats.prompt_tokens + 1  # the prefill holds all but the last prompt token
    assert stats.rejected_rounds > 0 and stats.rejected_rounds < stats.rounds
    assert rounds <= stats.rounds * (k + 1) + stats.rejected_rounds * (k + 1)
