"""The `spec` command line: each command parses, calls the library and hands events to `ui`. The commands
that generate (run, chat, bench) are here, with the options they share in `cli_pair`; `cli_serve` has
`spec serve`, `cli_models` has `spec models …`, `cli_machine` has `doctor` and `worker`.

Library errors (`SpecError`) become one line on stderr and exit status 1, in one place (`cli_base.user_errors`).
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer

from spec_cli import __version__, rpc, ui
from spec_cli import bench as benchmark
from spec_cli import chat as chat_module
from spec_cli.cli_base import EXIT_INTERRUPTED, ThreadsOpt, csv_list, user_errors
from spec_cli.cli_machine import DOCTOR_EXAMPLES, WORKER_EXAMPLES, doctor, worker
from spec_cli.cli_models import models_app
from spec_cli.cli_pair import (CtxOpt, DraftGpuLayersOpt, DraftMaxOpt, DraftModeOpt, DraftOpt, DraftRpcOpt,
                               GpuLayersOpt, LoadOptions, NoDraftOpt, PairOpt, QuietOpt, RpcOpt, TargetOpt,
                               TensorSplitOpt, VerifyOpt, largest_k, open_pair, parse_draft_max,
                               given_draft_mode, loads_draft, or_default, parse_draft_mode,
                               parse_verify_rule)
from spec_cli.cli_serve import SERVE_EXAMPLES, serve
from spec_cli.errors import SpecError
from spec_cli.pair import Pair, needs_draft_model
from spec_cli.sampling import SAMPLING_ORDER, SAMPLING_PRESETS, SamplingParams, settle
from spec_cli.verification import DEFAULT_VERIFY
from spec_cli.text import NOT_UTF8_NOTE, decode_user_text

app = typer.Typer(
    help="Exact speculative decoding for GGUF models: a small draft model proposes, the target verifies.",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

DraftPMinOpt = Annotated[float, typer.Option("--draft-p-min", min=0.0, max=0.99, help="Confidence stop: the draft model stops a round when its top probability falls below this (0: off).")]
# Sampling, with llama.cpp's meaning and defaults; None means "not given", so the --sampling preset decides.
TempOpt = Annotated[Optional[float], typer.Option("--temp", min=0.0, help=f"Temperature, applied last as in llama.cpp ({SAMPLING_ORDER}); 0 is greedy (output identical to the target alone).", show_default=False)]
TopKOpt = Annotated[Optional[int], typer.Option("--top-k", min=0, help="Keep the k most likely tokens (0: off) (default: 40).", show_default=False)]
TopPOpt = Annotated[Optional[float], typer.Option("--top-p", min=0.0, max=1.0, help="Keep the smallest set of tokens with this much probability, at temperature 1 (default: 0.95).", show_default=False)]
MinPOpt = Annotated[Optional[float], typer.Option("--min-p", min=0.0, max=1.0, help="Drop tokens below this fraction of the top token's probability, at temperature 1 (default: 0.05).", show_default=False)]
RepeatPenaltyOpt = Annotated[Optional[float], typer.Option("--repeat-penalty", min=0.0, help="Divide the logits of tokens seen in the last --repeat-last-n (multiply negative ones); 1: off (default: 1).", show_default=False)]
RepeatLastNOpt = Annotated[Optional[int], typer.Option("--repeat-last-n", min=0, help="How many recent tokens, prompt included, the penalties look at; 0: off (default: 64).", show_default=False)]
PresencePenaltyOpt = Annotated[Optional[float], typer.Option("--presence-penalty", help="Subtract from the logit of every token seen in the last --repeat-last-n (default: 0).", show_default=False)]
FrequencyPenaltyOpt = Annotated[Optional[float], typer.Option("--frequency-penalty", help="Subtract this times the number of times a token was seen in the last --repeat-last-n (default: 0).", show_default=False)]
SamplingPresetOpt = Annotated[Optional[str], typer.Option("--sampling", help="greedy (temperature 0 unless --temp is given) or model (what the target's GGUF recommends, else llama.cpp's temp 0.8, top-k 40, top-p 0.95, min-p 0.05); flags given always win (default: greedy for run, model for chat).", show_default=False)]
SeedOpt = Annotated[Optional[int], typer.Option("--seed", help="Random seed; the same seed gives the same text (default: random).", show_default=False)]
MaxTokensOpt = Annotated[int, typer.Option("--max-tokens", "-n", min=1, help="Stop after this many generated tokens.")]

RUN_EXAMPLES = """\
Examples:

  spec run "Explain speculative decoding in one sentence."

  spec run --temp 0.7 --seed 1 -n 200 "Write a haiku about caches."

  spec run --sampling model --repeat-penalty 1.1 "Tell me a story."

  echo "Summarise: ..." | spec run - > summary.txt

  spec run --target big.gguf --draft small.gguf -k 6 "Hello"

  spec run -k auto --draft-mode hybrid "Rewrite this paragraph: ..."

  spec run --target model.gguf --draft-mode ngram "Fix the typos: ..."

  spec run --no-draft --json "Hello" | jq .stats.tokens_per_second

  spec run --target 70b.gguf --draft 1b.gguf --rpc 192.168.1.7:50052,192.168.1.8:50052 "Hello"   # spec worker on each
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


