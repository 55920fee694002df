"""`spec bench`: speculative configurations against the target alone on the same pair, interleaved."""

from __future__ import annotations

import json
import os
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer

from spec_cli.bench import speedup as benchmark
from spec_cli.cli.common import csv_list, user_errors
from spec_cli.cli.options import LoadOptions, largest_k, loads_pair, open_pair, prompts_holding
from spec_cli.bench.concurrency import compare_concurrency
from spec_cli.bench.concurrency import report as concurrency_report
from spec_cli.decoding.scheduler import MAX_SEQUENCES
from spec_cli.decoding.verification import DEFAULT_VERIFY
from spec_cli.drafting.modes import MODES, mode
from spec_cli.errors import SpecError
from spec_cli.llama.kernels import cpu_threads
from spec_cli.request import AUTO, GenerationRequest, draft_max_from_text
from spec_cli.terminal.output import note
from spec_cli.terminal.progress import progress
from spec_cli.terminal.tables import show_comparison, show_concurrency

BENCH_EXAMPLES = """\
Examples:

  spec bench

  spec bench -k 1,2,4,8,auto --repeat 3 --plot k-sweep.png

  spec bench --task chat,rewrite --modes model,ngram,hybrid -k 4,6,auto

  spec bench --temp 0.7,1.0 --verify token,block -k 4,6

  spec bench --target big.gguf --draft small.gguf --prompts my-prompts.jsonl --json results.json

  spec bench --rpc 192.168.1.7:50052,192.168.1.8:50052 -k 4,8   # local and over RPC, side by side

  spec bench --concurrency 1,2,4 -n 64        # 1, 2, 4 clients at once: the default beside every pinned mode
"""


@loads_pair
def bench(
    load: LoadOptions = LoadOptions(),
    prompts_file: Annotated[Optional[Path], typer.Option("--prompts", help="Your prompts: one per line, or JSON Lines with a \"prompt\" field.", show_default=False)] = None,
    task: Annotated[str, typer.Option("--task", help=f"Built-in prompts when --prompts is not given: {', '.join(benchmark.TASKS)}. Several, comma-separated, are measured in one run, each against the target alone on its own prompts.")] = "mixed",
    ks: Annotated[Optional[str], typer.Option("--k", "-k", help="Draft lengths to compare, comma-separated numbers or auto (default: the pair's recommended K, and auto).", show_default=False)] = None,
    modes: Annotated[Optional[str], typer.Option("--modes", help=f"Draft modes to compare, comma-separated: {', '.join(m for m in MODES if m != 'none')} (default: every way this pair allows, the default hybrid beside each mode it chooses among).", show_default=False)] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n", min=1, help="Tokens generated per run.")] = 128,
    repeat: Annotated[int, typer.Option("--repeat", "-r", min=1, help="Runs of each prompt in each configuration (2 or more: the default's ratio to the best pinned mode is also given held out, the best chosen on half the rounds and read on the others).")] = 1,
    temps: Annotated[str, typer.Option("--temp", help="Temperatures to compare, comma-separated; 0 is greedy. Each has its own target-alone baseline.")] = "0",
    verify: Annotated[str, typer.Option("--verify", help="Verification rules to compare at temperatures above 0, comma-separated: block, token, gumbel.")] = DEFAULT_VERIFY,
    json_file: Annotated[Optional[Path], typer.Option("--json", help="Also write every figure (and each run's statistics) to this JSON file.", show_default=False)] = None,
    plot_file: Annotated[Optional[Path], typer.Option("--plot", help="Write a PNG of tokens/s and acceptance against K (needs matplotlib: pip install 'spec-cli[plot]').", show_default=False)] = None,
    concurrency: Annotated[Optional[str], typer.Option("--concurrency", "-c", metavar="N[,N]", help="Instead, clients at once, comma-separated (e.g. 1,2,4,8): at each level that many clients send every prompt, each its next as soon as its answer is in, through one verify pass a step, for the --modes given (default: the default drafting and every mode it chooses among) and the target alone side by side, at the first -k (default auto: K by the batch's goodput); aggregate tok/s, its ratio to the target alone and to the best side, time to first token and per token (p50/p95), mean K, acceptance.", show_default=False)] = None,
) -> None:
    """Measure speculative configurations against the target alone on the same pair, interleaved.

    Reports median and min-max tokens/s (decoding only), speed-up against the target alone in the same run, the speed-up the loop's cost model predicts from the measured acceptance and the run's costs, acceptance by draft position, and where the time goes.

    With --rpc every configuration runs twice, the target on this machine and split over the workers (the draft stays here), each against the target alone in the same place, with the time of one target pass.

    With --concurrency, N clients send the prompts back to back, run as `spec serve --parallel N` runs them, for each drafting mode and the target alone.
    """
    with user_errors():
        if concurrency is not None:
            _concurrency(load, csv_list(concurrency, parse=_level), prompts_file, task, ks, modes, max_tokens, repeat,
                         json_file)
            return
        mode_list = csv_list(modes, parse=_drafting_mode) if modes else []
        prompts = ({None: benchmark.load_prompts(prompts_file, notify=note)} if prompts_file
                   else benchmark.builtin_prompt_sets(list(dict.fromkeys(csv_list(task, parse=str)))))
        temperatures = csv_list(temps, parse=_temperature)
        rules = csv_list(verify, parse=lambda rule: GenerationRequest(verify=rule).verify)
        k_given = csv_list(ks, parse=lambda k: GenerationRequest(draft_max=draft_max_from_text(k)).draft_max) if ks else []
        options = replace(load, needs_draft=not mode_list or any(MODES[mode].loads_draft for mode in mode_list),
                          max_draft=largest_k(k_given),
                          holding=prompts_holding([text for texts in prompts.values() for text in texts], False,
                                                  max_tokens))
        # With --rpc, the same files twice: local, and the target split over the workers, side by side.
        places = ["local", "rpc"] if load.rpc else [None]
        with open_pair(replace(options, local_only=bool(load.rpc))) as loaded, \
                (open_pair(options) if load.rpc else nullcontext()) as remote:
            k_list = k_given or list(dict.fromkeys([loaded.draft_max, "auto"]))
            configs = benchmark.configurations(mode_list or list(loaded.pair.drafting_modes), k_list, temperatures,
                                               rules, list(prompts), places)
            raw = not loaded.pair.has_chat_template
            runs = sum(len(prompts[c.task]) for c in configs) * repeat
            with progress(runs) as advance:
                sides = benchmark.compare(loaded.pair, configs, prompts, max_tokens=max_tokens, repeat=repeat,
                                          raw=raw, progress=advance, rpc_pair=remote.pair if remote else None)
            settings = {"target": str(loaded.pair.target.path),
                        "rpc": csv_list(load.rpc, str) if load.rpc else [],
                        "draft": str(loaded.pair.draft.path) if loaded.pair.draft else None,
                        "prompts": sum(map(len, prompts.values())), "task": None if prompts_file else task,
                        "max_tokens": max_tokens, "repeat": repeat, "temperatures": temperatures,
                        "threads": load.threads or cpu_threads()}
            result = benchmark.report(sides, settings, repeat)
            show_comparison(result)
            if json_file is not None:
                _write(json_file, json.dumps(result, indent=2) + "\n")
            if plot_file is not None:
                benchmark.plot(result, plot_file)
                note(f"plot written to {plot_file}")


