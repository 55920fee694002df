"""What the commands that load a pair share (run, chat, bench, serve): their options, declared once, and
opening the pair those options name, a registry pair or files, with the registry's settings as defaults."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Iterator, Optional

import typer

from spec_cli import kernels, registry, rpc, ui
from spec_cli.cli_base import T, csv_list, resolve_files
from spec_cli.errors import SpecError
from spec_cli.llama import mtp_layers, supports_gpu_offload
from spec_cli.pair import DEFAULT_CTX, DRAFTING_MODES, MAX_K, Pair, load_pair, needs_draft_model
from spec_cli.verification import VERIFY_RULES

TargetOpt = Annotated[Optional[Path], typer.Option("--target", "-t", help="Target GGUF file (the model you want output from).", show_default=False)]
DraftOpt = Annotated[Optional[Path], typer.Option("--draft", "-d", help="Draft GGUF file (small; a different vocabulary drafts through text).", show_default=False)]
PairOpt = Annotated[Optional[str], typer.Option("--pair", "-p", help="A named pair from models.toml (default: the registry's default pair).", show_default=False)]
DraftMaxOpt = Annotated[Optional[str], typer.Option("--draft-max", "-k", help="Draft tokens per round, K: 0-64, or auto to choose K each round from measured acceptance and costs (default: the pair's tuned K; auto for files given with --target/--draft).", show_default=False)]
DraftModeOpt = Annotated[Optional[str], typer.Option("--draft-mode", help="How drafts are made: model (the draft model), mtp (the target's own MTP head, no draft file), ngram (prompt lookup, no draft model needed), hybrid (n-gram lookup and the draft model, else the MTP head) (default: the draft model when there is one, else the target's MTP head).", show_default=False)]
VerifyOpt = Annotated[str, typer.Option("--verify", help="How sampled drafts are verified: block (Sun et al. 2025, keeps more tokens) or token (token by token); both are exact.")]
CtxOpt = Annotated[Optional[int], typer.Option("--ctx", min=16, help=f"Context size in tokens (default: the pair's, else {DEFAULT_CTX}).", show_default=False)]
GpuLayersOpt = Annotated[Optional[int], typer.Option("--gpu-layers", min=-1, help="Target layers to put on devices (GPUs, RPC workers), -1: all; the rest run on this CPU (default: the pair's; else all with --rpc, 0 without).", show_default=False)]
DraftGpuLayersOpt = Annotated[Optional[int], typer.Option("--draft-gpu-layers", min=-1, help="Draft layers to put on the GPU, -1: all (default: the pair's, else 0).", show_default=False)]
RpcOpt = Annotated[Optional[str], typer.Option("--rpc", help="llama.cpp RPC workers to split the target over, HOST:PORT[,HOST:PORT…] (`spec worker` on each) (default: the pair's rpc, else none).", show_default=False)]
DraftRpcOpt = Annotated[Optional[str], typer.Option("--draft-rpc", help="RPC workers for the draft, HOST:PORT[,…] (default: none: the draft is small, and drafting here pays no round trips).", show_default=False)]
TensorSplitOpt = Annotated[Optional[str], typer.Option("--tensor-split", help="Weights of the devices the target is split over, comma-separated: one per RPC worker in --rpc order, then one per local GPU (default: by free memory).", show_default=False)]
NoDraftOpt = Annotated[bool, typer.Option("--no-draft", help="Run the target alone through the same code path, for comparison.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No statistics, no notes: only the text.")]


@dataclass(frozen=True)
class LoadOptions:
    """The options every command that loads a pair shares, as the user gave them."""

    target: Path | None = None
    draft: Path | None = None
    pair: str | None = None
    no_draft: bool = False
    quiet: bool = False
    ctx: int | None = None
    threads: int | None = None
    gpu_layers: int | None = None
    draft_gpu_layers: int | None = None
    needs_draft: bool = True
    max_draft: int = 0  # the largest fixed K asked for (memories that roll back in place are sized to it)
    rpc: str | None = None
    draft_rpc: str | None = None
    tensor_split: str | None = None
    local_only: bool = False  # no workers, not even the pair's


@dataclass(frozen=True)
class Loaded:
    pair: Pair
    draft_max: int | str


@contextmanager
def open_pair(options: LoadOptions) -> Iterator[Loaded]:
    """Resolve the files (a named pair, or --target/--draft), load them, and close them afterwards.

    Settings the user left out come from the pair's registry entry; GPU layers asked for on a build that
    cannot offload get one warning line.
    """
    spec = _pair_spec(options)
    workers = csv_list(options.rpc, str) if options.rpc else list(spec.rpc if spec else ())
    draft_workers = csv_list(options.draft_rpc, str) if options.draft_rpc else []
    if options.rpc or workers or draft_workers:
        rpc.require()  # before any download or derivation
    if options.local_only:
        workers, draft_workers = [], []
    if spec is None:
        target, draft = options.target, options.draft
    else:
        target, draft = resolve_files(spec, options.quiet)
    if (options.gpu_layers and not workers) or (options.draft_gpu_layers and not draft_workers):
        _warn_cpu_only()
    load_draft = options.needs_draft and not options.no_draft
    ctx = options.ctx or (spec.ctx if spec else DEFAULT_CTX)
    # A pair's gpu_layers are for its own workers (or GPU): workers given here take every layer by default.
    gpu_layers = or_default(options.gpu_layers, spec.gpu_layers if spec and (spec.rpc or not options.rpc) else None)
    draft_gpu_layers = or_default(options.draft_gpu_layers, spec.draft_gpu_layers if spec else None)
    split = csv_list(options.tensor_split, _weight) if options.tensor_split else []
    if not kernels.known() and not options.quiet:
        ui.note("trying which of llama.cpp's CPU kernels this machine runs (once, a few seconds)")
    with load_pair(target, draft if load_draft else None, n_ctx=ctx, n_threads=options.threads,
                   gpu_layers=gpu_layers, draft_gpu_layers=draft_gpu_layers, rpc=workers, draft_rpc=draft_workers,
                   tensor_split=split, max_draft=max(options.max_draft, spec.draft_max if spec else 0)) as pair:
        if pair.translation is not None and pair.draft is not None and not options.quiet:
            ui.note(f"{pair.draft.path.name} and {pair.target.path.name} have different vocabularies: "
                    "drafting goes through text (exact)")
        yield Loaded(pair, spec.draft_max if spec else "auto")


def _pair_spec(options: LoadOptions) -> registry.PairSpec | None:
    """The registry entry to use, or None when the user named the files directly."""
    if options.target is None and options.draft is not None:
        raise SpecError("--draft needs --target")
    if options.target is None:
        models = registry.load_registry()
        return models.get(options.pair or models.default)
    if options.pair is not None:
        raise SpecError("give either --pair or --target/--draft, not both")
    if options.draft is None and options.needs_draft and not options.no_draft and not mtp_layers(options.target):
        raise SpecError("--target needs a --draft (or a target with MTP layers, or --draft-mode ngram, or "
                        "--no-draft for the target alone)")
    return None


def or_default(value: T | None, default: T) -> T:
    return default if value is None else value


def parse_draft_max(value: str) -> int | str:
    """-k as typed: a number of draft tokens (0-64) or "auto"."""
    if value.lower() == "auto":
        return "auto"
    if not value.isdigit() or int(value) > MAX_K:
        raise SpecError(f"--draft-max must be a number from 0 to {MAX_K} or 'auto', got {value!r}")
    return int(value)


def largest_k(ks: list[int | str | None]) -> int:
    """The largest fixed K among those given (0 when none is a number)."""
    return max((k for k in ks if isinstance(k, int)), default=0)


def given_draft_mode(value: str | None, no_draft: bool) -> str | None:
    """--draft-mode as given ("none" with --no-draft); None leaves it to the loaded pair: the draft model when
    there is one, else the target's MTP head (`Pair.default_draft_mode`)."""
    if no_draft:
        return "none"
    return parse_draft_mode(value) if value else None


def loads_draft(mode: str | None) -> bool:
    """Whether a draft file given (or named by the pair) is loaded: unless the mode drafts without one."""
    return mode is None or needs_draft_model(mode)


def parse_draft_mode(value: str) -> str:
    if value not in DRAFTING_MODES:
        raise SpecError(f"unknown draft mode {value!r}; choose one of: {', '.join(DRAFTING_MODES)}")
    return value


def _weight(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise SpecError(f"--tensor-split takes numbers, got {value!r}") from None


def parse_verify_rule(value: str) -> str:
    if value not in VERIFY_RULES:
        raise SpecError(f"unknown --verify {value!r}; choose one of: {', '.join(VERIFY_RULES)}")
    return value


def _warn_cpu_only() -> None:
    if not supports_gpu_offload():
        ui.note("warning: this llama-cpp-python build has no GPU support; running on the CPU "
                "(spec doctor says how to install a CUDA or Metal build)")
