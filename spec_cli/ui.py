"""Everything the user sees; the only module that imports rich.

Three views consume the engine's events: `TerminalView` (colours by provenance, a live footer of
statistics, a final summary), `PlainView` (text alone on stdout for pipes, a one-line summary on stderr)
and `JsonView` (one object on stdout at the end). Rich honours NO_COLOR by itself.
"""

from __future__ import annotations

import json
import select
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict
from typing import Callable, Iterator, Protocol

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeRemainingColumn, TransferSpeedColumn)
from rich.table import Table
from rich.text import Text

from spec_cli import chat
from spec_cli.chat import ChatSession
from spec_cli.engine import Generation, TokenEvent
from spec_cli.errors import SpecError
from spec_cli.models import MemberReport, PairRow
from spec_cli.paths import cache_dir
from spec_cli.vocab import Rule
from spec_cli.stats import Stats
from spec_cli.text import NOT_UTF8_NOTE, decode_user_text

DRAFT_STYLE = "cyan"
TARGET_STYLE = ""
REFRESH_S = 0.1


def percent(rate: float, digits: int = 0) -> str:
    """A rate as a percentage that never rounds a partial figure to 100% or 0%: 2498/2507 is 99.6%, not 100%.

    More decimals are shown only when the rounding would claim all or nothing."""
    text = f"{rate:.{digits}%}"
    while 0 < rate < 1 and text in (f"{0:.{digits}%}", f"{1:.{digits}%}") and digits < 6:
        digits += 1
        text = f"{rate:.{digits}%}"
    return text


class View(Protocol):
    def start(self, generation: Generation) -> None: ...

    def token(self, event: TokenEvent) -> None: ...

    def finish(self, generation: Generation) -> None: ...


def note(message: str) -> None:
    """A one-line remark on stderr, dim where stderr is a terminal."""
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"spec: {message}", style="dim", markup=False)


def error(message: str) -> None:
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"spec: error: {message}", style="bold red", markup=False)


DRAFTERS = {"model": "draft model", "mtp": "MTP head", "ngram": "n-gram lookup", "hybrid": "hybrid"}


def summary_line(generation: Generation) -> str:
    """The statistics in one line, as printed after a run."""
    s = generation.stats
    parts = [f"{s.generated_tokens} tokens", f"{s.tokens_per_second:.1f} tok/s"]
    if s.drafted:
        parts += [f"acceptance {percent(s.acceptance_rate)} ({s.accepted}/{s.drafted})",
                  f"mean accepted length {s.mean_accepted_length:.2f}"]
        if s.adaptive:
            parts.append(f"K auto, last {s.current_k}")
        parts.append(f"drafting: {DRAFTERS.get(s.draft_mode, s.draft_mode)}")
        if s.convert_s:
            parts.append(f"through text: conversion {percent(s.convert_share, 1)} of the rounds")
    else:
        parts.append("no draft")
    parts += [f"prompt {s.prompt_tokens} tokens in {s.prompt_s:.2f}s", f"finish: {generation.finish_reason}"]
    if any(where != "CPU" for where in s.placement.values()):
        parts += [f"{name} on {where}" for name, where in s.placement.items()]
    return " · ".join(parts)