def _concurrency(load: LoadOptions, levels: list[int], prompts_file: Path | None, task: str, ks: str | None,
                 modes: str | None, max_tokens: int, repeat: int, json_file: Path | None) -> None:
    """`--concurrency`: each level's batches for every drafting mode compared and the target alone, side by side."""
    mode_list = csv_list(modes, parse=_drafting_mode) if modes else []
    k = csv_list(ks, parse=lambda text: GenerationRequest(draft_max=draft_max_from_text(text)).draft_max)[0] if ks \
        else AUTO
    needs_draft = not mode_list or any(MODES[name].loads_draft for name in mode_list)
    texts = benchmark.load_prompts(prompts_file, notify=note) if prompts_file else benchmark.builtin_prompts(task)
    with open_pair(replace(load, needs_draft=needs_draft, max_draft=largest_k([k]),
                           holding=prompts_holding(texts, False, max_tokens))) as loaded:
        pair = loaded.pair
        compared = [name for name in mode_list if name != "none"] or [
            pair.default_draft_mode, *(name for name in pair.drafting_modes if name != pair.default_draft_mode)]
        prompts = [pair.prompt_tokens(text, raw=not pair.has_chat_template) for text in texts]
        sides = [*(GenerationRequest(draft_max=k, draft_mode=name, max_tokens=max_tokens) for name in compared),
                 GenerationRequest(draft_max=0, draft_mode="none", max_tokens=max_tokens)]
        with progress(len(sides) * (repeat * len(levels) + 1)) as advance:
            batches = compare_concurrency(pair, prompts, levels, sides, repeat, progress=advance)
        result = {**concurrency_report(batches),
                  "settings": {"target": str(pair.target.path), "draft": str(pair.draft.path) if pair.draft else None,
                               "draft_modes": compared, "draft_max": k, "max_tokens": max_tokens, "repeat": repeat,
                               "prompts": len(prompts), "threads": load.threads or cpu_threads()}}
        show_concurrency(result)
        if json_file is not None:
            _write(json_file, json.dumps(result, indent=2) + "\n")


def _level(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= MAX_SEQUENCES:
        raise SpecError(f"--concurrency takes whole numbers from 1 to {MAX_SEQUENCES}, got {value!r}")
    return int(value)


def _write(path: Path, text: str) -> None:
    """Write a whole file under a temporary name first, so an interrupted run leaves no half file."""
    partial = path.with_name(f".{path.name}.part")
    try:
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise SpecError(f"cannot write {path}: {exc.strerror}") from exc
    note(f"figures written to {path}")


def _temperature(value: str) -> float:
    try:
        temperature = float(value)
    except ValueError:
        temperature = -1.0
    if not 0 <= temperature < float("inf"):
        raise SpecError(f"--temp must be a number >= 0, got {value!r}")
    return temperature


def _drafting_mode(name: str) -> str:
    """A mode to compare; the target alone is measured anyway, as every row's baseline."""
    if name == "none":
        raise SpecError("--modes lists ways of drafting; the target alone is always measured")
    return mode(name).name
