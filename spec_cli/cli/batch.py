"""`spec batch`: many prompts from a file or a pipe through one pair, JSONL out, resumable."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated, NoReturn, Optional

import typer

from spec_cli.batch.lines import OPENAI, Task, read_tasks
from spec_cli.batch.output import InOrder, Output, Result, check_resumable, done_ids, line_of
from spec_cli.batch.runner import BatchRunner, held_tokens
from spec_cli.cli.common import EXIT_INTERRUPTED, EXIT_USAGE, stop_signals_raise, user_errors
from spec_cli.cli.options import (DraftMaxOpt, DraftModeOpt, DraftPMinOpt, LoadOptions, MemoryOptions, NoDraftOpt,
                                  RequestFlags, Sampling, SeedOpt, VerifyOpt, constrains, loads_pair, open_pair,
                                  remembers, samples)
from spec_cli.cli.serve import DEFAULT_PARALLEL, default_name
from spec_cli.decoding.scheduler import MAX_SEQUENCES
from spec_cli.decoding.stats import Stats
from spec_cli.errors import SpecError
from spec_cli.request import AUTO
from spec_cli.formats.structured import Constraint
from spec_cli.llama.model import Model
from spec_cli.reports.summary import percent
from spec_cli.terminal.output import error, note
from spec_cli.terminal.progress import BatchBar
from spec_cli.formats.user_text import NOT_UTF8_NOTE, decode_user_text

MOST_FAILED_STATUS = 100  # the exit status counts the failed lines up to this

BATCH_EXAMPLES = """\
Examples:

  spec batch prompts.txt -o answers.jsonl                # one prompt per line; run again to resume

  cat requests.jsonl | spec batch - > answers.jsonl      # {"id": …, "prompt": …} or {"messages": […]} per line

  spec batch openai-batch.jsonl -o results.jsonl         # the OpenAI Batch API's request lines

  spec batch -j '{"type":"object","properties":{"name":{"type":"string"}}}' people.txt -o people.jsonl

  spec batch --parallel 8 --unordered --memory ~/.cache/extract.mem invoices.jsonl -o out.jsonl

  spec batch --lookup-corpus src/ questions.txt -o answers.jsonl   # drafts from the code the prompts are about
