"""What the commands that generate share (run, chat, bench, serve): their options, declared once; the request
their flags describe, checked before any model loads; and opening the pair the options name, a registry pair
or files, with the registry's settings as defaults."""

from __future__ import annotations

import functools
import inspect
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Callable, Iterator, Optional, TypeVar

import typer

from spec_cli.cli.common import ThreadsOpt, csv_list, or_default, resolve_files
from spec_cli.decoding.sampling import SAMPLING_ORDER, SAMPLING_PRESETS, SamplingParams, resolve_sampling
from spec_cli.drafting.modes import MODES, mode_help
from spec_cli.drafting.recall import corpus_files
from spec_cli.errors import BadInput, SpecError
from spec_cli.llama import kernels, rpc
from spec_cli.llama.model import Model, supports_gpu_offload
from spec_cli.models import registry
from spec_cli.models.registry import mmproj_beside
from spec_cli.pair import Pair, load_pair, text_tokens
from spec_cli.paths import cache_dir
from spec_cli.request import AUTO, MAX_K, GenerationRequest, draft_max_from_text
from spec_cli.formats.structured import Constraint
from spec_cli.terminal.output import note

F = TypeVar("F", bound=Callable[..., Any])

TargetOpt = Annotated[Optional[Path], typer.Option("--target", "-t", help="Target GGUF file (the model you want output from).", show_default=False)]
DraftOpt = Annotated[Optional[Path], typer.Option("--draft", "-d", help="Draft GGUF file (small; a different vocabulary drafts through text).", show_default=False)]
PairOpt = Annotated[Optional[str], typer.Option("--pair", "-p", help="A named pair from models.toml (default: the registry's default pair).", show_default=False)]
DraftMaxOpt = Annotated[Optional[str], typer.Option("--draft-max", "-k", help=f"Draft tokens per round, K: 0-{MAX_K}, or auto to choose K each round from measured acceptance and costs (default: the pair's tuned K; auto for files given with --target/--draft).", show_default=False)]
DraftModeOpt = Annotated[Optional[str], typer.Option("--draft-mode", help=f"How drafts are made: {mode_help()} (default: hybrid, which chooses among them each round).", show_default=False)]
DraftPMinOpt = Annotated[float, typer.Option("--draft-p-min", min=0.0, max=0.99, help="Confidence stop: the draft model stops a round when its top probability falls below this (0: off).")]
VerifyOpt = Annotated[Optional[str], typer.Option("--verify", help="How sampled drafts are verified: block (Sun et al. 2025, keeps the most tokens), token (token by token) or gumbel (a seed gives the target alone's text whatever drafts; keeps fewer); all are exact. Default: gumbel where a seed is set, so that a seed repeats its text whatever drafts it, else block.", show_default=False)]
CtxOpt = Annotated[Optional[int], typer.Option("--ctx", min=16, help="Context size in tokens, for each sequence (default: the pair's, else the target's trained context where it fits in memory, as llama-server reads it from the model; `spec run` takes only what its prompt and -n need of it).", show_default=False)]
GpuLayersOpt = Annotated[Optional[int], typer.Option("--gpu-layers", min=-1, help="Target layers to put on devices (GPUs, RPC workers), -1: all; the rest run on this CPU (default: the pair's; else all with --rpc, 0 without).", show_default=False)]
DraftGpuLayersOpt = Annotated[Optional[int], typer.Option("--draft-gpu-layers", min=-1, help="Draft layers to put on the GPU, -1: all (default: the pair's, else 0).", show_default=False)]
RpcOpt = Annotated[Optional[str], typer.Option("--rpc", help="llama.cpp RPC workers to split the target over, HOST:PORT[,HOST:PORT…] (`spec worker` on each) (default: the pair's rpc, else none).", show_default=False)]
DraftRpcOpt = Annotated[Optional[str], typer.Option("--draft-rpc", help="RPC workers for the draft, HOST:PORT[,…] (default: none: the draft is small, and drafting here pays no round trips).", show_default=False)]
TensorSplitOpt = Annotated[Optional[str], typer.Option("--tensor-split", help="Weights of the devices the target is split over, comma-separated: one per RPC worker in --rpc order, then one per local GPU (default: by free memory).", show_default=False)]
MmprojOpt = Annotated[Optional[Path], typer.Option("--mmproj", help="The target's vision projector (an mmproj GGUF), for prompts with images (default: the pair's, else a single mmproj*.gguf beside the target).", show_default=False)]
DraftMmprojOpt = Annotated[Optional[Path], typer.Option("--draft-mmproj", help="The draft's own mmproj, so that it sees the images too (default: a single mmproj*.gguf beside the draft, in another folder than the target's; without one the draft reads the text around images).", show_default=False)]
NoDraftOpt = Annotated[bool, typer.Option("--no-draft", help="Run the target alone through the same code path, for comparison.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No statistics, no notes: only the text.")]
ChatFormatOpt = Annotated[Optional[str], typer.Option("--chat-format", help="Chat template when the model has none: chatml, or a Jinja template file.", show_default=False)]
# Sampling, with llama.cpp's meaning and defaults; None means "not given", so the --sampling preset decides.
TempOpt = Annotated[Optional[float], typer.Option("--temp", min=0.0, help=f"Temperature, applied last as in llama.cpp ({SAMPLING_ORDER}); 0 is greedy (the target alone's output, up to its own float ties).", show_default=False)]
TopKOpt = Annotated[Optional[int], typer.Option("--top-k", min=0, help="Keep the k most likely tokens (0: off) (default: 40).", show_default=False)]
TopPOpt = Annotated[Optional[float], typer.Option("--top-p", min=0.0, max=1.0, help="Keep the smallest set of tokens with this much probability, at temperature 1 (default: 0.95).", show_default=False)]
MinPOpt = Annotated[Optional[float], typer.Option("--min-p", min=0.0, max=1.0, help="Drop tokens below this fraction of the top token's probability, at temperature 1 (default: 0.05).", show_default=False)]
RepeatPenaltyOpt = Annotated[Optional[float], typer.Option("--repeat-penalty", min=0.0, help="Divide the logits of tokens seen in the last --repeat-last-n (multiply negative ones); 1: off (default: 1).", show_default=False)]
RepeatLastNOpt = Annotated[Optional[int], typer.Option("--repeat-last-n", min=0, help="How many recent tokens, prompt included, the penalties look at; 0: off (default: 64).", show_default=False)]
PresencePenaltyOpt = Annotated[Optional[float], typer.Option("--presence-penalty", help="Subtract from the logit of every token seen in the last --repeat-last-n (default: 0).", show_default=False)]
FrequencyPenaltyOpt = Annotated[Optional[float], typer.Option("--frequency-penalty", help="Subtract this times the number of times a token was seen in the last --repeat-last-n (default: 0).", show_default=False)]
SamplingPresetOpt = Annotated[Optional[str], typer.Option("--sampling", help="greedy (temperature 0 unless --temp is given) or model (what the target's GGUF recommends, else llama.cpp's temp 0.8, top-k 40, top-p 0.95, min-p 0.05); flags given always win (default: greedy for run, model for chat).", show_default=False)]
# Structured output, with llama.cpp's flag names.
GrammarOpt = Annotated[Optional[str], typer.Option("--grammar", help="Grammar the output must follow: GBNF as in llama.cpp, or Lark (exact under speculation).", show_default=False)]
GrammarFileOpt = Annotated[Optional[Path], typer.Option("--grammar-file", help="File holding a GBNF or Lark grammar.", show_default=False)]
JsonSchemaOpt = Annotated[Optional[str], typer.Option("--json-schema", "-j", help="JSON Schema the output must follow (compiled by llguidance; a keyword it cannot enforce is refused by name), e.g. '{\"type\": \"object\"}'.", show_default=False)]
JsonSchemaFileOpt = Annotated[Optional[Path], typer.Option("--json-schema-file", help="File holding a JSON Schema.", show_default=False)]
MemoryOpt = Annotated[Optional[Path], typer.Option("--memory", help="File the memory of earlier outputs is read from at the start and saved to at the end, shared safely by processes at once (memory drafting; the hybrid default uses it).", show_default=False)]
NoMemoryOpt = Annotated[bool, typer.Option("--no-memory", help="Neither read nor save a memory file: draft from this run's prompts and outputs alone.")]
LookupCorpusOpt = Annotated[Optional[list[Path]], typer.Option("--lookup-corpus", help="Text files, or folders of them, to draft from as well (e.g. the repository the prompts are about); repeat for more.", show_default=False)]
SeedOpt = Annotated[Optional[int], typer.Option("--seed", help="Random seed; the same seed gives the same text whatever drafts it, with any K, alone or batched (gumbel verification, unless --verify names another rule) (default, or -1: random, as in llama.cpp).", show_default=False)]


