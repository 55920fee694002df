"""The `spec` command line: each command parses, calls the library and hands events to `ui`.

Library errors (`SpecError`) become one line on stderr and exit status 1, in one place (`_user_errors`).
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Iterator, Optional

import typer

from spec_cli import __version__, registry, ui
from spec_cli import bench as benchmark
from spec_cli.errors import SpecError
from spec_cli.llama import supports_gpu_offload
from spec_cli.pair import DEFAULT_CTX, load_pair
from spec_cli.sampling import SamplingParams

DEFAULT_DRAFT_MAX = 4
EXIT_USER_ERROR = 1
EXIT_INTERRUPTED = 130

app = typer.Typer(
    help="Exact speculative decoding for GGUF models: a small draft model proposes, the target verifies.",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

# Options shared by the commands that load a pair, declared once.
TargetOpt = Annotated[Optional[Path], typer.Option("--target", "-t", help="Target GGUF file (the model you want output from).", show_default=False)]
DraftOpt = Annotated[Optional[Path], typer.Option("--draft", "-d", help="Draft GGUF file (small, same vocabulary as the target).", show_default=False)]
PairOpt = Annotated[Optional[str], typer.Option("--pair", "-p", help="A named pair from models.toml (default: the registry's default pair).", show_default=False)]
DraftMaxOpt = Annotated[Optional[int], typer.Option("--draft-max", "-k", min=0, max=64, help="Draft tokens per round, K (default: the pair's, else 4).", show_default=False)]
TempOpt = Annotated[float, typer.Option("--temp", min=0.0, help="Temperature; 0 is greedy (output identical to the target alone).")]
TopKOpt = Annotated[int, typer.Option("--top-k", min=0, help="Keep the k most likely tokens (0: off).")]
TopPOpt = Annotated[float, typer.Option("--top-p", min=0.0, max=1.0, help="Keep the smallest set of tokens with this much probability.")]
MinPOpt = Annotated[float, typer.Option("--min-p", min=0.0, max=1.0, help="Drop tokens below this fraction of the top token's probability.")]
SeedOpt = Annotated[Optional[int], typer.Option("--seed", help="Random seed; the same seed gives the same text (default: random).", show_default=False)]
MaxTokensOpt = Annotated[int, typer.Option("--max-tokens", "-n", min=1, help="Stop after this many generated tokens.")]
CtxOpt = Annotated[Optional[int], typer.Option("--ctx", min=16, help=f"Context size in tokens (default: the pair's, else {DEFAULT_CTX}).", show_default=False)]
ThreadsOpt = Annotated[Optional[int], typer.Option("--threads", min=1, help="CPU threads per model (default: all cores).", show_default=False)]
GpuLayersOpt = Annotated[int, typer.Option("--gpu-layers", min=-1, help="Target layers to put on the GPU (-1: all).")]
DraftGpuLayersOpt = Annotated[int, typer.Option("--draft-gpu-layers", min=-1, help="Draft layers to put on the GPU (-1: all).")]
NoDraftOpt = Annotated[bool, typer.Option("--no-draft", help="Run the target alone through the same code path, for comparison.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No statistics, no notes: only the text.")]

RUN_EXAMPLES = """\
Examples:

  spec run "Explain speculative decoding in one sentence."

  spec run --temp 0.7 --seed 1 -n 200 "Write a haiku about caches."

  echo "Summarise: ..." | spec run - > summary.txt

  spec run --target big.gguf --draft small.gguf -k 6 "Hello"

  spec run --no-draft --json "Hello" | jq .stats.tokens_per_second
"""


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"spec-cli {__version__}")
        raise typer.Exit()


@app.callback()
def spec(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")] = False,
) -> None:
    """Exact speculative decoding for GGUF models: a small draft model proposes, the target verifies."""


@dataclass(frozen=True)
class ModelChoice:
    """The files to load and the defaults that came with them."""

    target: Path
    draft: Path | None
    draft_max: int
    ctx: int


@contextmanager
def _user_errors() -> Iterator[None]:
    """Turn the library's one-line errors into one line on stderr and a non-zero exit."""
    try:
        yield
    except SpecError as exc:
        ui.error(str(exc))
        raise typer.Exit(EXIT_USER_ERROR) from None


def _read_prompt(prompt: str | None) -> str:
    """The prompt argument, or stdin when the argument is `-`, or absent with stdin not a terminal."""
    if prompt == "-" or (prompt is None and not sys.stdin.isatty()):
        return sys.stdin.read()
    if prompt is None:
        raise SpecError('no prompt: give one as an argument (spec run "…") or pipe it in (… | spec run -)')
    return prompt


def _choose_models(target: Path | None, draft: Path | None, pair: str | None, no_draft: bool,
                   quiet: bool) -> ModelChoice:
    if target is None and draft is not None:
        raise SpecError("--draft needs --target")
    if target is not None:
        if pair is not None:
            raise SpecError("give either --pair or --target/--draft, not both")
        if draft is None and not no_draft:
            raise SpecError("--target needs a --draft (or --no-draft to run the target alone)")
        return ModelChoice(target, None if no_draft else draft, DEFAULT_DRAFT_MAX, DEFAULT_CTX)
    models = registry.load_registry()
    spec = models.get(pair or models.default)
    notify = (lambda _m: None) if quiet else ui.note
    target_path, draft_path = registry.resolve(spec, notify=notify)
    return ModelChoice(target_path, None if no_draft else draft_path, spec.draft_max, spec.ctx)