app.add_typer(models_app, name="models")
app.command(epilog=DOCTOR_EXAMPLES)(doctor)
app.command(epilog=WORKER_EXAMPLES)(worker)
app.command(epilog=SERVE_EXAMPLES)(serve)


def _temperature(value: str) -> float:
    try:
        temperature = float(value)
    except ValueError:
        temperature = -1.0
    if not 0 <= temperature < float("inf"):
        raise SpecError(f"--temp must be a number >= 0, got {value!r}")
    return temperature


def _sampling_preset(value: str | None, default: str) -> str:
    preset = value or default
    if preset not in SAMPLING_PRESETS:
        raise SpecError(f"unknown --sampling {preset!r}; choose one of: {', '.join(SAMPLING_PRESETS)}")
    return preset


def _sampling_flags(temp: float | None, top_k: int | None, top_p: float | None, min_p: float | None,
                    repeat_penalty: float | None, repeat_last_n: int | None, presence_penalty: float | None,
                    frequency_penalty: float | None) -> dict[str, float | int]:
    """The sampling flags the user gave, by SamplingParams field (checked now, before any model loads)."""
    flags = {"temperature": temp, "top_k": top_k, "top_p": top_p, "min_p": min_p, "repeat_penalty": repeat_penalty,
             "repeat_last_n": repeat_last_n, "presence_penalty": presence_penalty,
             "frequency_penalty": frequency_penalty}
    given = {name: value for name, value in flags.items() if value is not None}
    SamplingParams(**given)
    return given


def _settle(pair: Pair, preset: str, given: dict[str, float | int]) -> SamplingParams:
    """The --sampling preset (with the target's recommended settings) under the flags the user gave."""
    return settle(preset, pair.recommended_sampling(), given)


def _read_prompt(prompt: str | None, quiet: bool) -> str:
    """The prompt argument, or stdin when the argument is `-`, or absent with stdin not a terminal."""
    if prompt == "-" or (prompt is None and not sys.stdin.isatty()):
        text, replaced = decode_user_text(sys.stdin.buffer.read())
    elif prompt is None:
        raise SpecError('no prompt: give one as an argument (spec run "…") or pipe it in (… | spec run -)')
    else:
        text, replaced = decode_user_text(prompt)
    if replaced and not quiet:
        ui.note(f"note: the prompt is {NOT_UTF8_NOTE}")
    return text


