"""What a chat template says of how its model talks, read off the template once: whether it shows tools, the
convention its calls are written in (`conventions`), whether its prompt opens a thought, and how a grammar
writes the convention's markers for the model. `spec serve` asks it of every chat; `spec models check`
reports it.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from spec_cli.formats import conventions
from spec_cli.formats.conventions import Convention
from spec_cli.errors import SpecError
from spec_cli.llama import grammar
from spec_cli.llama.model import Model
from spec_cli.llama.prompt_text import PromptText
from spec_cli.formats.structured import Thought

HELLO = [{"role": "user", "content": "hi"}]


class Dialect:
    """`model`'s chat template (or `template`, a Jinja text that overrides it); `log` hears, once, that its
    calls are written in no known convention."""

    def __init__(self, model: Model, template: str | None = None,
                 log: Callable[[str], None] = lambda _line: None) -> None:
        self.model, self.template, self._log = model, template, log

    @functools.cached_property
    def takes_tools(self) -> bool:
        """Whether the template shows the tools it is given (the probe tool's name appears in its prompt)."""
        return conventions.PROBE_NAME in self._render(HELLO, tools=conventions.probe_tools()).text

    @functools.cached_property
    def known_convention(self) -> Convention | None:
        """The convention the template writes calls in, read off its rendering of a probe call; None for a
        template that shows no tools, writes calls no known way, or fails on a past call."""
        if not self.takes_tools:
            return None
        try:
            return conventions.read_off(lambda messages, **options: self._render(messages, **options).text)
        except SpecError:  # the template's own error on a past call (raise_exception, a field it wants)
            return None

    @functools.cached_property
    def convention(self) -> Convention:
        """The convention calls are read and forced in: the template's, else the generic one (said once in the
        log when the template shows tools but writes calls another way)."""
        if self.known_convention is None and self.takes_tools:
            self._log("the chat template's tool-call convention is not one spec knows; calls are read and forced "
                      "in the generic <tool_call> JSON")
        return self.known_convention or conventions.HERMES

    @functools.cached_property
    def thought(self) -> Thought | None:
        """Whether the template lets its model think before it answers: a prompt that ends in the thought's
        open marker opens one; a template that writes the close marker lets the model open one itself."""
        convention = self.convention
        if self._render(HELLO).text.rstrip().endswith(convention.think_open):
            return Thought(True, convention.think_open, convention.think_close)
        source = self.template or self.model.chat_template() or ""
        return Thought(False, convention.think_open, convention.think_close) if convention.think_close in source \
            else None

    def spell(self, marker: str) -> str:
        """A convention's marker as a grammar writes it for the model: its control tokens as themselves."""
        return grammar.spelt(self.model, marker)

    def reads_markers(self, with_tools: bool) -> bool:
        """Whether an answer's text must show the model's control tokens: where the convention marks calls or
        channels with them (Mistral's `[TOOL_CALLS]`, gpt-oss's channels), the answer is read through them."""
        return with_tools or bool(self.convention.dropped)

    def _render(self, messages: list[dict[str, Any]], **options: Any) -> PromptText:
        return self.model.format_chat(messages, template=self.template, **options)
