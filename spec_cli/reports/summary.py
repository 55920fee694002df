"""A generation's statistics in words: one line after a run, after each chat answer and in the server's log,
written once here so that every face says the same thing the same way."""

from __future__ import annotations

from spec_cli.decoding.stats import Stats
from spec_cli.drafting.modes import MODES


def percent(rate: float, digits: int = 0) -> str:
    """A rate as a percentage that never rounds a partial figure to 100% or 0%: 2498/2507 is 99.6%, not 100%.

    More decimals are shown only when the rounding would claim all or nothing."""
    text = f"{rate:.{digits}%}"
    while 0 < rate < 1 and text in (f"{0:.{digits}%}", f"{1:.{digits}%}") and digits < 6:
        digits += 1
        text = f"{rate:.{digits}%}"
    return text


def summary_line(stats: Stats, finish_reason: str | None, brief: bool = False) -> str:
    """The statistics in one line: after a run and in the server's log; `brief` after each chat answer (the
    prompt's new tokens instead of the drafting details and where the models run)."""
    s = stats
    parts = [f"{s.generated_tokens} tokens", f"{s.tokens_per_second:.1f} tok/s"]
    if s.drafted:
        acceptance = f"acceptance {percent(s.acceptance_rate)}"
        parts += [acceptance if brief else f"{acceptance} ({s.accepted}/{s.drafted})",
                  f"mean accepted length {s.mean_accepted_length:.2f}"]
    if brief:
        return " · ".join([*parts, f"prompt {s.prompt_tokens - s.prompt_cached} new tokens"])
    if s.drafted:
        if s.adaptive:
            parts.append(f"K auto, last {s.current_k}")
        parts.append(f"drafting: {label(s.draft_mode)}{ways(s)}")
        if s.convert_s:
            parts.append(f"through text: conversion {percent(s.convert_share, 1)} of the rounds")
    elif s.ways:
        parts.append(f"drafting: {label(s.draft_mode)}{ways(s)}")
    else:
        parts.append("K auto: no draft paid (K = 0)" if s.adaptive else "no draft")
    if s.caught_up:
        parts.append(f"the draft caught up on {s.caught_up} tokens between rounds")
    if s.batch_size > 1:
        parts.append(f"{s.batch_size:.1f} sequences a pass")
    cached = f" ({s.prompt_cached} cached)" if s.prompt_cached else ""
    parts += [f"prompt {s.prompt_tokens} tokens{cached} in {s.prompt_s:.2f}s", f"finish: {finish_reason}"]
    if any(where != "CPU" for where in s.placement.values()):
        parts += [f"{name} on {where}" for name, where in s.placement.items()]
    if s.threads[0] < s.threads[1]:
        parts.append(f"{s.threads[0]} of {s.threads[1]} threads (fewer decoded faster: the CPUs are busy)")
    return " · ".join(parts)


def label(mode: str) -> str:
    return MODES[mode].label if mode in MODES else mode


def way_shares(shares: dict[str, dict[str, float | int]]) -> str:
    """How often each way a hybrid chose drafted, and the tokens its rounds yielded each (`Stats.way_shares`),
    most chosen first: "n-gram lookup 82% of rounds, 3.1 tokens each · no draft 18%"."""
    ordered = sorted(shares.items(), key=lambda item: -item[1]["rounds"])
    text = []
    for i, (way, got) in enumerate(ordered):
        share = percent(got["share"]) + (" of rounds" if i == 0 else "")
        text.append(f"{label(way)} {share}" + (f", {got['tokens_per_round']:.1f} tokens each" if way != "none" else ""))
    return " · ".join(text)


def ways(stats: Stats) -> str:
    """The hybrid's choices in brackets (`way_shares`); nothing for a pinned mode."""
    shares = stats.way_shares()
    return f" ({way_shares(shares)})" if shares else ""
