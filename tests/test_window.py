"""A draft's catch-up is a prefill: it takes in at most what β of the target's prefill of the same tokens buys (the
sinks and the latest tokens, `drafting.window`), in chunks between plain rounds where it is long, and the output is
the target alone's whatever the draft holds."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from support.exactness import finish

from spec_cli import Pair, load_pair
from spec_cli.decoding.scheduler import ALONE_CHUNK
from spec_cli.decoding.sampling import SamplingParams
from spec_cli.drafting.window import MIN_WINDOW, SINKS, Window, window_length

GREEDY = SamplingParams()
LONG_CTX = 4096


@pytest.fixture(scope="module")
def files(target_path: Path, near_draft_path: Path) -> tuple[Path, Path]:
    return target_path, near_draft_path


@pytest.fixture(scope="module")
def long_pair(files: tuple[Path, Path]) -> Iterator[Pair]:
    """The pair over a context long enough for long prompts."""
    with load_pair(*files, n_ctx=LONG_CTX) as pair:
        yield pair


def long_prompt(pair: Pair, words: int = 300) -> list[int]:
    text = " ".join(f"w{i % 37} the cat" for i in range(words // 3))
    return pair.target.tokenize(text)


def rates(pair: Pair, draft: float, target: float) -> None:
    """Seconds per token each takes a stretch in at, as a cost book would start them."""
    pair.draft_context.throughput.seed(draft)
    pair.target_context.throughput.seed(target)


def fresh(pair: Pair) -> None:
    """Both memories empty, and no window held."""
    pair.target_context.trim(0)
    assert pair.drafting.draft_memory is not None
    pair.drafting.draft_memory.keep([])


def alone(pair: Pair, prompt: list[int], n: int) -> list[int]:
    return finish(pair.generate(prompt, sampling=GREEDY, max_tokens=n, draft_mode="none")).token_ids


def test_a_window_holds_the_sinks_and_the_latest_tokens() -> None:
    tokens = list(range(100, 200))
    window = Window()
    assert window.held(100) == 100 and window.tail(tokens, 98) == tokens[98:]
    window.place(tokens, 10)
    assert window.start == 90 and window.held(100) == SINKS + 10 and window.held(3) == 3
    assert window.tail(tokens, 0) == [*tokens[:SINKS], *tokens[90:]]
    assert window.tail(tokens, SINKS + 2) == tokens[92:]
    assert window.covered(SINKS) == 90 and window.covered(SINKS + 5) == 95 and window.covered(2) == 2
    assert window.fits([*tokens, 7]) and not window.fits([*tokens[:50], 1, *tokens[51:]])
    assert window.fits([*tokens[:SINKS], 9, *tokens[SINKS + 1:]]) is False


def test_a_window_never_starts_inside_an_image_and_never_skips_nearly_nothing() -> None:
    tokens = [1, 2, 3, 4, 5, 6, -7, -7, -7, 8, 9, 10]
    window = Window()
    window.place(tokens, 5)  # would start at the image's second id: it starts after the image
    assert window.start == 9 and window.tail(tokens, 0) == [1, 2, 3, 4, 8, 9, 10]
    window.place(tokens, len(tokens) - SINKS)
    assert window.start == 0 and window.held(len(tokens)) == len(tokens)


@pytest.mark.parametrize("backlog, own, target, kept", [
    (1000, 4e-3, 2e-3, 125),  # dearer per token than β of the target's prefill: what β buys
    (1000, 1e-4, 2e-3, 1000),  # cheaper: all of it
    (1000, 1.0, 2e-3, MIN_WINDOW),  # never fewer than a window's worth
    (1000, None, 2e-3, 1000), (1000, 4e-3, None, 1000),  # a rate not known: no budget to keep to
    (40, 1.0, 2e-3, 40),  # a short backlog is taken in whole
])
def test_the_window_is_what_beta_of_the_targets_prefill_buys(backlog: int, own: float | None,
                                                             target: float | None, kept: int) -> None:
    assert window_length(backlog, 0.25, own, target) == kept


def test_a_dear_catch_up_drafts_from_a_window_and_stays_exact(long_pair: Pair) -> None:
    """A draft whose catch-up costs more than β of the target's prefill takes in the sinks and the latest tokens;
    its drafts are still kept, and the output is the target alone's."""
    prompt = long_prompt(long_pair)
    fresh(long_pair)
    rates(long_pair, draft=1e-3, target=1e-5)
    expected = alone(long_pair, prompt, 40)
    drafted = finish(long_pair.generate(prompt, sampling=GREEDY, max_tokens=40, draft_mode="model", draft_max=3))
    assert drafted.token_ids == expected
    assert drafted.stats.accepted > 0
    assert long_pair.draft_context.n_past <= SINKS + MIN_WINDOW + 40 < len(prompt)


