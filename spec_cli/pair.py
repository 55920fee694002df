"""The public Python API: load a target (and a draft), generate from a prompt, read the statistics.

    from spec_cli import load_pair, SamplingParams

    with load_pair("target.gguf", "draft.gguf") as pair:
        generation = pair.generate("Why is the sky blue?", sampling=SamplingParams(temperature=0.7), seed=1)
        for event in generation:
            print(event.text, end="", flush=True)
        print(generation.finish_reason, generation.stats.acceptance_rate)
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Sequence

from spec_cli import vocab
from spec_cli.costs import LoopCosts
from spec_cli.draft_length import AdaptiveK, DraftLength, FixedK
from spec_cli.drafters import CatchUpDrafter, Drafter, HybridDrafter, HybridState, ModelDrafter, NgramDrafter
from spec_cli.engine import Generation
from spec_cli.errors import SpecError
from spec_cli.llama import Context, HeadContext, Model
from spec_cli.mtp import MtpDrafter
from spec_cli.rpc import device_list, local_devices, local_gpu_names, parse_endpoints
from spec_cli.sampling import SamplingParams, recommended
from spec_cli.text_drafting import TextDrafter, Translation
from spec_cli.verification import DEFAULT_VERIFY, VERIFY_RULES

DEFAULT_CTX = 2048
DRAFTING_MODES = ("model", "mtp", "ngram", "hybrid")  # the ways a user can choose to draft
DRAFT_MODES = (*DRAFTING_MODES, "none")
AUTO_K_MAX = 16
MAX_K = 64  # the largest fixed K a user may ask for
COSTS_DECAY = 0.95  # each call of a size weighs 5% less at the next: the costs follow the machine's load


def needs_draft_model(mode: str) -> bool:
    """The draft model drafts in "model" mode; the hybrid takes it where there is one (else the target's MTP
    head); n-gram lookup and an MTP head need no second file."""
    return mode in ("model", "hybrid")


def _fixed_k(draft_max: object) -> int:
    """K as a number of draft tokens, checked (the API takes it from callers other than the CLI)."""
    if not isinstance(draft_max, int) or isinstance(draft_max, bool) or draft_max < 0:
        raise SpecError(f"draft-max must be a number >= 0 or 'auto', got {draft_max!r}")
    return draft_max


class Pair:
    """A target model and an optional draft model, each with its own KV cache."""

    def __init__(self, target: Model, draft: Model | None, n_ctx: int, n_threads: int,
                 max_draft: int = AUTO_K_MAX, translation: Translation | None = None) -> None:
        """`max_draft`: the largest K that will be asked for; the target's memory is sized to take back that
        many tokens in place where llama.cpp can. The draft's memory never needs it: it drafts one token
        per decode, and in-place rollback only reaches into the last batch. `translation`: the two
        vocabularies side by side when they differ (the draft drafts through text), None when they match."""
        self.target = target
        self.draft = draft
        self.translation = translation
        self._contexts: list[Context] = []
        self._models = [m for m in (target, draft) if m is not None]
        # The loop's costs on this machine, and one K controller per draft mode, drafter and K, kept across
        # generations: what they learn carries over from one prompt (or chat turn) to the next. The MTP head's
        # steps are booked apart from the draft model's (`_costs_for`).
        self._costs: dict[str, LoopCosts] = {}
        self._lengths: dict[tuple[str, str, int | str], DraftLength] = {}
        self._hybrids: dict[int | str, HybridState] = {}
        self.head_context: HeadContext | None = None
        try:
            # A target with an MTP head keeps its hidden states: the head drafts from them.
            self.target_context = self._context(target, n_ctx, n_threads, max_draft, hidden_states=target.mtp_loaded)
            self.draft_context = self._context(draft, n_ctx, n_threads, 0) if draft else None
            if target.mtp_loaded:
                self.head_context = HeadContext(target, self.target_context.n_ctx, n_threads)
                self._contexts.append(self.head_context)
        except BaseException:
            self.close()
            raise

    def _context(self, model: Model, n_ctx: int, n_threads: int, max_rollback: int,
                 hidden_states: bool = False) -> Context:
        context = Context(model, n_ctx, n_threads, max_rollback=max_rollback, hidden_states=hidden_states)
        self._contexts.append(context)
        return context

    @property
    def drafting_modes(self) -> tuple[str, ...]:
        """The ways this pair can draft: n-gram lookup always; the draft model and the MTP head where loaded;
        the hybrid with either."""
        has = {"model": self.draft_context is not None, "mtp": self.head_context is not None, "ngram": True}
        has["hybrid"] = has["model"] or has["mtp"]
        return tuple(mode for mode in DRAFTING_MODES if has[mode])

    @property
    def default_draft_mode(self) -> str:
        """The draft model where there is one, else the target's MTP head, else no drafting."""
        return "model" if self.draft_context else ("mtp" if self.head_context else "none")

    @property
    def n_ctx(self) -> int:
        return self.target_context.n_ctx

    def memory(self) -> dict[str, dict[str, str]]:
        """Each loaded model's kind of memory and how it is rolled back, for reports and `--json`."""
        contexts = {"target": self.target_context, "draft": self.draft_context}
        return {name: {"kind": c.memory.kind, "rollback": c.memory.method} for name, c in contexts.items() if c}

    def placement(self) -> dict[str, str]:
        """Where each loaded model runs ("CPU", or the devices its layers go to), for reports and `--json`."""
        return {name: model.placement for name, model in (("target", self.target), ("draft", self.draft)) if model}

    def recommended_sampling(self) -> dict[str, float | int]:
        """The sampling settings the target's GGUF recommends (`general.sampling.*`), by SamplingParams field;
        the draft's own are irrelevant: p and q go through the same transforms."""
        return recommended(self.target.metadata)

    @property
    def has_chat_template(self) -> bool:
        return self.target.chat_template() is not None

    def prompt_tokens(self, prompt: str, raw: bool = False) -> list[int]:
        """Tokens of `prompt`: verbatim when `raw`, else wrapped as a user message by the chat template."""
        if not prompt.strip():
            raise SpecError("the prompt is empty")
        text = prompt if raw else self.target.format_chat([{"role": "user", "content": prompt}])
        return self.target.tokenize(text)

    def generate(self, prompt: str | Sequence[int], *, sampling: SamplingParams = SamplingParams(),
                 seed: int | None = None, draft_max: int | str = 4, max_tokens: int = 256, raw: bool = False,
                 draft_mode: str | None = None, draft_p_min: float = 0.0,
                 verify: str = DEFAULT_VERIFY) -> Generation:
        """Start a generation; nothing runs until it is iterated.

        `prompt` is text (see `prompt_tokens`) or token ids. `seed` fixes the one random generator used
        for drafting, acceptance and correction, so the same seed gives the same text; without one a
        random seed is drawn and kept on the returned `Generation`. `draft_max` is K, or "auto" to let
        `AdaptiveK` choose K each round; `draft_mode` is "model" (the default with a draft model), "mtp" (the
        target's own MTP head: the default without a draft model when the target has one), "ngram" (prompt
        lookup, no draft model needed), "hybrid" (n-gram lookup and the draft model, else the MTP head), or
        "none" (the default otherwise);
        `draft_p_min` is the draft model's confidence stop. `verify` is the rule sampled rounds are verified
        with: "block" (Sun et al. 2025) or "token" (Leviathan et al. 2023); greedy rounds do not need one.
        """
        if verify not in VERIFY_RULES:
            raise SpecError(f"unknown verification {verify!r}; choose one of: {', '.join(VERIFY_RULES)}")
        if max_tokens < 1:
            raise SpecError(f"max-tokens must be >= 1, got {max_tokens}")
        tokens = self.prompt_tokens(prompt, raw) if isinstance(prompt, str) else list(prompt)
        if not tokens:
            raise SpecError("the prompt is empty")
        if len(tokens) >= self.n_ctx:
            raise SpecError(f"the prompt is {len(tokens)} tokens but the context holds {self.n_ctx}; "
                            f"shorten it or raise --ctx")
        if seed is None:
            seed = secrets.randbits(32)
        mode = draft_mode or self.default_draft_mode
        self._check_drafting(mode, draft_p_min, draft_max)
        drafter, draft_length = self._drafting(mode, draft_p_min, draft_max)
        generation = Generation(self.target_context, drafter, tokens, sampling, seed, draft_length, max_tokens,
                                verify, self.costs_for(mode))
        generation.stats.adaptive = draft_max == "auto" and drafter is not None
        generation.stats.draft_mode = mode
        in_use = ("target", "draft") if needs_draft_model(mode) and self.draft_context else ("target",)
        generation.stats.memory = {name: facts for name, facts in self.memory().items() if name in in_use}
        generation.stats.placement = {name: where for name, where in self.placement().items() if name in in_use}
        return generation

    def _check_drafting(self, mode: str, p_min: float, draft_max: int | str) -> None:
        if draft_max != "auto":
            _fixed_k(draft_max)
        if mode not in DRAFT_MODES:
            raise SpecError(f"unknown draft mode {mode!r}; choose one of: {', '.join(DRAFT_MODES)}")
        if not 0 <= p_min < 1:
            raise SpecError(f"draft-p-min must be in [0, 1), got {p_min}")
        if mode == "mtp" and mode not in self.drafting_modes:
            raise SpecError(f"{self.target.path.name} has no MTP layers to draft with (nextn_predict_layers is 0, "
                            "or a conversion stripped them); give a draft model, or use --draft-mode ngram")
        if mode in ("model", "hybrid") and mode not in self.drafting_modes:
            raise SpecError(f"draft mode {mode!r} needs a draft model; give one, or use --draft-mode ngram")

    def _drafting(self, mode: str, p_min: float, draft_max: int | str) -> tuple[Drafter | None, DraftLength]:
        """The drafter for `mode` and the controller of its K. A hybrid drafter chooses K for each of its
        drafters itself, each with its own controller; the engine only caps it (K, or AUTO_K_MAX for auto)."""
        if mode == "none":
            return None, FixedK(0)
        if mode == "ngram":
            return NgramDrafter(self.target.n_vocab), self._draft_length(mode, "ngram", draft_max)
        if mode == "mtp":
            return self._mtp_drafter(p_min), self._draft_length(mode, "mtp", draft_max)
        if mode == "model":
            return self._model_drafter(p_min), self._draft_length(mode, "model", draft_max)
        model = self._catch_up_drafter(p_min)
        state = self._hybrids.setdefault(draft_max, HybridState(
            {drafter: self._draft_length(mode, drafter, draft_max) for drafter in ("ngram", "model")}))
        hybrid = HybridDrafter(NgramDrafter(self.target.n_vocab), model, self.costs_for(mode), state)
        return hybrid, FixedK(AUTO_K_MAX if draft_max == "auto" else _fixed_k(draft_max))

    def costs_for(self, mode: str) -> LoopCosts:
        """The running costs `mode`'s rounds are priced with and recorded in: the MTP head's steps apart from
        the draft model's, since a pair may draft with both and one step costs what it costs; n-gram rounds,
        which take no draft steps, share the draft model's book."""
        mtp = mode == "mtp" or mode == "hybrid" and self.draft_context is None
        return self._costs.setdefault("mtp" if mtp else "model", LoopCosts(decay=COSTS_DECAY))

    def _mtp_drafter(self, p_min: float = 0.0) -> MtpDrafter:
        assert self.head_context is not None
        return MtpDrafter(self.target_context, self.head_context, p_min)

    def _catch_up_drafter(self, p_min: float = 0.0) -> CatchUpDrafter | None:
        """What the hybrid pairs with n-gram lookup: the draft model, else the target's MTP head."""
        if self.draft_context is not None:
            return self._model_drafter(p_min)
        return self._mtp_drafter(p_min) if self.head_context is not None else None

    def _model_drafter(self, p_min: float) -> CatchUpDrafter:
        """The draft model's drafter: on the target's token ids, or through text when the vocabularies differ."""
        assert self.draft_context is not None
        if self.translation is not None:
            return TextDrafter(self.draft_context, self.translation, p_min)
        return ModelDrafter(self.draft_context, p_min)

    def _draft_length(self, mode: str, drafter: str, draft_max: int | str) -> DraftLength:
        """The controller of K for `drafter` ("model" or "ngram") drafting in `mode`, kept across generations."""
        key = (mode, drafter, draft_max)
        if key not in self._lengths:
            self._lengths[key] = FixedK(_fixed_k(draft_max)) if draft_max != "auto" else \
                AdaptiveK(self.costs_for(mode), drafts_with_model=drafter in ("model", "mtp"), k_max=AUTO_K_MAX)
        return self._lengths[key]

    def close(self) -> None:
        for context in self._contexts:
            context.close()
        for model in self._models:
            model.close()

    def __enter__(self) -> Pair:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def load_pair(target: str | os.PathLike[str], draft: str | os.PathLike[str] | None = None, *,
              n_ctx: int = DEFAULT_CTX, n_threads: int | None = None, gpu_layers: int | None = None,
              draft_gpu_layers: int | None = None, max_draft: int = AUTO_K_MAX, rpc: Sequence[str] = (),
              draft_rpc: Sequence[str] = (), tensor_split: Sequence[float] = ()) -> Pair:
    """Load a target and (unless `draft` is None) a draft. A draft whose vocabulary is not the target's drafts
    through text (`text_drafting`), exactly too; one that cannot spell plain text is refused.

    `max_draft` is the largest fixed K that will be asked for (`auto` never goes past `AUTO_K_MAX`).
    `rpc` lists llama.cpp RPC workers ("host:port") the target's layers are split over, weighted by
    `tensor_split` (one weight per device: the workers', then local GPUs); `gpu_layers` of them go to
    devices (default: every layer that fits on a machine with a GPU or with workers, none on a CPU-only
    one; 0 keeps a model on the CPU), the rest stay on this machine's CPU. The draft stays
    local unless `draft_rpc` names workers for it: it is small, and local drafting pays no round trips.
    """
    if n_ctx < 16:
        raise SpecError(f"the context must hold at least 16 tokens, got {n_ctx}")
    threads = n_threads or os.cpu_count() or 1
    target_model = _load(target, gpu_layers, rpc, tensor_split, load_mtp=True)
    draft_model, translation = None, None
    try:
        if draft is not None:
            draft_model = _load(draft, draft_gpu_layers, draft_rpc, (), drafts=True)
            translation = vocab.translation(target_model, draft_model)
        return Pair(target_model, draft_model, n_ctx, threads, max(max_draft, AUTO_K_MAX), translation)
    except BaseException:
        for model in (target_model, draft_model):
            if model is not None:
                model.close()
        raise