class PlainView:
    """For pipes and files: the generated text on stdout, nothing else there."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def start(self, generation: Generation) -> None:
        pass

    def token(self, event: TokenEvent) -> None:
        sys.stdout.write(event.text)
        sys.stdout.flush()

    def finish(self, generation: Generation) -> None:
        if generation.text and not generation.text.endswith("\n"):
            sys.stdout.write("\n")
        sys.stdout.flush()
        if not self.quiet:
            note(summary_line(generation))


class JsonView:
    """One JSON object on stdout once generation has ended: text, token ids, finish reason, statistics."""

    def start(self, generation: Generation) -> None:
        pass

    def token(self, event: TokenEvent) -> None:
        pass

    def finish(self, generation: Generation) -> None:
        payload = {
            "text": generation.text,
            "token_ids": generation.token_ids,
            "finish_reason": generation.finish_reason,
            "seed": generation.seed,
            "sampling": {**asdict(generation.sampling), "verify": generation.verification},
            "stats": generation.stats.as_dict(),
        }
        sys.stdout.write(json.dumps(payload) + "\n")
        sys.stdout.flush()


class TerminalView:
    """Streams coloured text above a live statistics footer, then prints the text and a summary.

    While generating, the live region shows the tail of the text that fits on screen plus the footer;
    when it ends the region is replaced by the whole text, so nothing is cut or drawn twice in scrollback.
    """

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.console = Console(highlight=False)
        self.text = Text()
        self.stats: Stats | None = None
        self.live: Live | None = None
        self.last_refresh = 0.0

    def start(self, generation: Generation) -> None:
        self.stats = generation.stats
        self.live = Live(self._render(), console=self.console, auto_refresh=False, transient=True)
        self.live.start()

    def token(self, event: TokenEvent) -> None:
        self.text.append(event.text, style=DRAFT_STYLE if event.from_draft else TARGET_STYLE)
        now = time.monotonic()
        if self.live is not None and now - self.last_refresh >= REFRESH_S:
            self.live.update(self._render(), refresh=True)
            self.last_refresh = now

    def finish(self, generation: Generation) -> None:
        if self.live is not None:
            self.live.stop()
        self.console.print(self.text)
        if not self.quiet:
            self.console.print(Text(summary_line(generation), style="dim"))

    def _render(self) -> Group:
        height = max(1, self.console.size.height - 3)
        lines = self.console.render_lines(self.text, pad=False, new_lines=False)
        visible = Text("\n").join(_line_text(line) for line in lines[-height:])
        return Group(visible, self._footer())

    def _footer(self) -> Text:
        s = self.stats
        footer = Text(style="dim", no_wrap=True, overflow="ellipsis")
        if s is None or s.rounds == 0:
            footer.append("processing the prompt…")
            return footer
        footer.append(f"{s.tokens_per_second:.1f} tok/s · {s.generated_tokens} tokens")
        if s.drafted:
            footer.append(f" · acceptance {percent(s.acceptance_rate)} ({s.accepted}/{s.drafted})"
                          f" · mean accepted length {s.mean_accepted_length:.2f}")
            if s.adaptive:
                footer.append(f" · K {s.current_k} (auto)")
            if s.convert_s:
                footer.append(f" · conversion {percent(s.convert_share, 1)}")
            by_position = " ".join(percent(rate) for rate in s.position_acceptance[:8])
            footer.append(f" · by position {by_position}  ")
            footer.append("■ draft", style=DRAFT_STYLE or None)
            footer.append(" ■ target")
        return footer


def _line_text(segments: list) -> Text:
    line = Text()
    for segment in segments:
        line.append(segment.text, style=segment.style)
    return line


def make_view(as_json: bool, quiet: bool) -> View:
    """JSON when asked; the live terminal view when stdout is a terminal; plain text otherwise."""
    if as_json:
        return JsonView()
    if sys.stdout.isatty():
        return TerminalView(quiet)
    return PlainView(quiet)


def show_comparison(result: dict) -> None:
    """The benchmark's figures side by side: measured and predicted speed-up against the target alone; a
    speed and a drafting table for each prompt set."""
    console = Console(highlight=False)
    settings, costs = result["settings"], result["costs"]
    temperatures = ", ".join(f"{t:g}" for t in settings["temperatures"] if t > 0)
    sampling = "greedy" if not temperatures else \
        f"{'greedy and ' if 0 in settings['temperatures'] else ''}temperature {temperatures}"
    for task in dict.fromkeys(c["task"] for c in result["configs"]):
        configs = [c for c in result["configs"] if c["task"] == task]
        prompts = len(configs[0]["runs"]) // settings["repeat"]
        console.print(_speed_table(configs, f"Speed{f', {task} prompts' if task else ''}: {sampling}, {prompts} "
                                            f"prompts × {settings['repeat']}, {settings['max_tokens']} tokens each"))
        console.print(_drafting_table(configs, f"Drafting{f', {task} prompts' if task else ''}"))
    for c in result["configs"]:
        if c["position_acceptance"]:
            positions = " ".join(percent(rate) for rate in c["position_acceptance"][:16])
            where = f" ({c['task']})" if c["task"] else ""
            console.print(f"acceptance by draft position, {c['label']}{where}: {positions}", style="dim")
    for task, task_costs in costs.items():
        console.print(_costs_line(task_costs, "" if task == "all" else f", {task}"), style="dim")
    console.print("runs interleaved across configurations; tokens/s counts decoding only; speed-ups are against the "
                  "target alone in the same place (local, or over RPC); tokens/pass = tokens "
                  "each target pass yields (mean accepted length); draft/verify = shares of decoding time; "
                  "rollback = the share spent taking rejected tokens back (snapshots, restores, replays: "
                  "recurrent and hybrid models); not llama.cpp = time outside its decode calls; "
                  "predicted = the cost model's tokens/s, E[tokens](K) / (draft steps with their catch-up + "
                  "c_verify(K) + o per token), over the target alone's",
                  style="dim", markup=False)


def _speed_table(configs: list[dict], title: str) -> Table:
    """Speed and speed-up of each configuration; with the target over RPC too, the time of a target pass,
    where the round trips show."""
    placed = any(c["where"] for c in configs)
    table = _table(title, ("tok/s", "min–max", "speed-up", "predicted", *(("ms/target pass",) if placed else ())))
    for c in configs:
        rate = c["tokens_per_second"]
        table.add_row(c["label"], f"{rate['median']:.1f}", f"{rate['min']:.1f}–{rate['max']:.1f}",
                      f"{c['speedup']:.2f}×" if c["speedup"] else "–",
                      f"{c['predicted_speedup']:.2f}×" if c["predicted_speedup"] else "–",
                      *((f"{c['seconds_per_target_pass'] * 1000:.1f}",) if placed else ()))
    return table


def _drafting_table(configs: list[dict], title: str) -> Table:
    """Acceptance and where the time went; a "conversion" column (of the draft's time) when a draft drafted
    through text."""
    through_text = any(c["time_share"]["convert"] for c in configs)
    table = _table(title, ("accepted", "tokens/pass", "draft/verify", *(("conversion",) if through_text else ()),
                           "rollback", "not llama.cpp"))
    for c in configs:
        if c["draft_mode"] != "none":
            share = c["time_share"]
            table.add_row(c["label"], percent(c["acceptance_rate"]), f"{c['mean_accepted_length']:.2f}",
                          f"{percent(share['draft'])} / {percent(share['verify'])}",
                          *((percent(share["convert"], 1),) if through_text else ()), percent(share["rollback"], 1),
                          percent(share["outside_llama_cpp"], 1))
    return table


def _table(title: str, columns: tuple[str, ...]) -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAD)
    table.add_column("", no_wrap=True)
    for column in columns:
        table.add_column(column, justify="right")
    return table


def _costs_line(costs: dict, where: str) -> str:
    """The run's mean cost of each kind of call, in ms: what the predicted column is built from."""
    def listed(by_size: dict[str, float], name: str) -> str:
        return " · ".join(f"{name}={n}: {seconds * 1000:.1f}" for n, seconds in by_size.items()) or "–"
    return (f"costs on this machine{where} (ms): draft step by tokens fed {listed(costs['draft_step_s'], 'n')}; "
            f"verify {listed(costs['verify_s'], 'K')}; loop per token {costs['other_per_token_s'] * 1000:.2f}")


@contextmanager
def progress(total: int) -> Iterator[Callable[[str], None]]:
    """A progress bar with an ETA on stderr; yields a function to call as each run starts."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("starting", total=total)
        started = False

        def advance(label: str) -> None:
            nonlocal started
            bar.update(task, description=label, advance=1 if started else 0)
            started = True

        yield advance


@contextmanager
def download_progress() -> Iterator[type]:
    """Yields a progress-bar class for huggingface_hub downloads, drawn by rich on stderr."""
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True)) as bars:

        class Bar:
            """The part of tqdm's interface huggingface_hub uses: keyword construction, `with`, update."""

            def __init__(self, *, desc: str = "", total: int | None = None, initial: int = 0, **_: object) -> None:
                self.task = bars.add_task(desc, total=total, completed=initial)

            def __enter__(self) -> "Bar":
                return self

            def __exit__(self, *_exc: object) -> None:
                pass

            def update(self, n: int = 1) -> None:
                bars.advance(self.task, n)

        yield Bar


def show_pairs(rows: list[PairRow], default: str) -> None:
    table = Table(title="Model pairs (spec models show NAME for details)")
    for column in ("name", "target", "draft", "memory", "local", "size on disk"):
        table.add_column(column, justify="right" if column == "size on disk" else "left", overflow="fold")
    for row in rows:
        name = f"{row.name} (default)" if row.name == default else row.name
        table.add_row(name, row.target, row.draft, row.memory or "?", _presence(row.target_present, row.draft_present),
                      _size(row.size_bytes) if row.size_bytes else "–")
    Console(highlight=False).print(table)


def _presence(target: bool, draft: bool) -> str:
    if target and draft:
        return "[green]both[/]"
    if target or draft:
        return f"[yellow]{'target' if target else 'draft'} only[/]"
    return "[dim]none[/]"


def _size(n_bytes: int) -> str:
    size = float(n_bytes)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} TB"


