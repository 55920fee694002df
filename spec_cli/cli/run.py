"""`spec run`: generate from a prompt (an argument or stdin), streamed to the terminal, a pipe or JSON."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer

from spec_cli.cli.common import EXIT_INTERRUPTED, silence_stdout, stop_signals_raise, user_errors
from spec_cli.cli.options import (DraftMaxOpt, DraftModeOpt, DraftPMinOpt, LoadOptions, MemoryOptions, NoDraftOpt,
                                  QuietOpt, RequestFlags, Sampling, SeedOpt, VerifyOpt, constrains, loads_pair,
                                  open_pair, prompts_holding, remembers, samples)
from spec_cli.decoding.engine import Generation
from spec_cli.errors import SpecError
from spec_cli.llama import rpc
from spec_cli.llama.vision import read_image
from spec_cli.formats.structured import Constraint
from spec_cli.terminal.output import error, note
from spec_cli.terminal.views import View, make_view
from spec_cli.formats.user_text import NOT_UTF8_NOTE, decode_user_text

RUN_EXAMPLES = """\
Examples:

  spec run "Explain speculative decoding in one sentence."

  spec run --temp 0.7 --seed 1 -n 200 "Write a haiku about caches."

  spec run --sampling model --repeat-penalty 1.1 "Tell me a story."

  echo "Summarise: ..." | spec run - > summary.txt

  spec run --target big.gguf --draft small.gguf -k 6 "Hello"

  spec run -k auto --draft-mode hybrid "Rewrite this paragraph: ..."

  spec run --target model.gguf --draft-mode ngram "Fix the typos: ..."

  spec run --draft-mode memory --lookup-corpus src/ "Explain what parse_args in src/cli.py does."

  spec run --no-draft --json "Hello" | jq .stats.tokens_per_second

  (echo "Extract the invoice as JSON:"; cat invoice.txt) | spec run --json-schema-file invoice.schema.json - > invoice.json

  spec run -j '{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}' "Who wrote Hamlet?"

  spec run --grammar 'root ::= "yes" | "no"' "Is the sky blue? Answer yes or no."

  spec run --target gemma-3-4b-it.gguf --mmproj mmproj-gemma-3-4b-it.gguf -i photo.jpg "What is in this picture?"

  spec run --pair gemma3-4b-vision -i chart.png -i table.png "Do these two agree?"

  spec run --target 70b.gguf --draft 1b.gguf --rpc 192.168.1.7:50052,192.168.1.8:50052 "Hello"   # spec worker on each
"""


@loads_pair
@samples
@constrains
@remembers
def run(
    prompt: Annotated[Optional[str], typer.Argument(help="The prompt; '-' or nothing reads it from stdin.", show_default=False)] = None,
    load: LoadOptions = LoadOptions(),
    draft_max: DraftMaxOpt = None,
    draft_mode: DraftModeOpt = None,
    draft_p_min: DraftPMinOpt = 0.0,
    sampling: Sampling = Sampling(),
    constraint: Constraint = Constraint(),
    memory: MemoryOptions = MemoryOptions(),
    verify: VerifyOpt = None,
    seed: SeedOpt = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n", min=1, help="Stop after this many generated tokens.")] = 256,
    no_draft: NoDraftOpt = False,
    images: Annotated[Optional[list[Path]], typer.Option("--image", "-i", help="An image the prompt is about (PNG, JPEG, …), before its text; repeat for more. The target needs its mmproj (--mmproj, or one beside it).", show_default=False)] = None,
    raw: Annotated[bool, typer.Option("--raw", help="Send the prompt verbatim instead of wrapping it in the model's chat template.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object: text, token ids, finish reason, statistics.")] = False,
    quiet: QuietOpt = False
) -> None:
    """Generate from a prompt with speculative decoding, streaming tokens and acceptance statistics.

    Greedy output (the default, --temp 0) is token for token what the target alone would write, except where the target's two best tokens tie within float rounding between a batched and a one-row pass (llama.cpp's own speculative loop has the same property); sampled output follows the target's distribution exactly, and a seed gives the same text with any draft or none (gumbel verification, the default where a seed is set). On a terminal, draft tokens the target accepted are shown in cyan.

    Sampling means what it means in llama.cpp, with its defaults: penalties → top-k → top-p → min-p → temperature. A grammar or JSON schema applies first, as llama.cpp's grammar sampler does: the chain runs on the tokens it allows. A JSON schema keyword that cannot be enforced is refused by name.
    """
    with user_errors():
        text = _read_prompt(prompt, quiet, bool(images))
        pictures = [read_image(path) for path in images or []]
        flags = RequestFlags.from_flags(draft_max, draft_mode, no_draft, sampling.checked("greedy"), seed=seed,
                                        verify=verify, draft_p_min=draft_p_min, max_tokens=max_tokens,
                                        grammar=constraint.compiled())
        memory = memory.checked()
        options = replace(load.for_request(flags, no_draft, quiet, images=bool(pictures)),
                          holding=None if pictures else prompts_holding([text], raw, max_tokens))
        with open_pair(options) as loaded:
            memory.apply(loaded.pair, default_file=True, quiet=quiet)
            if not raw and not loaded.pair.has_chat_template:
                if not quiet:
                    note(f"{loaded.pair.target.path.name} has no chat template; sending the prompt as raw text")
                raw = True
            stream(loaded.pair.generate(text, flags.for_pair(loaded), raw=raw, images=pictures),
                   make_view(as_json, quiet))


def _read_prompt(prompt: str | None, quiet: bool, images: bool) -> str:
    """The prompt argument, or stdin when the argument is `-`, or absent with stdin not a terminal (or empty, with
    images: a question is not needed to describe one)."""
    if prompt == "-" or (prompt is None and not sys.stdin.isatty()):
        text, replaced = decode_user_text(sys.stdin.buffer.read())
    elif prompt is None and images:
        return ""
    elif prompt is None:
        raise SpecError('no prompt: give one as an argument (spec run "…") or pipe it in (… | spec run -)')
    else:
        text, replaced = decode_user_text(prompt)
    if replaced and not quiet:
        note(f"note: the prompt is {NOT_UTF8_NOTE}")
    return text


def stream(generation: Generation, view: View) -> None:
    """Feed the generation's events to the view; Ctrl-C or SIGTERM (`timeout`, `kill`) keeps the text so far, still
    reports, and the memory and the cost book are kept as the pair closes."""
    events = iter(generation)
    view.start(generation)

    def worker_lost(line: str) -> None:
        generation.finish_reason = "error"
        view.finish(generation)  # the text so far, as with Ctrl-C
        error(line)

    try:
        with rpc.on_worker_lost(worker_lost), stop_signals_raise():
            for event in events:
                view.token(event)
    except KeyboardInterrupt:
        events.close()
        view.finish(generation)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except BrokenPipeError:
        events.close()
        silence_stdout()
        return
    except SpecError:
        events.close()
        view.finish(generation)  # the text so far stays on screen; the error follows in one line
        raise
    view.finish(generation)