def _load(path: str | os.PathLike[str], gpu_layers: int | None, workers: Sequence[str],
          tensor_split: Sequence[float], load_mtp: bool = False, drafts: bool = False) -> Model:
    """One model on this machine's devices and `workers`' ("host:port"), every layer on devices by default
    when there are workers; with `load_mtp`, its MTP layers too (where it has them); `drafts` for the draft
    model (the kernels this machine runs may differ for it: `kernels`)."""
    endpoints = parse_endpoints(",".join(workers)) if workers else ()
    devices = device_list(endpoints)
    if tensor_split:
        _check_split(tensor_split, len(devices) - 1 if devices is not None else len(local_devices()))
    gpus = local_gpu_names()
    layers = default_gpu_layers(gpu_layers, bool(endpoints), gpus)
    model = Model(Path(path), layers, devices=devices, tensor_split=tensor_split, load_mtp=load_mtp, drafts=drafts)
    model.placement = placement(layers, [str(e) for e in endpoints], gpus)
    return model


def default_gpu_layers(given: int | None, workers: bool, gpus: Sequence[str]) -> int:
    """The layers offloaded: as given; else every layer that fits (-1, llama.cpp's own default) where there
    is a GPU or a worker to put them on, and none on a machine with neither."""
    if given is not None:
        return given
    return -1 if workers or gpus else 0


def placement(layers: int, workers: Sequence[str], gpus: Sequence[str]) -> str:
    """Where a model runs, in words: "CPU", or the devices its layers go to and how many."""
    devices = [*workers, *gpus]
    if layers == 0 or not devices:
        return "CPU"
    return f"{', '.join(devices)} ({'every layer that fits' if layers < 0 else f'{layers} layers'}; the rest on the CPU)"


def _check_split(weights: Sequence[float], n_devices: int) -> None:
    if len(weights) != n_devices:
        raise SpecError(f"--tensor-split gives {len(weights)} weights for {n_devices} devices "
                        "(one per RPC worker, in --rpc order, then one per local GPU)")
    if any(w < 0 for w in weights) or not any(weights):
        raise SpecError("--tensor-split weights must be >= 0 and not all 0")