def show_pair(name: str, description: str, settings: dict[str, object], members: list[MemberReport]) -> None:
    console = Console(highlight=False)
    console.print(f"[bold]{name}[/]: {description}")
    console.print(" · ".join(f"{key} {value}" for key, value in settings.items()), style="dim")
    for m in members:
        facts = [("source", m.source)]
        if m.is_file:
            facts.append(("file", str(m.path) if m.path else "not on disk yet (spec models pull)"))
        if m.info is not None:
            facts += [("size", _size(m.size_bytes)), ("architecture", m.info.architecture),
                      ("type", m.info.quantization), ("context length", str(m.info.context_length or "?")),
                      ("vocabulary", str(m.info.vocab_size)),
                      ("chat template", "yes" if m.info.has_chat_template else "no"),
                      ("memory", m.info.memory), ("rollback", m.info.rollback),
                      ("MTP layers", str(m.info.mtp_layers)),
                      ("recommended sampling", _recommended(m.info.recommended_sampling))]
        show_facts(m.member, facts)


def _recommended(sampling: dict[str, str]) -> str:
    return " · ".join(f"{key} {_number(value)}" for key, value in sampling.items()) or "none (llama.cpp's defaults)"


def _number(text: str) -> str:
    """A metadata value as written, numbers without llama.cpp's trailing zeros (0.600000 → 0.6)."""
    try:
        return f"{float(text):g}"
    except ValueError:
        return text