@dataclass(frozen=True)
class Sampling:
    """The sampling flags as given: a preset (None: the command's default) and the settings given by hand, by
    SamplingParams field."""

    preset: str | None = None
    given: dict[str, float | int] = field(default_factory=dict)

    def checked(self, default: str) -> Sampling:
        """These flags, checked now, before any model loads, with `default` as the preset if none was given."""
        preset = self.preset or default
        if preset not in SAMPLING_PRESETS:
            raise SpecError(f"unknown --sampling {preset!r}; choose one of: {', '.join(SAMPLING_PRESETS)}")
        SamplingParams(**self.given)
        return Sampling(preset, self.given)

    def for_pair(self, pair: Pair) -> SamplingParams:
        """The preset (with the target's recommended settings) under the flags given."""
        assert self.preset is not None, "checked() first"
        return resolve_sampling(self.preset, pair.recommended_sampling(), self.given)


@dataclass(frozen=True)
class MemoryOptions:
    """The memory flags as given: its file (None: the command's default), none at all, a corpus."""

    memory_file: Path | None = None
    no_memory: bool = False
    lookup_corpus: list[Path] | None = None

    def checked(self) -> MemoryOptions:
        """Refuse what cannot work, before any model loads."""
        if self.no_memory and self.memory_file is not None:
            raise SpecError("give either --memory FILE or --no-memory, not both")
        corpus_files(self.lookup_corpus or [])
        return self

    def apply(self, pair: Pair, default_file: bool, quiet: bool) -> None:
        """Start the pair's memory from its file (this one, or with `default_file` the one under the cache folder
        for the target's vocabulary) and read the corpus."""
        path = self.memory_file
        if path is None and default_file and not self.no_memory:
            path = cache_dir() / "memory" / f"{pair.output_memory.vocabulary}.npz"
        if path is not None:
            ignored = pair.keep_memory(path)
            if ignored is not None:
                note(ignored)
        if self.lookup_corpus:
            files, tokens = pair.output_memory.read_corpus(
                self.lookup_corpus, lambda text: pair.target.tokenize(text, add_special=False))
            if not quiet:
                note(f"drafting from a corpus of {files} files ({tokens:,} tokens) as well")


