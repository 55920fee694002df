"""The drafting modes, in one registry: what each is called and how it is described, whether it loads the
draft file, and how its drafter is built. The pair, the commands, chat, the server and the benchmark all read
it; a new mode is a drafter module and one entry in `MODES`. The default is the hybrid, which chooses among
every other way this pair allows each round.

`Sources` are the models drafters draw on; what they learn across generations and processes is a pair's
`Drafting` (`pair_state`), which each mode's builder draws its drafter and K controller from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from spec_cli.decoding.costs import HOST
from spec_cli.decoding.draft_length import AUTO_K_MAX, DraftLength, FixedK
from spec_cli.decoding.drafter import Drafter
from spec_cli.drafting.base import CatchUpDrafter
from spec_cli.drafting.dflash import DFlashDrafter
from spec_cli.drafting.eagle3 import Eagle3Drafter
from spec_cli.drafting.hybrid import HybridDrafter
from spec_cli.drafting.model import ModelDrafter
from spec_cli.drafting.mtp import MtpDrafter
from spec_cli.drafting.ngram import NgramDrafter
from spec_cli.drafting.recall import MemoryDrafter, OutputMemory
from spec_cli.drafting.text import TextDrafter
from spec_cli.drafting.translation import Translation
from spec_cli.errors import SpecError
from spec_cli.llama.context import Context
from spec_cli.llama.heads import BlockContext, HeadContext

if TYPE_CHECKING:  # the builders draw on a pair's drafting, which reads this registry
    from spec_cli.drafting.pair_state import Drafting



@dataclass(frozen=True)
class Sources:
    """What a pair offers its drafters: the target's context, the draft model's, the target's MTP head's, an
    EAGLE-3 head's or a DFlash drafter's where loaded, and `translation` when the draft's vocabulary is not the
    target's (it drafts through text); `memory`, the outputs the pair's generations wrote (`recall`), one for
    every slot."""

    target: Context
    draft: Context | None = None
    head: HeadContext | None = None
    translation: Translation | None = None
    eagle3: HeadContext | None = None
    dflash: BlockContext | None = None
    memory: OutputMemory | None = None


Build = Callable[["Drafting", float, "int | str"], "tuple[Drafter | None, DraftLength]"]


@dataclass(frozen=True)
class Mode:
    """One way of drafting.

    `loads_draft`: the draft file, where one is given, is loaded for it. `available`: whether a pair's sources
    can draft this way (`missing` says why not). Its rounds are priced with and recorded in a cost book of its
    own (`Drafting.costs`: the MTP head's steps apart from the draft model's), over the target's passes,
    which every book shares. `build(drafting, p_min, K)`: its drafter and the controller of its K.
    `own_drafter(drafting, p_min)`: for a mode that drafts with a model of the pair's own (`own_model`), that
    drafter alone, over the pair's `drafting`. `drafter`: the class that drafts so, whose `cost_shape` says how its
    drafting cost grows with K. `k_limit`: the most it can draft in a round.
    """

    name: str
    label: str
    help: str
    loads_draft: bool
    available: Callable[[Sources], bool]
    missing: Callable[[Sources], str]
    build: Build
    own_drafter: Callable[[Drafting, float], CatchUpDrafter] | None = None
    drafter: type[Drafter] | None = None
    k_limit: Callable[[Sources], int] = lambda _sources: AUTO_K_MAX

    @property
    def own_model(self) -> bool:
        """Whether it drafts with a model of the pair's own (the draft model, an EAGLE-3 head or DFlash drafter,
        the MTP head). The hybrid chooses among such modes and n-gram lookup; they cost decodes, so `-k auto`
        prices them and the benchmark predicts their fixed-K rows."""
        return self.own_drafter is not None

    @property
    def cost_shape(self) -> str:
        """How its drafting cost grows with K, as its drafter declares (the target alone: host time only)."""
        return self.drafter.cost_shape if self.drafter is not None else HOST


def _ngram(drafting: Drafting, _p_min: float, k: int | str) -> tuple[Drafter | None, DraftLength]:
    return NgramDrafter(drafting.sources.target.model.n_vocab), drafting.length(("ngram", "ngram", k), "ngram")


def _memory(drafting: Drafting, _p_min: float, k: int | str) -> tuple[Drafter | None, DraftLength]:
    return _lookup(drafting.sources), drafting.length(("memory", "memory", k), "memory")


def _lookup(sources: Sources) -> NgramDrafter | MemoryDrafter:
    """The drafter that costs no decode: the memory's where the pair keeps one, else n-gram lookup."""
    n_vocab = sources.target.model.n_vocab
    return MemoryDrafter(sources.memory, n_vocab) if sources.memory is not None else NgramDrafter(n_vocab)


