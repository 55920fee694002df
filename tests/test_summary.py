"""How figures and statistics are written for people."""

from __future__ import annotations

import pytest

from spec_cli.decoding.stats import Stats
from spec_cli.reports.summary import percent, summary_line


@pytest.mark.parametrize("rate, digits, text", [
    (2498 / 2507, 0, "99.6%"),   # rounds to 100% at 0 decimals: one more is shown
    (0.9999, 0, "99.99%"),
    (1.0, 0, "100%"),
    (0.004, 0, "0.4%"),          # nor does a partial figure read as nothing
    (0.0, 0, "0%"),
    (0.94, 0, "94%"),
    (0.0004, 1, "0.04%"),
    (0.251, 1, "25.1%"),
])
def test_percentages_never_round_a_partial_figure_to_all_or_nothing(rate: float, digits: int, text: str) -> None:
    assert percent(rate, digits) == text


def drafted_stats() -> Stats:
    stats = Stats(draft_max=4, draft_mode="ngram", prompt_tokens=30, prompt_cached=20, generated_tokens=12,
                  decode_s=0.5, prompt_s=0.25)
    for drafted, accepted in ((4, 4), (4, 1), (4, 3)):
        stats.record_round(drafted, accepted)
    return stats


def test_one_line_after_a_run_and_in_the_servers_log() -> None:
    assert summary_line(drafted_stats(), "length") == (
        "12 tokens · 24.0 tok/s · acceptance 67% (8/12) · mean accepted length 3.67 · drafting: n-gram lookup · "
        "prompt 30 tokens (20 cached) in 0.25s · finish: length")


def test_the_brief_line_after_a_chat_answer_counts_the_prompts_new_tokens() -> None:
    assert summary_line(drafted_stats(), "stop", brief=True) == (
        "12 tokens · 24.0 tok/s · acceptance 67% · mean accepted length 3.67 · prompt 10 new tokens")


def test_without_drafts_the_line_says_so_and_where_the_models_run() -> None:
    stats = Stats(draft_max=0, prompt_tokens=5, generated_tokens=3, decode_s=1.0, prompt_s=0.5,
                  placement={"target": "CUDA0 (every layer that fits; the rest on the CPU)"})
    assert summary_line(stats, "stop") == ("3 tokens · 3.0 tok/s · no draft · prompt 5 tokens in 0.50s · finish: stop · "
                                           "target on CUDA0 (every layer that fits; the rest on the CPU)")


def test_fewer_threads_than_the_most_are_said_and_every_thread_is_not() -> None:
    """A busy machine's passes ran faster on fewer threads (`llama/threads.py`): the line says so; on all of them it
    says nothing."""
    stats = Stats(draft_max=0, prompt_tokens=5, generated_tokens=3, decode_s=1.0, prompt_s=0.5, threads=(1, 2))
    assert summary_line(stats, "stop") == ("3 tokens · 3.0 tok/s · no draft · prompt 5 tokens in 0.50s · finish: stop · "
                                           "1 of 2 threads (fewer decoded faster: the CPUs are busy)")
    stats.threads = (2, 2)
    assert summary_line(stats, "stop").endswith("finish: stop")


def test_a_generation_batched_with_others_says_how_many_a_pass_and_auto_that_stopped_drafting() -> None:
    stats = Stats(draft_max=16, adaptive=True, draft_mode="model", prompt_tokens=5, generated_tokens=3,
                  decode_s=1.0, prompt_s=0.5)
    stats.rounds, stats.batched = 3, 10
    assert summary_line(stats, "length") == ("3 tokens · 3.0 tok/s · K auto: no draft paid (K = 0) · 3.3 sequences "
                                             "a pass · prompt 5 tokens in 0.50s · finish: length")


def test_a_draft_that_caught_up_between_rounds_says_on_how_many_tokens() -> None:
    stats = drafted_stats()
    stats.caught_up = 1536
    assert summary_line(stats, "length") == (
        "12 tokens · 24.0 tok/s · acceptance 67% (8/12) · mean accepted length 3.67 · drafting: n-gram lookup · "
        "the draft caught up on 1536 tokens between rounds · prompt 30 tokens (20 cached) in 0.25s · finish: length")


def hybrid_stats() -> Stats:
    stats = Stats(draft_max=16, draft_mode="hybrid", prompt_tokens=5, generated_tokens=16, decode_s=1.0,
                  prompt_s=0.5)
    for drafted, accepted, way in ((6, 6, "ngram"), (5, 2, "ngram"), (0, 0, "none"), (4, 4, "model")):
        stats.record_round(drafted, accepted, way)
    return stats


def test_the_hybrid_says_how_often_each_way_drafted_and_what_its_rounds_yielded() -> None:
    assert summary_line(hybrid_stats(), "stop") == (
        "16 tokens · 16.0 tok/s · acceptance 80% (12/15) · mean accepted length 4.00 · drafting: hybrid "
        "(n-gram lookup 50% of rounds, 5.0 tokens each · no draft 25% · draft model 25%, 5.0 tokens each) · "
        "prompt 5 tokens in 0.50s · finish: stop")
    ways = hybrid_stats().as_dict()["ways"]
    assert ways["ngram"] == {"rounds": 2, "share": 0.5, "drafted": 11, "accepted": 8, "tokens_per_round": 5.0}
    assert ways["none"]["tokens_per_round"] == 1.0 and set(ways) == {"ngram", "none", "model"}


def test_a_hybrid_that_never_drafted_says_so_and_a_session_adds_its_turns_ways() -> None:
    stats = Stats(draft_max=16, draft_mode="hybrid", prompt_tokens=5, generated_tokens=2, decode_s=1.0, prompt_s=0.5)
    stats.record_round(0, 0, "none")
    stats.record_round(0, 0, "none")
    assert "· drafting: hybrid (no draft 100% of rounds) ·" in summary_line(stats, "stop")
    stats.merge(hybrid_stats())
    assert stats.ways == {"none": [3, 0, 0], "ngram": [2, 11, 8], "model": [1, 4, 4]}