@dataclass(frozen=True)
class RequestFlags:
    """The request the flags describe, checked before any model loads; `for_pair` completes it with what only
    the loaded pair knows: its tuned K where -k was not given, the sampling its GGUF recommends."""

    request: GenerationRequest
    k_given: bool
    sampling: Sampling | None = None

    @classmethod
    def from_flags(cls, draft_max: str | None, draft_mode: str | None, no_draft: bool = False,
                   sampling: Sampling | None = None, **fields: object) -> RequestFlags:
        """`fields`: the other request fields the command takes (seed, draft_p_min, verify, max_tokens)."""
        k = {} if draft_max is None else {"draft_max": draft_max_from_text(draft_max)}
        request = GenerationRequest(draft_mode="none" if no_draft else draft_mode, **k, **fields)
        return cls(request, draft_max is not None, sampling)

    @property
    def loads_draft(self) -> bool:
        """Whether a draft file given (or named by the pair) is loaded: unless the mode drafts without one."""
        return self.request.draft_mode is None or MODES[self.request.draft_mode].loads_draft

    @property
    def requires_draft(self) -> bool:
        """Whether the mode asked for drafts with the draft file itself (model, eagle3, dflash): a target given
        without one is then an error said before loading. The default drafts with what the pair has."""
        mode = self.request.draft_mode
        return mode is not None and MODES[mode].loads_draft and MODES[mode].own_model

    @property
    def max_draft(self) -> int:
        """The largest fixed K asked for (memories that roll back in place are sized to it)."""
        return largest_k([self.request.draft_max] if self.k_given else [])

    def for_pair(self, loaded: Loaded) -> GenerationRequest:
        """The request for this pair: without -k, the pair's tuned K for a mode pinned to one drafter, and auto
        for the default, the hybrid, which chooses K for each of its drafters by the costs measured here (a
        tuned K was measured for the draft model alone)."""
        pinned = self.request.draft_mode not in (None, "hybrid")
        request = self.request if self.k_given else replace(self.request,
                                                            draft_max=loaded.draft_max if pinned else AUTO)
        if self.sampling is not None:
            request = replace(request, sampling=self.sampling.for_pair(loaded.pair))
        return request


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
    requires_draft: bool = False  # the mode asked for drafts with the draft file itself
    max_draft: int = 0  # the largest fixed K asked for (memories that roll back in place are sized to it)
    rpc: str | None = None
    draft_rpc: str | None = None
    tensor_split: str | None = None
    local_only: bool = False  # no workers, not even the pair's
    mmproj: Path | None = None
    draft_mmproj: Path | None = None
    images: bool = False  # prompts may hold images: the pair's projectors, or those beside the models, load too
    sequences: int = 1  # generating at once, each with a context of its own: a default context fits them all
    # The most tokens the work holds, read off the loaded target (`spec run`, `spec bench`: its longest prompt and -n,
    # `prompts_holding`; `spec batch`: its longest line): a default context is sized to it (`pair.held_context`);
    # None, or a holding that reads None: the whole default context (a chat, a server, a batch with images: the work is
    # not known).
    holding: Callable[[Model], int | None] | None = None

    def for_request(self, flags: RequestFlags, no_draft: bool = False, quiet: bool = False,
                    images: bool = False) -> LoadOptions:
        """These options with what the command's request decides: whether the draft file loads, the largest
        fixed K asked for, and whether prompts may hold images (chat, serve and batch: any message may)."""
        return replace(self, no_draft=no_draft, quiet=quiet, needs_draft=flags.loads_draft,
                       requires_draft=flags.requires_draft, max_draft=flags.max_draft, images=images)