def _model_drafter(drafting: Drafting, p_min: float) -> CatchUpDrafter:
    """The draft model's drafter: on the target's token ids, or through text when the vocabularies differ; what
    its context holds of the sequence is the pair's (`Drafting.draft_memory`), kept from one generation to the
    next."""
    sources, memory = drafting.sources, drafting.draft_memory
    assert sources.draft is not None and memory is not None
    if sources.translation is not None:
        return TextDrafter(sources.draft, sources.translation, p_min, memory)
    return ModelDrafter(sources.draft, p_min, memory)


def _mtp_drafter(drafting: Drafting, p_min: float) -> CatchUpDrafter:
    sources = drafting.sources
    assert sources.head is not None
    return MtpDrafter(sources.target, sources.head, p_min)


def _eagle3_drafter(drafting: Drafting, p_min: float) -> CatchUpDrafter:
    sources = drafting.sources
    assert sources.eagle3 is not None
    return Eagle3Drafter(sources.target, sources.eagle3, p_min)


def _dflash_drafter(drafting: Drafting, p_min: float) -> CatchUpDrafter:
    sources = drafting.sources
    assert sources.dflash is not None
    return DFlashDrafter(sources.target, sources.dflash, p_min)


def _block_limit(sources: Sources) -> int:
    """DFlash drafts at the masks of one trained block after the last token: block size − 1 of them."""
    return sources.dflash.block_size - 1 if sources.dflash is not None else AUTO_K_MAX


def _alone(name: str) -> Build:
    """The build of a mode that drafts with a model of the pair's own (its `own_drafter`), with its own K."""
    def build(drafting: Drafting, p_min: float, k: int | str) -> tuple[Drafter | None, DraftLength]:
        own = MODES[name]
        assert own.own_drafter is not None
        length = drafting.length((name, name, k), name, own.k_limit(drafting.sources))
        return own.own_drafter(drafting, p_min), length
    return build


def _hybrid(drafting: Drafting, p_min: float, k: int | str) -> tuple[Drafter | None, DraftLength]:
    """The lookup (the memory's, else n-gram lookup), every own drafter of the pair and no draft. Under auto the
    planner gives each round's way its K (at most AUTO_K_MAX), and the ways' controllers only keep acceptance. A fixed
    K is the own drafters' (each of their drafts costs a step); n-gram rounds then run as long as their own
    controller finds worth it (capped at K = 5, the hybrid ran at 0.89x n-gram lookup alone on text that copies its
    prompt)."""
    own = drafting.own_models()
    drafters: dict[str, CatchUpDrafter] = {}
    for name in own:
        make = MODES[name].own_drafter
        assert make is not None
        drafters[name] = make(drafting, p_min)
    hybrid = HybridDrafter(_lookup(drafting.sources), drafters, {name: drafting.costs(name) for name in own},
                           drafting.costs("hybrid"), drafting.hybrid_state(k))
    return hybrid, FixedK(0 if k == 0 else AUTO_K_MAX)


def _none(_drafting: Drafting, _p_min: float, _k: int | str) -> tuple[Drafter | None, DraftLength]:
    return None, FixedK(0)


