"""The chat REPL: read a message or a slash command, stream the answer, repeat until /exit or Ctrl-D."""

from __future__ import annotations

import select
import sys

from rich.console import Console
from rich.table import Table
from rich.text import Text

from spec_cli.conversation import session as chat
from spec_cli.conversation.session import ChatSession
from spec_cli.errors import SpecError
from spec_cli.paths import cache_dir
from spec_cli.reports.summary import percent, summary_line
from spec_cli.terminal.output import note
from spec_cli.terminal.tables import show_facts
from spec_cli.terminal.views import DRAFT_STYLE, TARGET_STYLE
from spec_cli.formats.user_text import NOT_UTF8_NOTE, decode_user_text


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
        console.print(summary_line(session.last.stats, session.last.finish_reason, brief=True), style="dim")


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