def show_rules(rules: list[Rule]) -> None:
    table = Table(title="Sharing token ids (llama.cpp's rules; a pair that breaks one drafts through text)")
    for column in ("rule", "", "detail"):
        table.add_column(column)
    for rule in rules:
        table.add_row(rule.name, "[green]pass[/]" if rule.passed else "[yellow]differs[/]", rule.detail)
    Console(highlight=False).print(table)


def show_facts(title: str, facts: list[tuple[str, str]]) -> None:
    table = Table(title=title, show_header=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in facts:
        table.add_row(key, value)
    Console(highlight=False).print(table)


def worker_started(endpoint: str, devices: list[tuple[str, str, int, int]], threads: int) -> None:
    """What a worker offers, on stdout: its endpoint, and each device's free and total memory."""
    offered = "; ".join(f"{name} ({description}): {_size(free)} free of {_size(total)}"
                        for name, description, free, total in devices)
    say(f"spec worker on {endpoint}: {offered}; {threads} threads. Ctrl-C stops it.")


def serving(name: str, url: str, drafting: str) -> None:
    """The line `spec serve` prints once it listens (with --quiet too: with --port 0 it is the only way to
    learn the port)."""
    Console(stderr=True, highlight=False, soft_wrap=True).print(
        f"spec: serving {name} on {url} · drafting {drafting} · Ctrl-C stops", markup=False)


def say(text: str) -> None:
    """A plain line on stdout (paths and results that scripts may read)."""
    Console(highlight=False, soft_wrap=True).print(text, markup=False)


def chat_loop(session: ChatSession, interactive: bool, quiet: bool) -> None:
    """The REPL: read a message (or a slash command), stream the answer, repeat until /exit or Ctrl-D.

    Interactive: line editing and input history (readline), multi-line input (a trailing backslash, or
    a paste), Ctrl-C cancels the answer in progress. Otherwise one message per input line and plain answers
    on stdout, so a script can drive it.
    """
    console = Console(highlight=False)
    errors = Console(stderr=True, highlight=False, soft_wrap=True)
    history = _InputHistory() if interactive else None
    if interactive:
        target, draft = session.pair.target.path.name, session.pair.draft.path.name if session.pair.draft else "none"
        console.print(f"spec chat · target {target} · draft {draft} · /help for commands, Ctrl-D to leave",
                      style="dim")
        console.print(session.settings.describe(), style="dim", markup=False)
    try:
        while True:
            message = _read_message(interactive)
            if message is None:
                break
            if not message.strip():
                continue
            try:
                if message.lstrip().startswith("/"):
                    _command(session, message, console, errors)
                else:
                    _answer(session, message, console, interactive, quiet)
            except chat.Exit:
                break
            except SpecError as exc:
                errors.print(f"spec: {exc}", style="red", markup=False)
    finally:
        if history is not None:
            history.save()


def _read_message(interactive: bool) -> str | None:
    """One user message; None at end of input. Continuation lines: a trailing backslash, or pasted lines."""
    if not interactive:
        line = sys.stdin.buffer.readline()
        return _user_text(line).rstrip("\n") if line else None
    lines: list[str] = []
    prompt = ">>> "
    while True:
        try:
            line = _user_text(input(prompt))
            # Ctrl-C while a paste is still being checked for (just after Enter) drops the message too.
            more = not line.endswith("\\") and _more_input_waiting()
        except EOFError:
            print()
            return "\n".join(lines) if lines else None
        except KeyboardInterrupt:
            print()
            lines, prompt = [], ">>> "
            continue
        if line.endswith("\\"):
            lines.append(line[:-1])
            prompt = "... "
            continue
        lines.append(line)
        if not more:
            return "\n".join(lines)
        prompt = ""


def _user_text(data: bytes | str) -> str:
    text, replaced = decode_user_text(data)
    if replaced:
        note(f"note: the message is {NOT_UTF8_NOTE}")
    return text


def _more_input_waiting() -> bool:
    """True while pasted text is still arriving, so a multi-line paste becomes one message."""
    ready, _, _ = select.select([sys.stdin], [], [], 0.02)
    return bool(ready)


class _InputHistory:
    """readline's line editing plus input history kept across sessions in the cache folder."""

    def __init__(self) -> None:
        import readline

        self.readline = readline
        self.path = cache_dir() / "chat_history"
        try:
            readline.read_history_file(self.path)
        except OSError:
            pass

    def save(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.readline.set_history_length(1000)
            self.readline.write_history_file(self.path)
        except OSError:
            pass


def _answer(session: ChatSession, message: str, console: Console, interactive: bool, quiet: bool) -> None:
    events = session.reply(message)
    for notice in session.notices:
        console.print(notice, style="dim")
    session.notices.clear()
    try:
        for event in events:
            if interactive:
                console.print(Text(event.text, style=DRAFT_STYLE if event.from_draft else TARGET_STYLE), end="")
                console.file.flush()
            else:
                sys.stdout.write(event.text)
                sys.stdout.flush()
    except KeyboardInterrupt:
        events.close()
        console.print()
        console.print("(answer interrupted; kept in the history as interrupted)", style="dim")
        return
    console.print()
    if interactive and not quiet and session.last is not None:
        console.print(_turn_summary(session.last.stats), style="dim")


def _turn_summary(s: Stats) -> str:
    parts = [f"{s.generated_tokens} tokens", f"{s.tokens_per_second:.1f} tok/s"]
    if s.drafted:
        parts += [f"acceptance {percent(s.acceptance_rate)}", f"mean accepted length {s.mean_accepted_length:.2f}"]
    parts.append(f"prompt {s.prompt_tokens - s.prompt_cached} new tokens")
    return " · ".join(parts)


def _command(session: ChatSession, line: str, console: Console, errors: Console) -> None:
    said = chat.run_command(session, line)
    name = line.split()[0]
    if name == "/help":
        table = Table(show_header=False, box=None)
        for usage, meaning in chat.COMMANDS.items():
            table.add_row(usage, meaning, style=None)
        console.print(table)
    elif name == "/stats":
        _show_session_stats(session, console)
    elif said:
        errors.print(said, style="dim", markup=False)


def _show_session_stats(session: ChatSession, console: Console) -> None:
    t = session.totals
    facts = [("answers", str(sum(1 for turn in session.turns if turn.role == "assistant"))),
             ("generated tokens", str(t.generated_tokens)),
             ("tokens/s", f"{t.tokens_per_second:.1f}"),
             ("acceptance", f"{percent(t.acceptance_rate)} ({t.accepted}/{t.drafted})" if t.drafted else "–"),
             ("mean accepted length", f"{t.mean_accepted_length:.2f}" if t.rounds else "–"),
             ("by draft position", " ".join(f"{i + 1}:{percent(rate)}" for i, rate in
                                            enumerate(t.position_acceptance)) or "–"),
             ("prompt tokens reused", f"{t.prompt_cached}/{t.prompt_tokens}")]
    show_facts("session statistics", facts)