def _warn_cpu_only(gpu_layers: int, draft_gpu_layers: int) -> None:
    if (gpu_layers or draft_gpu_layers) and not supports_gpu_offload():
        ui.note("warning: this llama-cpp-python build has no GPU support; running on the CPU "
                "(spec doctor says how to install a CUDA or Metal build)")


@app.command(epilog=RUN_EXAMPLES)
def run(
    prompt: Annotated[Optional[str], typer.Argument(help="The prompt; '-' or nothing reads it from stdin.", show_default=False)] = None,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    pair: PairOpt = None,
    draft_max: DraftMaxOpt = None,
    temp: TempOpt = 0.0,
    top_k: TopKOpt = 0,
    top_p: TopPOpt = 1.0,
    min_p: MinPOpt = 0.0,
    seed: SeedOpt = None,
    max_tokens: MaxTokensOpt = 256,
    ctx: CtxOpt = None,
    threads: ThreadsOpt = None,
    gpu_layers: GpuLayersOpt = 0,
    draft_gpu_layers: DraftGpuLayersOpt = 0,
    no_draft: NoDraftOpt = False,
    raw: Annotated[bool, typer.Option("--raw", help="Send the prompt verbatim instead of wrapping it in the model's chat template.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object: text, token ids, finish reason, statistics.")] = False,
    quiet: QuietOpt = False,
) -> None:
    """Generate from a prompt with speculative decoding, streaming tokens and acceptance statistics.

    Greedy output (the default, --temp 0) is token for token what the target alone would write; sampled output follows the target's distribution exactly. On a terminal, draft tokens the target accepted are shown in cyan.
    """
    with _user_errors():
        text = _read_prompt(prompt)
        sampling = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p)
        choice = _choose_models(target, draft, pair, no_draft, quiet)
        _warn_cpu_only(gpu_layers, draft_gpu_layers)
        with load_pair(choice.target, choice.draft, n_ctx=ctx or choice.ctx, n_threads=threads,
                       gpu_layers=gpu_layers, draft_gpu_layers=draft_gpu_layers) as loaded:
            if not raw and not loaded.has_chat_template:
                if not quiet:
                    ui.note(f"{choice.target.name} has no chat template; sending the prompt as raw text")
                raw = True
            generation = loaded.generate(text, sampling=sampling, seed=seed, max_tokens=max_tokens, raw=raw,
                                         draft_max=choice.draft_max if draft_max is None else draft_max)
            _stream(generation, ui.make_view(as_json, quiet))


BENCH_EXAMPLES = """\
Examples:

  spec bench

  spec bench -k 6 -n 256 --repeat 3

  spec bench --target big.gguf --draft small.gguf
"""


@app.command(epilog=BENCH_EXAMPLES)
def bench(
    target: TargetOpt = None,
    draft: DraftOpt = None,
    pair: PairOpt = None,
    draft_max: DraftMaxOpt = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n", min=1, help="Tokens generated per run.")] = 128,
    repeat: Annotated[int, typer.Option("--repeat", "-r", min=1, help="Runs of each prompt on each side.")] = 1,
    ctx: CtxOpt = None,
    threads: ThreadsOpt = None,
    gpu_layers: GpuLayersOpt = 0,
    draft_gpu_layers: DraftGpuLayersOpt = 0,
) -> None:
    """Measure speculative against target-only decoding on the same pair, runs interleaved, ratio printed.

    Greedy, on a built-in set of prompts; tokens/s counts decoding only (prompt processing excluded).
    """
    with _user_errors():
        choice = _choose_models(target, draft, pair, no_draft=False, quiet=False)
        _warn_cpu_only(gpu_layers, draft_gpu_layers)
        with load_pair(choice.target, choice.draft, n_ctx=ctx or choice.ctx, n_threads=threads,
                       gpu_layers=gpu_layers, draft_gpu_layers=draft_gpu_layers) as loaded:
            k = choice.draft_max if draft_max is None else draft_max
            with ui.progress(2 * repeat * len(benchmark.DEFAULT_PROMPTS)) as advance:
                alone, speculative = benchmark.compare(loaded, k, max_tokens=max_tokens, repeat=repeat,
                                                       raw=not loaded.has_chat_template, progress=advance)
            ui.show_comparison(alone, speculative)


def _stream(generation, view: ui.View) -> None:
    """Feed the generation's events to the view; Ctrl-C keeps the text so far and still reports."""
    events = iter(generation)
    view.start(generation)
    try:
        for event in events:
            view.token(event)
    except KeyboardInterrupt:
        events.close()
        view.finish(generation)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except BrokenPipeError:
        events.close()
        _silence_stdout()
        return
    view.finish(generation)


def _silence_stdout() -> None:
    """The reader went away (`spec run … | head`): drop further output so Python's exit flush is quiet."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def main() -> None:
    try:
        app()
    except BrokenPipeError:
        _silence_stdout()