@dataclass(frozen=True)
class Loaded:
    pair: Pair
    draft_max: int | str


def prompts_holding(texts: list[str], raw: bool, max_tokens: int) -> Callable[[Model], int]:
    """The most tokens a generation of one of `texts` holds, read off the loaded target: its prompt as `generate`
    tokenizes it (verbatim where `raw` or the target has no chat template) and `max_tokens`. A run's context is sized
    to them: the whole trained one was allocated and cleared for prompts and answers of a few hundred tokens."""
    def holding(target: Model) -> int:
        verbatim = raw or target.chat_template() is None
        return max((len(text_tokens(target, text, verbatim)) for text in texts), default=0) + max_tokens
    return holding


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
        target, draft = resolve_files(spec, options.quiet, images=options.images)
    if (options.gpu_layers and not workers) or (options.draft_gpu_layers and not draft_workers):
        _warn_cpu_only()
    load_draft = options.needs_draft and not options.no_draft
    ctx = options.ctx or (spec.ctx if spec else None)  # None: the target's trained context, where it fits
    # A pair's gpu_layers are for its own workers (or GPU): workers given here take every layer by default.
    gpu_layers = or_default(options.gpu_layers, spec.gpu_layers if spec and (spec.rpc or not options.rpc) else None)
    draft_gpu_layers = or_default(options.draft_gpu_layers, spec.draft_gpu_layers if spec else None)
    split = csv_list(options.tensor_split, _weight) if options.tensor_split else []
    if not kernels.known() and not options.quiet:
        note("trying which of llama.cpp's CPU kernels this machine runs (once, a few seconds)")
    mmproj, draft_mmproj = _projectors(options, spec, target, draft, load_draft)
    with load_pair(target, draft if load_draft else None, n_ctx=ctx, sequences=options.sequences,
                   n_threads=options.threads,
                   gpu_layers=gpu_layers, draft_gpu_layers=draft_gpu_layers, rpc=workers, draft_rpc=draft_workers,
                   tensor_split=split, max_draft=max(options.max_draft, spec.draft_max if spec else 0),
                   mmproj=mmproj, draft_mmproj=draft_mmproj, holding=None if options.ctx else options.holding) as pair:
        if pair.past_training and not options.quiet:
            note(f"warning: a context of {pair.n_ctx} tokens is past the {pair.target.n_ctx_train} "
                 f"{pair.target.path.name} was trained on, and its GGUF declares no RoPE scaling: text past "
                 f"{pair.target.n_ctx_train} tokens will not make sense")
        if pair.translation is not None and pair.draft is not None and not options.quiet:
            note(f"{pair.draft.path.name} and {pair.target.path.name} have different vocabularies: "
                 "drafting goes through text (exact)")
        yield Loaded(pair, spec.draft_max if spec else "auto")