"""


@loads_pair
@samples
@constrains
@remembers
def batch(
    source: Annotated[str, typer.Argument(metavar="INPUT", help="A file of prompts (one per line), JSONL requests or OpenAI Batch API lines; '-' reads stdin.")],
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Append each finished line here (flushed as it finishes); running again with the same input and output skips the lines already done (default: stdout).", show_default=False)] = None,
    parallel: Annotated[int, typer.Option("--parallel", "-np", min=1, max=MAX_SEQUENCES, help="Sequences generating at once, verified together in one pass a step, K for each by the batch's tokens per second.")] = DEFAULT_PARALLEL,
    ordered: Annotated[bool, typer.Option("--ordered/--unordered", help="Write lines in input order (a line waits for those before it), or each as it finishes.")] = True,
    token_ids: Annotated[bool, typer.Option("--token-ids", help="Add each answer's token ids to its line.")] = False,
    load: LoadOptions = LoadOptions(),
    draft_max: DraftMaxOpt = None,
    draft_mode: DraftModeOpt = None,
    draft_p_min: DraftPMinOpt = 0.0,
    sampling: Sampling = Sampling(),
    constraint: Constraint = Constraint(),
    memory: MemoryOptions = MemoryOptions(),
    verify: VerifyOpt = None,
    seed: SeedOpt = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n", min=1, help="Longest answer for lines that set no max_tokens.")] = 256,
    no_draft: NoDraftOpt = False,
    raw: Annotated[bool, typer.Option("--raw", help="Send plain and JSONL prompts verbatim instead of wrapping them in the model's chat template.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar, notes or summary line.")] = False,
) -> None:
    """Generate for many prompts at once: one JSON line out per input line, with exact speculative decoding.

    The input is one prompt per line, JSONL ({"id", "prompt" or "messages", and optionally "system", "max_tokens", "temperature", "seed", "json_schema", "grammar", "stop"}), or the OpenAI Batch API's request lines ({"custom_id", "method", "url", "body"}, answered with its output lines). Each output line has the input's id (else its line number), the text, the finish reason and the statistics. The flags are the defaults each line may override.

    The pair loads once; up to --parallel prompts generate together, and a prompt goes to the slot that already holds the longest prefix of it (a shared instruction is prefilled once per slot). Drafting remembers: every answer joins the memory the next ones draft from (--memory FILE keeps it for the next run). With -o, lines are appended whole as they finish: Ctrl-C, SIGTERM or a crash loses only the lines in progress, and the same command again does only what is left. A line that cannot be run becomes an error line naming its line number; the exit status is the number of failed lines (at most 100).
    """
    with user_errors():
        flags = RequestFlags.from_flags(draft_max, draft_mode, no_draft, sampling.checked("greedy"), seed=seed,
                                        verify=verify, draft_p_min=draft_p_min, max_tokens=max_tokens,
                                        grammar=constraint.compiled())
        memory = memory.checked()
        text, form, tasks, done, out = _prepare(source, output, raw, quiet)
        todo = _left(tasks, done)
        if not todo:
            if not quiet:
                note(f"all {len(tasks)} lines are in {output} already")
            return
        try:
            def holding(target: Model) -> int | None:
                verbatim = _verbatim(target, text, form, raw, done)
                return held_tokens(todo if verbatim is None else verbatim, target, max_tokens)

            with open_pair(replace(load.for_request(flags, no_draft, quiet, images=True),
                                   sequences=parallel + 1 if parallel > 1 else 1, holding=holding)) as loaded:
                memory.apply(loaded.pair, default_file=False, quiet=quiet)
                verbatim = _verbatim(loaded.pair.target, text, form, raw, done)
                if verbatim is not None:
                    if not quiet:
                        note(f"{loaded.pair.target.path.name} has no chat template; sending the prompts as raw text")
                    todo = verbatim
                defaults = flags.for_pair(loaded)
                if parallel > 1 and not flags.k_given:  # several at once: K by the batch's goodput
                    defaults = replace(defaults, draft_max=AUTO)
                runner = BatchRunner(loaded.pair, parallel, defaults, form, default_name(load), todo)
                failed = _run(runner, todo, out, ordered, form, token_ids, quiet, len(done))
        finally:
            out.close()
    raise typer.Exit(min(failed, MOST_FAILED_STATUS))


def _verbatim(target: Model, text: str, form: str, raw: bool, done: set[str]) -> list[Task] | None:
    """The lines left, read again with plain and JSONL prompts verbatim, where `target` has no chat template to wrap
    them in (None: they stand as read)."""
    if form == OPENAI or raw or target.chat_template() is not None:
        return None
    return _left(read_tasks(text, raw=True)[1], done)


def _left(tasks: list[Task], done: set[str]) -> list[Task]:
    """The tasks whose ids the output does not hold yet."""
    return [task for task in tasks if json.dumps(task.id) not in done]


def _prepare(source: str, output: Path | None, raw: bool,
             quiet: bool) -> tuple[str, str, list[Task], set[str], Output]:
    """The input read and its tasks, the ids the output already holds, and the output opened: each problem one
    line and exit status 2, before any model loads and before anything is written."""
    try:
        data = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()
    except OSError as exc:
        _usage(f"cannot read {source}: {exc.strerror}")
    text, replaced = decode_user_text(data)
    if replaced and not quiet:
        note(f"note: the input is {NOT_UTF8_NOTE}")
    try:
        form, tasks = read_tasks(text, raw)
        if not tasks:
            raise SpecError(f"{source} has no lines to run")
        done = done_ids(output, form) if output is not None else set()
        if output is not None:
            check_resumable(output, done, tasks)
        return text, form, tasks, done, Output(output)
    except SpecError as exc:
        _usage(str(exc))


def _usage(message: str) -> NoReturn:
    error(message)
    raise typer.Exit(EXIT_USAGE)


def _run(runner: BatchRunner, todo: list[Task], out: Output, ordered: bool, form: str, token_ids: bool, quiet: bool,
         skipped: int) -> int:
    """Run the tasks, writing each line as it may be; return how many failed. Ctrl-C or SIGTERM stops at once
    and says what is left."""
    totals = Stats(draft_max=0)
    writer = InOrder(out, todo) if ordered else None
    finished = failed = emitted = 0
    started = time.perf_counter()
    try:
        with BatchBar(len(todo), shown=not quiet) as bar, stop_signals_raise():

            def write(result: Result) -> None:
                nonlocal finished, failed
                line = line_of(result, form, token_ids)
                if writer is not None:
                    writer.write(result.task, line)
                else:
                    out.write(line)
                finished += 1
                failed += result.error is not None
                if result.stats is not None:
                    totals.merge(result.stats)
                bar.update(finished, emitted / (time.perf_counter() - started), _acceptance(totals))

            def stepped(tokens: int) -> None:
                nonlocal emitted
                emitted += tokens

            runner.run(todo, write, stepped)
    except KeyboardInterrupt:
        left = len(todo) - finished
        error(f"interrupted: {finished} of {len(todo)} lines written; the same command again runs the {left} left"
              if out.path is not None else "interrupted")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    if not quiet:
        seconds = time.perf_counter() - started
        parts = [f"{finished} lines" + (f" ({skipped} done before)" if skipped else ""),
                 f"{failed} failed" if failed else "none failed",
                 f"{totals.generated_tokens} tokens in {seconds:.1f} s, {totals.generated_tokens / seconds:.1f} tok/s"]
        if totals.drafted:
            parts.append(f"acceptance {percent(totals.acceptance_rate)} ({totals.accepted}/{totals.drafted})")
        memory = runner.pair.output_memory
        parts.append(f"memory {len(memory.outputs):,} tokens of {memory.documents} outputs")
        note(" · ".join(parts))
    return failed


def _acceptance(totals: Stats) -> float | None:
    return totals.acceptance_rate if totals.drafted else None