def _no_draft_model(mode: str) -> Callable[[Sources], str]:
    def missing(sources: Sources) -> str:
        fed = ("eagle3", "an EAGLE-3 head") if sources.eagle3 is not None else \
            ("dflash", "a DFlash drafter") if sources.dflash is not None else None
        if fed is not None:  # a draft file was given, but it drafts from the target's features
            return (f"draft mode {mode!r} needs a draft model, and the draft given is {fed[1]}; "
                    f"use --draft-mode {fed[0]}")
        return f"draft mode {mode!r} needs a draft model; give one, or use --draft-mode ngram"
    return missing


def _no_drafter_file(mode: str, what: str) -> Callable[[Sources], str]:
    return lambda _sources: (f"draft mode {mode!r} needs {what} made for this target; give its GGUF with "
                             "--draft, or use --draft-mode ngram")


MODES: dict[str, Mode] = {mode.name: mode for mode in (
    Mode("model", "draft model", "the draft model", loads_draft=True, available=lambda s: s.draft is not None,
         missing=_no_draft_model("model"), build=_alone("model"), own_drafter=_model_drafter, drafter=ModelDrafter),
    Mode("eagle3", "EAGLE-3 head", "an EAGLE-3 head given as --draft", loads_draft=True,
         available=lambda s: s.eagle3 is not None, missing=_no_drafter_file("eagle3", "an EAGLE-3 head"),
         build=_alone("eagle3"), own_drafter=_eagle3_drafter, drafter=Eagle3Drafter),
    Mode("dflash", "DFlash block", "a DFlash drafter given as --draft: a block in one pass", loads_draft=True,
         available=lambda s: s.dflash is not None, missing=_no_drafter_file("dflash", "a DFlash drafter"),
         build=_alone("dflash"), own_drafter=_dflash_drafter, drafter=DFlashDrafter,
         k_limit=_block_limit),
    Mode("mtp", "MTP head", "the target's own MTP head, no draft file", loads_draft=False,
         available=lambda s: s.head is not None,
         missing=lambda s: f"{s.target.model.path.name} has no MTP layers to draft with (nextn_predict_layers is "
                           "0, or a conversion stripped them); give a draft model, or use --draft-mode ngram",
         build=_alone("mtp"), own_drafter=_mtp_drafter, drafter=MtpDrafter),
    Mode("ngram", "n-gram lookup", "prompt lookup, no draft model needed", loads_draft=False,
         available=lambda _s: True, missing=lambda _s: "", build=_ngram, drafter=NgramDrafter),
    Mode("memory", "memory", "suffix matching over this prompt, earlier outputs and --lookup-corpus, no draft "
         "model needed", loads_draft=False, available=lambda s: s.memory is not None,
         missing=lambda _s: "draft mode 'memory' needs the pair's memory, which this pair was loaded without",
         build=_memory, drafter=MemoryDrafter),
    Mode("hybrid", "hybrid", "the default: each round the memory (or n-gram lookup), the pair's own drafters or "
         "no draft, "
         "whichever the costs measured here say serves best", loads_draft=True, available=lambda _s: True,
         missing=lambda _s: "", build=_hybrid, drafter=HybridDrafter),
    Mode("none", "no draft", "the target alone", loads_draft=False, available=lambda _s: True,
         missing=lambda _s: "", build=_none),
)}
NONE = MODES["none"]
FED_MODES = ("eagle3", "dflash", "mtp")  # the modes whose drafters read the target's hidden states or features


def mode(name: str) -> Mode:
    """The mode called `name`, or one line naming the choices."""
    if name not in MODES:
        raise SpecError(f"unknown draft mode {name!r}; choose one of: {', '.join(MODES)}")
    return MODES[name]


def mode_help() -> str:
    """The modes in words, for help screens."""
    return ", ".join(f"{m.name} ({m.help})" for m in MODES.values())
