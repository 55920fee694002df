"""The thread count a context's passes run on: left at the most where passes take about the same time, fewer where
fewer decode faster (another process taking turns on the cores), and the most again once the load has gone."""

from __future__ import annotations

from pathlib import Path

import llama_cpp
import numpy as np

from spec_cli.llama.context import Context
from spec_cli.llama.model import Model
from spec_cli.llama.threads import KEPT, REST, REST_MAX, SETTLED, SHAPES, TRIAL, Threads


def run(threads: Threads, seconds_at: dict[int, tuple[float, float]], passes: int, seed: int) -> list[int]:
    """Book `passes` one-row passes, each taking a time drawn uniformly from `seconds_at[count]` (low, high) at the
    count it ran on; return those counts."""
    rng = np.random.default_rng(seed)
    counts = []
    for _ in range(passes):
        count = threads.next
        counts.append(count)
        threads.passed((1, 1), float(rng.uniform(*seconds_at[count])))
    return counts


def test_a_quiet_machine_keeps_every_thread_and_tries_none() -> None:
    """Passes within 5% of each other: no trial in 10,000 passes."""
    threads = Threads(2)
    counts = run(threads, {2: (0.020, 0.021), 1: (0.034, 0.035)}, 10_000, seed=0)
    assert set(counts) == {2}


def test_passes_shorter_than_a_scheduler_tick_are_not_read() -> None:
    """A tiny model's passes (0.1–0.3 ms, spread by the scheduler's noise, not by its thread count): no trial."""
    threads = Threads(2)
    assert set(run(threads, {2: (0.0001, 0.0003), 1: (0.00005, 0.0001)}, 10_000, seed=6)) == {2}


def test_passes_that_spread_try_fewer_threads_and_keep_them_where_they_are_faster() -> None:
    """Beside a process spinning on one core two threads' passes spread from 35 to 220 ms, one thread's take ~33:
    one thread within the first trial, and it stays (its trials of two threads, six passes every 128, lose)."""
    threads = Threads(2)
    counts = run(threads, {2: (0.035, 0.220), 1: (0.030, 0.036)}, 2_000, seed=1)
    first = counts.index(1)
    assert first < REST + KEPT + TRIAL
    assert threads.count == 1
    assert counts[first:].count(2) <= TRIAL / (SETTLED + TRIAL) * len(counts[first:]) + TRIAL  # trials of two threads


def test_passes_of_several_shapes_are_each_read_against_their_own() -> None:
    """One-row passes of 20 ms and verify passes of 60 ms, in turn: a quiet machine (each within 2%) tries nothing,
    though the two shapes differ threefold; a busy one (two threads' passes 1–6× their shape's time, one thread's
    1.5×) goes to one thread."""
    rng = np.random.default_rng(5)
    for spread_at_two, at_one, expected in (((1.0, 1.02), (1.7, 1.72), {2}), ((1.0, 6.0), (1.5, 1.55), {1, 2})):
        threads, counts = Threads(2), []
        for i in range(3_000):
            shape, base = ((1, 1), 0.020) if i % 2 else ((9, 9), 0.060)
            counts.append(threads.next)
            threads.passed(shape, base * float(rng.uniform(*(spread_at_two if threads.next == 2 else at_one))))
        assert set(counts) == expected
        assert threads.count == min(expected)


def test_once_the_load_has_gone_every_thread_comes_back() -> None:
    threads = Threads(2)
    run(threads, {2: (0.035, 0.220), 1: (0.030, 0.036)}, 500, seed=2)
    assert threads.count == 1
    counts = run(threads, {2: (0.020, 0.021), 1: (0.034, 0.035)}, 2 * REST_MAX, seed=3)
    assert threads.count == 2
    assert counts[-100:] == [2] * 100


def test_a_trial_that_loses_waits_twice_as_long_for_the_next() -> None:
    """Spread passes at either count, neither faster: the most threads stay, and the trials come 64, 128, 256 …
    passes apart (each also waits for a spread among the last passes)."""
    threads = Threads(2)
    counts = run(threads, {2: (0.010, 0.050), 1: (0.010, 0.050)}, 6_000, seed=4)
    starts = [i for i in range(1, len(counts)) if counts[i] == 1 and counts[i - 1] == 2]
    gaps = np.diff(starts)
    assert threads.count == 2
    rests = [REST * 2 ** (i + 1) + TRIAL for i in range(len(gaps))]
    assert len(starts) >= 5 and all(rest <= gap < 2 * rest for gap, rest in zip(gaps, rests))


def test_a_long_lived_context_keeps_the_passes_of_its_latest_shapes_only() -> None:
    """A server's prompt chunks come in every size: the shapes kept stay bounded, the newest among them."""
    threads = Threads(2)
    for tokens in range(1, 1_000):
        threads.passed((tokens, 0), 0.002)
    assert len(threads._recent) == SHAPES and (999, 0) in threads._recent and (1, 0) not in threads._recent


def test_a_context_runs_its_passes_on_the_chosen_count_and_its_sequences_share_it(target_path: Path) -> None:
    """The generated models' contexts are made on one thread (conftest): a count of two, set by hand, reaches
    llama.cpp at the next pass, for prompts and single tokens alike."""
    model = Model(target_path)
    context = Context(model, 64, 2, sequences=2)
    try:
        assert context.threads.most == context.threads.count == llama_cpp.llama_n_threads(context._handle) == 1
        assert context.sequence(1).threads is context.threads
        context.threads.count = 2
        context.decode(model.tokenize("the cat"), 1)
        assert llama_cpp.llama_n_threads(context._handle) == llama_cpp.llama_n_threads_batch(context._handle) == 2
    finally:
        context.close()
        model.close()