@app.command(epilog=RUN_EXAMPLES)
def run(
    prompt: Annotated[Optional[str], typer.Argument(help="The prompt; '-' or nothing reads it from stdin.", show_default=False)] = None,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    pair: PairOpt = None,
    draft_max: DraftMaxOpt = None,
    draft_mode: DraftModeOpt = None,
    draft_p_min: DraftPMinOpt = 0.0,
    sampling_preset: SamplingPresetOpt = None,
    temp: TempOpt = None,
    top_k: TopKOpt = None,
    top_p: TopPOpt = None,
    min_p: MinPOpt = None,
    repeat_penalty: RepeatPenaltyOpt = None,
    repeat_last_n: RepeatLastNOpt = None,
    presence_penalty: PresencePenaltyOpt = None,
    frequency_penalty: FrequencyPenaltyOpt = None,
    verify: VerifyOpt = DEFAULT_VERIFY,
    seed: SeedOpt = None,
    max_tokens: MaxTokensOpt = 256,
    ctx: CtxOpt = None,
    threads: ThreadsOpt = None,
    gpu_layers: GpuLayersOpt = None,
    draft_gpu_layers: DraftGpuLayersOpt = None,
    rpc_workers: RpcOpt = None,
    draft_rpc: DraftRpcOpt = None,
    tensor_split: TensorSplitOpt = None,
    no_draft: NoDraftOpt = False,
    raw: Annotated[bool, typer.Option("--raw", help="Send the prompt verbatim instead of wrapping it in the model's chat template.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object: text, token ids, finish reason, statistics.")] = False,
    quiet: QuietOpt = False,
) -> None:
    """Generate from a prompt with speculative decoding, streaming tokens and acceptance statistics.

    Greedy output (the default, --temp 0) is token for token what the target alone would write; sampled output follows the target's distribution exactly. On a terminal, draft tokens the target accepted are shown in cyan.

    Sampling means what it means in llama.cpp, with its defaults: penalties → top-k → top-p → min-p → temperature.
    """
    with user_errors():
        text = _read_prompt(prompt, quiet)
        given = _sampling_flags(temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n, presence_penalty,
                                frequency_penalty)
        verify, preset = parse_verify_rule(verify), _sampling_preset(sampling_preset, "greedy")
        mode = given_draft_mode(draft_mode, no_draft)
        k = None if draft_max is None else parse_draft_max(draft_max)
        options = LoadOptions(target, draft, pair, no_draft, quiet, ctx, threads, gpu_layers, draft_gpu_layers,
                              needs_draft=loads_draft(mode), max_draft=largest_k([k]),
                              rpc=rpc_workers, draft_rpc=draft_rpc, tensor_split=tensor_split)
        with open_pair(options) as loaded:
            if not raw and not loaded.pair.has_chat_template:
                if not quiet:
                    ui.note(f"{loaded.pair.target.path.name} has no chat template; sending the prompt as raw text")
                raw = True
            sampling = _settle(loaded.pair, preset, given)
            generation = loaded.pair.generate(text, sampling=sampling, seed=seed, max_tokens=max_tokens, raw=raw,
                                              draft_max=or_default(k, loaded.draft_max), draft_mode=mode,
                                              draft_p_min=draft_p_min, verify=verify)
            _stream(generation, ui.make_view(as_json, quiet))


BENCH_EXAMPLES = """\
Examples:

  spec bench

  spec bench -k 1,2,4,8,auto --repeat 3 --plot k-sweep.png

  spec bench --task chat,rewrite --modes model,ngram,hybrid -k 4,6,auto

  spec bench --temp 0.7,1.0 --verify token,block -k 4,6

  spec bench --target big.gguf --draft small.gguf --prompts my-prompts.jsonl --json results.json

  spec bench --rpc 192.168.1.7:50052,192.168.1.8:50052 -k 4,8   # local and over RPC, side by side
"""