def _projectors(options: LoadOptions, spec: registry.PairSpec | None, target: Path, draft: Path | None,
                load_draft: bool) -> tuple[Path | None, Path | None]:
    """The target's and the draft's mmproj (None for a draft that does not load): as given, else (where prompts may
    hold images) the pair's, or a single one beside the model (the draft's only in a folder of its own: one
    beside both is the target's)."""
    if options.draft_mmproj is not None and draft is None:
        raise BadInput("--draft-mmproj is the draft model's projector: give the draft model too (--draft)")
    if not load_draft:
        draft = None
    given = registry.projectors(spec) if spec is not None and options.images else (None, None)
    mmproj = options.mmproj or given[0] or (mmproj_beside(target) if options.images else None)
    draft_mmproj = options.draft_mmproj or given[1]
    if draft_mmproj is None and options.images and draft is not None and draft.parent != target.parent:
        draft_mmproj = mmproj_beside(draft)
    found = [path for path, asked in ((mmproj, options.mmproj), (draft_mmproj, options.draft_mmproj))
             if path is not None and asked is None]
    if found and not options.quiet:
        note(f"reading images with {' and '.join(path.name for path in found)}")
    return mmproj, draft_mmproj if draft is not None else None


def _pair_spec(options: LoadOptions) -> registry.PairSpec | None:
    """The registry entry to use, or None when the user named the files directly."""
    if options.target is None and options.draft is not None:
        raise SpecError("--draft needs --target")
    if options.target is None:
        models = registry.load_registry()
        return models.get(options.pair or models.default)
    if options.pair is not None:
        raise SpecError("give either --pair or --target/--draft, not both")
    if options.draft is None and options.requires_draft and not options.no_draft:
        raise SpecError("--target needs a --draft for this draft mode (or leave --draft-mode out: the default "
                        "drafts with what the target has, n-gram lookup at least)")
    return None


def largest_k(ks: list[int | str]) -> int:
    """The largest fixed K among those given (0 when none is a number)."""
    return max((k for k in ks if isinstance(k, int)), default=0)


def _weight(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise SpecError(f"--tensor-split takes numbers, got {value!r}") from None


def _warn_cpu_only() -> None:
    if not supports_gpu_offload():
        note("warning: this llama-cpp-python build has no GPU support; running on the CPU "
             "(spec doctor says how to install a CUDA or Metal build)")


def with_options(name: str, options: dict[str, object], gather: Callable[..., object]) -> Callable[[F], F]:
    """A decorator for commands: `command`'s parameter `name` becomes the `options` (parameter name: its
    Annotated option), in that place of its signature and so of its help, and the command receives
    `gather(**their values)` for it. Options several commands share are declared once, here."""
    def decorate(command: F) -> F:
        signature = inspect.signature(command, eval_str=True)
        added = [inspect.Parameter(option, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=annotation)
                 for option, annotation in options.items()]
        params = [q for p in signature.parameters.values() for q in (added if p.name == name else [p])]

        @functools.wraps(command)
        def command_with_options(**values: Any) -> Any:
            gathered = gather(**{option: values.pop(option) for option in options})
            return command(**values, **{name: gathered})

        command_with_options.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        command_with_options.__annotations__ = {p.name: p.annotation for p in params}
        return command_with_options  # type: ignore[return-value]
    return decorate


# The options that choose the pair and where it runs, by LoadOptions field: `load: LoadOptions` in a command.
loads_pair = with_options("load", {
    "target": TargetOpt, "draft": DraftOpt, "pair": PairOpt, "ctx": CtxOpt, "threads": ThreadsOpt,
    "gpu_layers": GpuLayersOpt, "draft_gpu_layers": DraftGpuLayersOpt, "rpc": RpcOpt, "draft_rpc": DraftRpcOpt,
    "tensor_split": TensorSplitOpt, "mmproj": MmprojOpt, "draft_mmproj": DraftMmprojOpt}, LoadOptions)
# The sampling options, by SamplingParams field (and the preset): `sampling: Sampling` in a command.
samples = with_options("sampling", {
    "preset": SamplingPresetOpt, "temperature": TempOpt, "top_k": TopKOpt, "top_p": TopPOpt, "min_p": MinPOpt,
    "repeat_penalty": RepeatPenaltyOpt, "repeat_last_n": RepeatLastNOpt, "presence_penalty": PresencePenaltyOpt,
    "frequency_penalty": FrequencyPenaltyOpt},
    lambda preset, **given: Sampling(preset, {name: value for name, value in given.items() if value is not None}))
# The memory options: `memory: MemoryOptions` in a command.
remembers = with_options("memory", {"memory_file": MemoryOpt, "no_memory": NoMemoryOpt,
                                    "lookup_corpus": LookupCorpusOpt}, MemoryOptions)
# The structured-output options: `constraint: Constraint` in a command.
constrains = with_options("constraint", {"grammar": GrammarOpt, "grammar_file": GrammarFileOpt,
                                         "json_schema": JsonSchemaOpt, "json_schema_file": JsonSchemaFileOpt},
                          Constraint)
