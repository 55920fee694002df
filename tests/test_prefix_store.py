"""Prompts that stay warm: a request on another slot starts from the state a finished one left (target and
draft), answers as a fresh server does, and the store keeps to its limit; a memory that cannot be cut takes
only whole prefixes; `--cache-ram` refuses what is not a size."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.tiny_models import write_model
from typer.testing import CliRunner

from spec_cli import Pair, load_pair
from spec_cli.cli.app import app
from spec_cli.llama.context import Context
from spec_cli.llama.prefix_store import MIN_TOKENS, PrefixStore

from support.serving import NAME, Running

SYSTEM = {"role": "system", "content": "the cat and the dog " * 30}  # an agent's long system prompt, shared


def ask(serving: Running, user: str, max_tokens: int = 4, stream: bool = False) -> object:
    return serving.client().chat.completions.create(model=NAME, messages=[SYSTEM, {"role": "user", "content": user}],
                                                    max_tokens=max_tokens, temperature=0, stream=stream)


def test_a_request_on_another_slot_starts_from_the_saved_prefix_and_answers_the_same(chat_pair: Pair) -> None:
    fresh = Running(chat_pair, parallel=2)
    try:
        expected = ask(fresh, "two")
    finally:
        fresh.stop()
    serving = Running(chat_pair, parallel=2, cache_ram=2**26)
    try:
        first = ask(serving, "one")
        busy = ask(serving, "busy", max_tokens=200, stream=True)  # holds the slot that has the prefix
        next(iter(busy))
        second = ask(serving, "two")
        busy.close()
        health = serving.service.health()["cache_ram"]
    finally:
        serving.stop()
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens > 0.9 * second.usage.prompt_tokens
    assert second.choices[0].message.content == expected.choices[0].message.content
    assert expected.usage.prompt_tokens_details.cached_tokens == 0
    assert health["hits"] == 1 and health["entries"] >= 1 and health["limit_mib"] == 64.0


def filled(context: Context, tokens: list[int]) -> Context:
    context.trim(0)
    context.prefill(tokens)
    return context


def test_the_store_keeps_to_its_limit_least_recently_used_first(chat_pair: Pair) -> None:
    context = chat_pair.target_context
    one = [5 + i % 40 for i in range(MIN_TOKENS + 10)]
    store = PrefixStore(1)
    store.save([filled(context, one)])
    assert store.report()["entries"] == 0  # larger than the limit: not kept
    store = PrefixStore(2**30)
    store.save([filled(context, one)])
    size = store.used
    store.limit = 2 * size + size // 2
    for start in (7, 9):
        store.save([filled(context, [start, *one[1:]])])
    assert store.report()["entries"] == 2  # the first went
    store.save([filled(context, [9, *one[1:], 12, 13])])  # extends an entry: replaces it
    assert store.report()["entries"] == 2
    context.trim(0)
    assert store.load([context], one + [3]) == 0  # evicted
    assert store.load([context], [7, *one[1:], 3]) == len(one) and context.tokens == [7, *one[1:]]


def test_a_memory_that_cannot_be_cut_takes_only_a_whole_prefix(tmp_path: Path) -> None:
    with load_pair(write_model(tmp_path / "mamba.gguf", seed=1, arch="mamba"), None) as pair:
        context = pair.target_context
        held = [5 + i % 40 for i in range(MIN_TOKENS + 4)]
        store = PrefixStore(2**26)
        store.save([filled(context, held)])
        context.trim(0)
        assert store.load([context], held[:-2] + [3, 4]) == 0
        assert store.load([context], held + [3, 4]) == len(held)
        logits = context.decode([3], 1)[0]
        other = Context(pair.target, n_ctx=256, n_threads=1)
        try:
            assert (logits == filled(other, held).decode([3], 1)[0]).all()  # the state as the tokens leave it
        finally:
            other.close()


@pytest.mark.parametrize("size, words", [("lots", "must be a size"), ("99999GiB", "more than this machine's memory")])
def test_cache_ram_that_is_not_a_size_is_one_line_and_status_2(size: str, words: str) -> None:
    result = CliRunner().invoke(app, ["serve", "--cache-ram", size])
    assert result.exit_code == 2 and words in result.stderr and len(result.stderr.strip().splitlines()) == 1
