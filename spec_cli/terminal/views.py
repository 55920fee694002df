"""The three views of a run: `TerminalView` (colours by provenance, a live footer of statistics, a final
summary), `PlainView` (text alone on stdout for pipes, a one-line summary on stderr) and `JsonView` (one
object on stdout at the end). They only consume the loop's events. Rich honours NO_COLOR by itself.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from typing import Protocol

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from spec_cli.decoding.engine import Generation, TokenEvent
from spec_cli.decoding.stats import Stats
from spec_cli.reports.summary import percent, summary_line
from spec_cli.terminal.output import note

DRAFT_STYLE = "cyan"
TARGET_STYLE = ""
REFRESH_S = 0.1


class View(Protocol):
    def start(self, generation: Generation) -> None: ...

    def token(self, event: TokenEvent) -> None: ...

    def finish(self, generation: Generation) -> None: ...


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
            note(summary_line(generation.stats, generation.finish_reason))


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
            self.console.print(Text(summary_line(generation.stats, generation.finish_reason), style="dim"))

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
