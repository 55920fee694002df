"""`spec chat`: a conversation in the terminal, each turn evaluating only its new tokens."""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Annotated, Optional

import typer

from spec_cli.conversation import session as conversation
from spec_cli.cli.common import exit_status, stop_signals_raise, user_errors
from spec_cli.cli.options import (ChatFormatOpt, DraftMaxOpt, DraftModeOpt, DraftPMinOpt, LoadOptions, MemoryOptions,
                                  NoDraftOpt, QuietOpt, RequestFlags, Sampling, SeedOpt, VerifyOpt, constrains,
                                  loads_pair, open_pair, remembers, samples)
from spec_cli.formats.structured import Constraint
from spec_cli.terminal.chat_repl import chat_loop

CHAT_EXAMPLES = """\
Examples:

  spec chat

  spec chat --system "You are a terse assistant." --temp 0.7

  spec chat --pair qwen2.5-7b -k auto

  spec chat --json-schema '{"type": "object"}'   # every answer a JSON object; /set json-schema off frees it

  printf 'Hi!\\nWhat is 2+2?\\n' | spec chat > answers.txt

  spec chat --lookup-corpus src/   # answers that quote the code draft from it

  spec chat --pair big --rpc 192.168.1.7:50052 --gpu-layers 60   # 60 layers on the worker, the rest here
"""


@loads_pair
@samples
@constrains
@remembers
def chat(
    load: LoadOptions = LoadOptions(),
    system: Annotated[Optional[str], typer.Option("--system", "-s", help="System message.", show_default=False)] = None,
    chat_format: ChatFormatOpt = None,
    draft_max: DraftMaxOpt = None,
    draft_mode: DraftModeOpt = None,
    draft_p_min: DraftPMinOpt = 0.0,
    sampling: Sampling = Sampling(),
    memory: MemoryOptions = MemoryOptions(),
    constraint: Constraint = Constraint(),
    verify: VerifyOpt = None,
    seed: SeedOpt = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n", min=1, help="Longest answer, in tokens.")] = 512,
    no_draft: NoDraftOpt = False,
    quiet: QuietOpt = False
) -> None:
    """Talk with a model in the terminal, with speculative decoding and per-answer statistics.

    Each turn evaluates only its new tokens: both models keep the conversation in their caches. Type /help for commands. When stdin is not a terminal, each input line is one message and answers are written plainly.

    Sampling uses the settings the target's GGUF recommends (--sampling model), else llama.cpp's defaults, in llama.cpp's order: penalties → top-k → top-p → min-p → temperature.
    """
    with user_errors():
        # --no-draft starts with drafting off and keeps the mode for /draft on.
        flags = RequestFlags.from_flags(draft_max, draft_mode, False, sampling.checked("model"), seed=seed,
                                        verify=verify, draft_p_min=draft_p_min, max_tokens=max_tokens,
                                        grammar=constraint.compiled())
        memory = memory.checked()
        template = conversation.chat_template(chat_format)
        with open_pair(load.for_request(flags, no_draft, quiet, images=True)) as loaded:
            memory.apply(loaded.pair, default_file=False, quiet=quiet)
            # Fail now rather than at the first message when there is no template to use.
            loaded.pair.target.format_chat([{"role": "user", "content": "hi"}], template=template)
            request = flags.for_pair(loaded)
            request = replace(request, draft_mode=loaded.pair.mode_for(request))  # named in the banner and /set
            settings = conversation.Settings.of(request, use_draft=not no_draft)
            session = conversation.ChatSession(loaded.pair, settings, system=system, template=template)
            with stop_signals_raise(exit_status):  # Ctrl-C cancels a line or an answer here
                chat_loop(session, interactive=sys.stdin.isatty(), quiet=quiet)