def test_a_cheap_catch_up_takes_in_the_whole_prompt_between_plain_rounds(long_pair: Pair) -> None:
    """A catch-up longer than a round's first decode may take goes in chunks between rounds, each round a plain
    target step: the first token waits for the target's prefill alone."""
    prompt = long_prompt(long_pair, words=500)
    assert len(prompt) > 2 * ALONE_CHUNK
    fresh(long_pair)
    rates(long_pair, draft=1e-6, target=1e-5)
    expected = alone(long_pair, prompt, 24)
    generation = long_pair.generate(prompt, sampling=GREEDY, max_tokens=24, draft_mode="model", draft_max=3)
    held_at_first = None
    for _event in generation:
        held_at_first = long_pair.draft_context.n_past if held_at_first is None else held_at_first
    assert generation.token_ids == expected
    assert held_at_first is not None and held_at_first <= ALONE_CHUNK
    assert generation.stats.caught_up >= ALONE_CHUNK and generation.stats.accepted > 0
    assert long_pair.draft_context.n_past >= len(prompt)


def test_a_next_turn_keeps_the_window_it_extends_and_a_changed_start_drops_it(long_pair: Pair) -> None:
    prompt = long_prompt(long_pair)
    fresh(long_pair)
    rates(long_pair, draft=1e-3, target=1e-5)
    first = finish(long_pair.generate(prompt, sampling=GREEDY, max_tokens=12, draft_mode="model", draft_max=3))
    held = long_pair.draft_context.n_past
    assert held <= SINKS + MIN_WINDOW + 12
    turn = [*prompt, *first.token_ids, *long_pair.target.tokenize(" and the dog", add_special=False)]
    expected = alone(long_pair, turn, 12)
    again = finish(long_pair.generate(turn, sampling=GREEDY, max_tokens=12, draft_mode="model", draft_max=3))
    assert again.token_ids == expected
    assert long_pair.draft_context.n_past >= held + 12  # the window it held was kept, the new tokens added
    changed = [prompt[0], prompt[1] + 1, *prompt[2:]]
    expected = alone(long_pair, changed, 12)
    assert finish(long_pair.generate(changed, sampling=GREEDY, max_tokens=12, draft_mode="model",
                                     draft_max=3)).token_ids == expected
    assert long_pair.draft_context.tokens[:2] == changed[:2]  # the window over the old start was dropped


def test_the_default_tries_an_unmeasured_draft_on_the_latest_tokens_only(files: tuple[Path, Path]) -> None:
    """With nothing measured yet (an empty cost book), the hybrid tries the draft model on a window of the latest
    tokens: a trial behind a long prompt costs a chunk, not the prompt."""
    with load_pair(*files, n_ctx=LONG_CTX) as pair:
        prompt = long_prompt(pair, words=500)
        expected = alone(pair, prompt, 24)
        generation = finish(pair.generate(prompt, sampling=GREEDY, max_tokens=24, draft_mode="hybrid"))
        assert generation.token_ids == expected
        assert "model" in generation.stats.ways
        assert pair.draft_context.n_past <= SINKS + MIN_WINDOW + 24