@app.command(epilog=BENCH_EXAMPLES)
def bench(
    target: TargetOpt = None,
    draft: DraftOpt = None,
    pair: PairOpt = None,
    prompts_file: Annotated[Optional[Path], typer.Option("--prompts", help="Your prompts: one per line, or JSON Lines with a \"prompt\" field.", show_default=False)] = None,
    task: Annotated[str, typer.Option("--task", help=f"Built-in prompts when --prompts is not given: {', '.join(benchmark.TASKS)}. Several, comma-separated, are measured in one run, each against the target alone on its own prompts.")] = "mixed",
    ks: Annotated[Optional[str], typer.Option("--k", "-k", help="Draft lengths to compare, comma-separated numbers or auto (default: the pair's recommended K, and auto).", show_default=False)] = None,
    modes: Annotated[Optional[str], typer.Option("--modes", help="Draft modes to compare, comma-separated: model, mtp, ngram, hybrid (default: the draft model, or the target's MTP head when there is no draft).", show_default=False)] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n", min=1, help="Tokens generated per run.")] = 128,
    repeat: Annotated[int, typer.Option("--repeat", "-r", min=1, help="Runs of each prompt in each configuration.")] = 1,
    temps: Annotated[str, typer.Option("--temp", help="Temperatures to compare, comma-separated; 0 is greedy. Each has its own target-alone baseline.")] = "0",
    verify: Annotated[str, typer.Option("--verify", help="Verification rules to compare at temperatures above 0, comma-separated: block, token.")] = DEFAULT_VERIFY,
    json_file: Annotated[Optional[Path], typer.Option("--json", help="Also write every figure (and each run's statistics) to this JSON file.", show_default=False)] = None,
    plot_file: Annotated[Optional[Path], typer.Option("--plot", help="Write a PNG of tokens/s and acceptance against K (needs matplotlib: pip install 'spec-cli[plot]').", show_default=False)] = None,
    ctx: CtxOpt = None,
    threads: ThreadsOpt = None,
    gpu_layers: GpuLayersOpt = None,
    draft_gpu_layers: DraftGpuLayersOpt = None,
    rpc_workers: RpcOpt = None,
    draft_rpc: DraftRpcOpt = None,
    tensor_split: TensorSplitOpt = None,
) -> None:
    """Measure speculative configurations against the target alone on the same pair, interleaved.

    Reports median and min-max tokens/s (decoding only), speed-up against the target alone in the same run, the speed-up the loop's cost model predicts from the measured acceptance and the run's costs, acceptance by draft position, and where the time goes.

    With --rpc every configuration runs twice, the target on this machine and split over the workers (the draft stays here), each against the target alone in the same place, with the time of one target pass.
    """
    with user_errors():
        mode_list = csv_list(modes, parse=parse_draft_mode) if modes else []
        prompts = ({None: benchmark.load_prompts(prompts_file, notify=ui.note)} if prompts_file
                   else benchmark.builtin_prompt_sets(list(dict.fromkeys(csv_list(task, parse=str)))))
        temperatures = csv_list(temps, parse=_temperature)
        rules = csv_list(verify, parse=parse_verify_rule)
        k_given = csv_list(ks, parse=parse_draft_max) if ks else []
        options = LoadOptions(target, draft, pair, False, False, ctx, threads, gpu_layers, draft_gpu_layers,
                              needs_draft=not mode_list or any(needs_draft_model(mode) for mode in mode_list),
                              max_draft=largest_k(k_given), rpc=rpc_workers, draft_rpc=draft_rpc,
                              tensor_split=tensor_split)
        # With --rpc, the same files twice: local, and the target split over the workers, side by side.
        places = ["local", "rpc"] if rpc_workers else [None]
        with open_pair(replace(options, local_only=bool(rpc_workers))) as loaded, \
                (open_pair(options) if rpc_workers else nullcontext()) as remote:
            k_list = k_given or list(dict.fromkeys([loaded.draft_max, "auto"]))
            configs = benchmark.configurations(mode_list or [loaded.pair.default_draft_mode], k_list, temperatures,
                                               rules, list(prompts), places)
            raw = not loaded.pair.has_chat_template
            runs = sum(len(prompts[c.task]) for c in configs) * repeat
            with ui.progress(runs) as advance:
                sides = benchmark.compare(loaded.pair, configs, prompts, max_tokens=max_tokens, repeat=repeat,
                                          raw=raw, progress=advance, rpc_pair=remote.pair if remote else None)
            settings = {"target": str(loaded.pair.target.path),
                        "rpc": csv_list(rpc_workers, str) if rpc_workers else [],
                        "draft": str(loaded.pair.draft.path) if loaded.pair.draft else None,
                        "prompts": sum(map(len, prompts.values())), "task": None if prompts_file else task,
                        "max_tokens": max_tokens, "repeat": repeat, "temperatures": temperatures,
                        "threads": threads or os.cpu_count()}
            result = benchmark.report(sides, settings)
            ui.show_comparison(result)
            if json_file is not None:
                _write(json_file, json.dumps(result, indent=2) + "\n")
            if plot_file is not None:
                benchmark.plot(result, plot_file)
                ui.note(f"plot written to {plot_file}")


def _write(path: Path, text: str) -> None:
    """Write a whole file under a temporary name first, so an interrupted run leaves no half file."""
    partial = path.with_name(f".{path.name}.part")
    try:
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise SpecError(f"cannot write {path}: {exc.strerror}") from exc
    ui.note(f"figures written to {path}")


CHAT_EXAMPLES = """\
Examples:

  spec chat

  spec chat --system "You are a terse assistant." --temp 0.7

  spec chat --pair qwen2.5-7b -k auto

  printf 'Hi!\\nWhat is 2+2?\\n' | spec chat > answers.txt

  spec chat --pair big --rpc 192.168.1.7:50052 --gpu-layers 60   # 60 layers on the worker, the rest here
"""


@app.command(epilog=CHAT_EXAMPLES)
def chat(
    target: TargetOpt = None,
    draft: DraftOpt = None,
    pair: PairOpt = None,
    system: Annotated[Optional[str], typer.Option("--system", "-s", help="System message.", show_default=False)] = None,
    chat_format: Annotated[Optional[str], typer.Option("--chat-format", help="Chat template when the model has none: chatml, or a Jinja template file.", show_default=False)] = None,
    draft_max: DraftMaxOpt = None,
    draft_mode: DraftModeOpt = None,
    draft_p_min: DraftPMinOpt = 0.0,
    sampling_preset: SamplingPresetOpt = None,
    temp: TempOpt = None,
    top_k: TopKOpt = None,
    top_p: TopPOpt = None,
    min_p: MinPOpt = None,
    repeat_penalty: RepeatPenaltyOpt = None,
    repeat_last_n: RepeatLastNOpt = None,
    presence_penalty: PresencePenaltyOpt = None,
    frequency_penalty: FrequencyPenaltyOpt = None,
    verify: VerifyOpt = DEFAULT_VERIFY,
    seed: SeedOpt = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n", min=1, help="Longest answer, in tokens.")] = 512,
    ctx: CtxOpt = None,
    threads: ThreadsOpt = None,
    gpu_layers: GpuLayersOpt = None,
    draft_gpu_layers: DraftGpuLayersOpt = None,
    rpc_workers: RpcOpt = None,
    draft_rpc: DraftRpcOpt = None,
    tensor_split: TensorSplitOpt = None,
    no_draft: NoDraftOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Talk with a model in the terminal, with speculative decoding and per-answer statistics.

    Each turn evaluates only its new tokens: both models keep the conversation in their caches. Type /help for commands. When stdin is not a terminal, each input line is one message and answers are written plainly.

    Sampling uses the settings the target's GGUF recommends (--sampling model), else llama.cpp's defaults, in llama.cpp's order: penalties → top-k → top-p → min-p → temperature.
    """
    with user_errors():
        mode = given_draft_mode(draft_mode, False)
        k = None if draft_max is None else parse_draft_max(draft_max)
        given = _sampling_flags(temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n, presence_penalty,
                                frequency_penalty)
        verify, preset = parse_verify_rule(verify), _sampling_preset(sampling_preset, "model")
        template = chat_module.chat_template(chat_format)
        options = LoadOptions(target, draft, pair, no_draft, quiet, ctx, threads, gpu_layers, draft_gpu_layers,
                              needs_draft=loads_draft(mode), max_draft=largest_k([k]),
                              rpc=rpc_workers, draft_rpc=draft_rpc, tensor_split=tensor_split)
        with open_pair(options) as loaded:
            # Fail now rather than at the first message when there is no template to use.
            loaded.pair.target.format_chat([{"role": "user", "content": "hi"}], template=template)
            settings = chat_module.Settings(
                sampling=_settle(loaded.pair, preset, given),
                draft_max=or_default(k, loaded.draft_max), draft_mode=mode or loaded.pair.default_draft_mode,
                draft_p_min=draft_p_min,
                max_tokens=max_tokens, use_draft=not no_draft, verify=verify)
            session = chat_module.ChatSession(loaded.pair, settings, system=system, seed=seed, template=template)
            ui.chat_loop(session, interactive=sys.stdin.isatty(), quiet=quiet)


def _stream(generation, view: ui.View) -> None:
    """Feed the generation's events to the view; Ctrl-C keeps the text so far and still reports."""
    events = iter(generation)
    view.start(generation)

    def worker_lost(line: str) -> None:
        generation.finish_reason = "error"
        view.finish(generation)  # the text so far, as with Ctrl-C
        ui.error(line)

    try:
        with rpc.on_worker_lost(worker_lost):
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
    except SpecError:
        events.close()
        view.finish(generation)  # the text so far stays on screen; the error follows in one line
        raise
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
