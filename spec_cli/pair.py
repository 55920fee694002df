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
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from spec_cli.decoding.draft_length import AUTO_K_MAX
from spec_cli.decoding.engine import Generation
from spec_cli.decoding.reasoning import Budgeted
from spec_cli.decoding.sampling import recommended
from spec_cli.drafting import cost_book
from spec_cli.drafting import memory_file
from spec_cli.drafting.modes import MODES, Sources
from spec_cli.drafting.pair_state import Drafting
from spec_cli.drafting.recall import OutputMemory
from spec_cli.drafting.translation import Translation
from spec_cli.errors import BadInput, SpecError
from spec_cli.llama import features
from spec_cli.llama.context import Context, common_prefix
from spec_cli.llama.grammar import Constraints, Grammar, GrammarError
from spec_cli.llama.heads import BlockContext, HeadContext
from spec_cli.llama.kernels import cpu_threads
from spec_cli.llama.model import Model
from spec_cli.llama.placement import kv_room, load_model
from spec_cli.llama.prompt_text import PromptText, with_images
from spec_cli.llama.vision import KEPT_IMAGES, Image, Projector, has_images
from spec_cli.drafting import vocab
from spec_cli.request import GenerationRequest, InvalidConstraint, InvalidRequest

DEFAULT_CTX = 2048  # the Python API's context, and the CLI's where a model does not say its trained one
CONTEXT_STEP = 256  # a default context is a whole number of these
_Memory = TypeVar("_Memory", Context, HeadContext, BlockContext)


class Pair:
    """A target model and an optional draft model, each with its own KV cache. The draft may be an EAGLE-3 head
    or a DFlash drafter (`features.drafter_file`): the target then keeps the inputs of the layers it reads."""

    def __init__(self, target: Model, draft: Model | None, n_ctx: int, n_threads: int,
                 max_draft: int = AUTO_K_MAX, translation: Translation | None = None,
                 projectors: tuple[Projector | None, Projector | None] = (None, None)) -> None:
        """`max_draft`: the largest K that will be asked for; the target's memory is sized to take back that
        many tokens in place where llama.cpp can. The draft's memory never needs it: it drafts one token
        per decode, and in-place rollback only reaches into the last batch. `translation`: the two
        vocabularies side by side when they differ (the draft drafts through text), None when they match.
        `projectors`: the target's and the draft's mmproj, where they read images (the pair closes them)."""
        self.target = target
        self.draft = draft
        self.vision, self.draft_vision = projectors
        self.constraints = Constraints(target)  # grammars over the target's vocabulary, compiled once each
        self.translation = translation
        self.n_threads = n_threads
        self._contexts: list[Context | HeadContext | BlockContext] = []
        self._models = [m for m in (target, draft) if m is not None]
        self.drafter_file = features.drafter_file(draft) if draft is not None else None
        found = self.drafter_file
        # Every output the pair writes, for every slot to draft from (`recall`); `keep_memory` makes it last.
        self.output_memory = OutputMemory(memory_file.vocabulary_key(target))
        self.memory_path: Path | None = None
        try:
            if draft is not None and found is not None:
                features.check_pair(target, draft, found)
            # A target with an MTP head keeps its hidden states, one with an EAGLE-3 or DFlash drafter the
            # inputs of the layers it reads: they draft from them.
            self.target_context = self._context(target, n_ctx, n_threads, max_draft, hidden_states=target.mtp_loaded,
                                                feature_layers=found.target_layers if found else ())
            self.draft_context = self._context(draft, n_ctx, n_threads, 0) if draft and not found else None
            self.head_context = self._add(HeadContext(target, self.n_ctx, n_threads)) if target.mtp_loaded else None
            sources = Sources(self.target_context, self.draft_context, self.head_context, translation,
                              memory=self.output_memory)
            if draft is not None and found is not None and found.kind == features.EAGLE3:
                sources = replace(sources, eagle3=self._add(HeadContext(draft, self.n_ctx, n_threads,
                                                                        target=self.target_context)))
            elif draft is not None and found is not None:
                sources = replace(sources, dflash=self._add(BlockContext(
                    draft, self.target_context, n_threads, found.block_size, found.mask_token, found.causal)))
        except BaseException:
            self._free()
            raise
        # What the drafters learn (costs, K controllers) is kept here across generations: it carries over from
        # one prompt (or chat turn) to the next, and from the last process on this machine (the cost book).
        self.drafting = Drafting(sources)
        self._slot_draftings: list[Drafting] = []  # the slots' (`slots`), which share the books of this one
        files = [model.path for model in self._models]
        self._book_key = cost_book.key(files, n_threads, self.placement())
        self._book = cost_book.read(self._book_key)
        self.drafting.seed(self._book)

    def _context(self, model: Model, n_ctx: int, n_threads: int, max_rollback: int, hidden_states: bool = False,
                 feature_layers: tuple[int, ...] = ()) -> Context:
        return self._add(Context(model, n_ctx, n_threads, max_rollback=max_rollback, hidden_states=hidden_states,
                                 feature_layers=feature_layers))

    def _add(self, context: _Memory) -> _Memory:
        """Keep `context` to close with the pair; one over a model with a projector reads images through it."""
        self._contexts.append(context)
        if isinstance(context, Context):
            context.projector = self.vision if context.model is self.target else self.draft_vision
        return context

    @property
    def drafting_modes(self) -> tuple[str, ...]:
        """The ways this pair can draft: n-gram lookup always; the draft model (or EAGLE-3 head, or DFlash
        drafter) and the MTP head where loaded; the hybrid with any of them."""
        return self.drafting.modes

    @property
    def default_draft_mode(self) -> str:
        """The hybrid: each round, whichever way this pair allows serves best by the costs measured here."""
        return "hybrid"

    def mode_for(self, request: GenerationRequest) -> str:
        """The drafting mode `request` runs with: its own, else this pair's default."""
        return request.draft_mode or self.default_draft_mode

    @property
    def n_ctx(self) -> int:
        return self.target_context.n_ctx

    @property
    def past_training(self) -> bool:
        """Whether the context reaches past what the target was trained on, its GGUF declaring no RoPE scaling
        that would stretch it: answers past the trained context are then garbage, which a user should be told."""
        trained = self.target.n_ctx_train
        return 0 < trained < self.n_ctx and not self.target.rope_scaled

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

    def prompt_tokens(self, prompt: str, raw: bool = False, images: Sequence[Image] = ()) -> list[int]:
        """Tokens of `prompt`: verbatim when `raw` (control tokens spelt in it are parsed), else wrapped as a user
        message by the chat template (its text stays text: only the template's markers are control tokens).
        `images` come first, in order, before the text (`with_images`)."""
        if not prompt.strip() and not images:
            raise SpecError("the prompt is empty")
        return text_tokens(self.target, with_images(prompt, len(images)), raw, self.see(images))

    def see(self, images: Sequence[Image]) -> list[list[int]]:
        """The ids each image takes in a prompt (the text the target's projector writes around it, then its run),
        each read by the target's projector and by the draft's where it has one (`BadInput` when an image is
        not one, or the target reads none)."""
        if not images:
            return []
        if self.vision is None:
            raise BadInput(f"{self.target.path.name} reads no images without its mmproj: give one with --mmproj "
                           "(or put a single mmproj*.gguf beside the model)")
        pieces = [[*before, *[image.key] * read.n_tokens, *after]
                  for image, (read, before, after) in zip(images, self.vision.see(images))]
        if self.draft_vision is not None:
            self.draft_vision.see(images)
        return pieces

    def check_prompt(self, tokens: Sequence[int]) -> None:
        """Refuse a prompt the target cannot take: empty, with ids outside its vocabulary, or not leaving room
        in the context for one token."""
        if not tokens:
            raise SpecError("the prompt is empty")
        if any(token >= self.target.n_vocab or token < 0 and self.vision is None for token in tokens):
            raise InvalidRequest("prompt", "the prompt has token ids outside the vocabulary "
                                           f"(0 to {self.target.n_vocab - 1})")
        if self.vision is not None and any(self.vision.get(key) is None for key in {t for t in tokens if t < 0}):
            raise InvalidRequest("prompt", "the prompt holds an image the target's projector does not hold (never "
                                           f"read by `Pair.see`, or more than {KEPT_IMAGES} images were read since): "
                                           "send it again")
        if len(tokens) >= self.n_ctx and has_images(tokens):
            raise BadInput(f"the prompt's images and text take {len(tokens)} tokens but the context holds "
                           f"{self.n_ctx}; give fewer or smaller images, or raise --ctx")
        if len(tokens) >= self.n_ctx:
            raise InvalidRequest("prompt", f"the prompt is {len(tokens)} tokens but the context holds {self.n_ctx}; "
                                           "shorten it or raise --ctx", code="context_length_exceeded")

    def generate(self, prompt: str | Sequence[int], request: GenerationRequest | None = None, *, raw: bool = False,
                 images: Sequence[Image] = (), **fields: Any) -> Generation:
        """Start a generation; nothing runs until it is iterated.

        `prompt` is text (see `prompt_tokens`, which places `images` before it) or token ids. `request` says how to
        generate (`GenerationRequest`; the defaults when None), and keyword arguments set its fields (sampling=,
        seed=, draft_max=, draft_mode=, draft_p_min=, verify=, max_tokens=, grammar=):
        `pair.generate("Hi", seed=1, draft_max="auto")`.
        The seed fixes the one random generator used for drafting, acceptance and correction, so the same seed
        gives the same text; without one a random seed is drawn and kept on the returned `Generation`.
        """
        request = replace(request or GenerationRequest(), **fields)
        tokens = self.prompt_tokens(prompt, raw, images) if isinstance(prompt, str) else list(prompt)
        return self._generation(tokens, request, self.target_context, self.drafting)

    def _generation(self, tokens: list[int], request: GenerationRequest, target: Context,
                    drafting: Drafting) -> Generation:
        """A generation of `tokens` on the target's sequence `target`, drafting with `drafting`'s sources."""
        self.check_prompt(tokens)
        name = self._mode_past_images(self.mode_for(request)) if has_images(tokens) else self.mode_for(request)
        grammar = self.grammar(request.grammar) if request.grammar is not None else None
        if request.reasoning_budget is not None:
            grammar = Budgeted(grammar, request.reasoning_budget, self.target)
        mode = MODES[name]
        drafter, draft_length = drafting.build(mode.name, request.draft_p_min, request.draft_max)
        seed = secrets.randbits(32) if request.seed is None else request.seed
        generation = Generation(target, drafter, tokens, request.sampling, seed, draft_length,
                                request.max_tokens, request.verify_rule, drafting.costs(mode.name), grammar,
                                request.control_text)
        generation.stats.adaptive = request.adaptive and drafter is not None
        if isinstance(request.draft_max, int):  # the K asked, within the loop's cap (the hybrid's is its n-gram's)
            generation.stats.draft_max = min(request.draft_max, generation.stats.draft_max)
        generation.stats.draft_mode = mode.name
        in_use = ("target", "draft") if mode.loads_draft and self.draft_context else ("target",)
        generation.stats.memory = {name: facts for name, facts in self.memory().items() if name in in_use}
        generation.stats.placement = {name: where for name, where in self.placement().items() if name in in_use}
        return generation

    def _mode_past_images(self, mode: str) -> str:
        """The mode a prompt with images drafts in. A draft with another vocabulary (drafting through text) cannot
        go past an image yet: asked for by name, it is refused; the hybrid over such a pair drafts with the
        lookup alone (the memory's, or n-gram lookup), which `stats.draft_mode` says. Every other drafter reads
        the images or the text around them."""
        if self.translation is None or not MODES[mode].loads_draft:
            return mode
        if mode == "hybrid":
            return "memory" if "memory" in self.drafting_modes else "ngram"
        raise BadInput("a draft with another vocabulary cannot draft for a prompt with images; use --draft-mode "
                       "memory or ngram")

    def slots(self, n: int, holding: int | None = None) -> list[Slot]:
        """`n` sequences to generate on at once (`decoding.scheduler`). One is the pair's own contexts and
        drafting. Several are each a sequence of one new target context (and of one new draft context) with
        drafting state of its own; their memories go back by cuts or snapshots (never in place: llama.cpp's
        in-place rollback is per batch, not per sequence). A drafter fed with the target's hidden states or
        features (an MTP head, an EAGLE-3 head, a DFlash drafter) gets a context of its own in each slot, and
        each sequence of the target keeps its own rows of what feeds it.

        `holding`: the most tokens a generation on them holds (its prompt and answer), where the work is known (a
        batch's lines, a benchmark's prompts): each of several sequences then holds that and a verify pass's rows,
        within the pair's context. A model's KV cache is allocated, and cleared, for every token its context holds:
        at the demo pair's 8192 tokens four sequences of the target and of the draft took 1.4–4.3 s to set up on a
        2-core machine (0.04–0.17 s at 256 tokens each), which a batch of short prompts waited on."""
        if n == 1:
            return [Slot(self, self.target_context, self.drafting)]
        own, length = self.target_context, self.n_ctx
        if holding is not None:
            length = held_context(holding, length)
        targets = self._sequences(self.target, n, length, hidden_states=own.hidden is not None,
                                  feature_layers=own.feature_layers)
        drafts = self._sequences(self.draft, n, length) if self.draft_context is not None else [None] * n
        return [Slot(self, target, self._slot_drafting(Sources(target, draft, translation=self.translation,
                                                               memory=self.output_memory), length))
                for target, draft in zip(targets, drafts)]

    def _slot_drafting(self, sources: Sources, n_ctx: int) -> Drafting:
        """A slot's drafting, started from the cost book as the pair's was: a slot that starts cold tries each own
        drafter on its first request, a catch-up that held every sequence's first token up (~100 ms on the demo pair
        at `--parallel 4`). It shares the pair's books of what does not depend on the sequences a pass runs with
        (`Drafting(shared=)`): the target's passes by rows (the scheduler books each pass over every slot's rows once,
        in the first book it meets), each own drafter's acceptance, the answers' lengths, which every slot adds to
        and the pair keeps in the cost book when it closes (each slot kept its own, and a batch's process wrote back
        the acceptance it had found)."""
        drafting = Drafting(self._fed(sources, n_ctx), shared=self.drafting)
        drafting.seed(self._book)
        self._slot_draftings.append(drafting)
        return drafting

    def _sequences(self, model: Model, n: int, n_ctx: int, hidden_states: bool = False,
                   feature_layers: tuple[int, ...] = ()) -> list[Context]:
        first = self._add(Context(model, n_ctx, self.n_threads, sequences=n, hidden_states=hidden_states,
                                  feature_layers=feature_layers))
        own = self.target_context if model is self.target else self.draft_context
        if own is not None:  # the same weights take in a stretch at the same rate: measured once, kept in the book
            first.throughput = own.throughput
        return [first, *(self._add(first.sequence(seq)) for seq in range(1, n))]

    def _fed(self, sources: Sources, n_ctx: int) -> Sources:
        """`sources` with the drafters fed by its target that the pair's own sources have, each a context of
        its own over the same model, of `n_ctx` tokens."""
        own, target = self.drafting.sources, sources.target
        if own.head is not None:
            sources = replace(sources, head=self._add(HeadContext(self.target, n_ctx, self.n_threads)))
        if own.eagle3 is not None:
            sources = replace(sources, eagle3=self._add(HeadContext(self.draft, n_ctx, self.n_threads,
                                                                    target=target)))
        if own.dflash is not None:
            block = own.dflash
            sources = replace(sources, dflash=self._add(BlockContext(self.draft, target, self.n_threads,
                                                                     block.block_size, block.mask_token,
                                                                     block.causal)))
        return sources

    def grammar(self, text: str) -> Grammar:
        """The start state of grammar `text` (GBNF, Lark, or llguidance's JSON grammar) over the target's
        vocabulary; InvalidConstraint when it does not compile or allows nothing."""
        try:
            return self.constraints.start(text)
        except GrammarError as exc:
            raise InvalidConstraint("grammar", f"{{name}} {exc.reason}") from None

    def forget_prompts(self) -> None:
        """Every context forgets what it holds, so that the next generation takes its whole prompt in, as on a first
        encounter: `spec bench` runs one prompt under each configuration in turn, and each found it in the draft's
        cache from the last to draft with the model, its catch-up free (~80 ms of a 64-token answer on the demo pair,
        which the first of them paid: the default, run before the pinned modes)."""
        for context in self._contexts:
            context.trim(0)

    def keep_memory(self, path: Path) -> str | None:
        """Start the memory from `path` and save it there when the pair closes; a file that cannot be used is
        left alone (the save replaces it): the line that says why is returned."""
        self.memory_path = path
        try:
            self.output_memory.load(path)
        except memory_file.MemoryFileError as exc:
            return f"ignoring the memory file {path}: {exc}; the next save replaces it"
        return None

    def close(self) -> None:
        """Free the models, after keeping what drafting measured in the cost book and what the memory learnt in
        its file (`keep_memory`)."""
        for drafting in self._slot_draftings:
            drafting.end_text()
        learnt = self.drafting.learnt()
        if learnt is not None:
            cost_book.write(self._book_key, {**learnt, "pair": [model.path.name for model in self._models]})
        self._free()
        if self.memory_path is not None:
            try:
                self.output_memory.save(self.memory_path)
            except OSError as exc:
                raise SpecError(f"cannot save the memory to {self.memory_path}: {exc.strerror or exc}") from None

    def _free(self) -> None:
        for context in self._contexts:
            context.close()
        for projector in (self.vision, self.draft_vision):
            if projector is not None:
                projector.close()
        for model in self._models:
            model.close()

    def __enter__(self) -> Pair:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class Slot:
    """One sequence of a pair's `slots`: its target's sequence and its drafting (draft sequence, what its drafters
    learn), kept across the generations it runs (a client's next turn that lands here reuses its prefix)."""

    def __init__(self, pair: Pair, target: Context, drafting: Drafting) -> None:
        self.pair, self.target, self.drafting = pair, target, drafting

    def fits(self, tokens: Sequence[int]) -> float:
        """How well this slot suits a prompt of `tokens`: the prefix its memory holds, less half of what it would
        lose (a new conversation goes to an empty slot rather than to one whose conversation merely starts with
        the same template markers)."""
        held = common_prefix(self.target.tokens, tokens)
        return held - (self.target.n_past - held) / 2

    def generate(self, tokens: Sequence[int], request: GenerationRequest) -> Generation:
        """A generation of `tokens` on this slot, for a scheduler to run (`Pair.generate` otherwise)."""
        return self.pair._generation(list(tokens), request, self.target, self.drafting)

    def contexts(self) -> list[Context]:
        """The sequences whose memories hold this slot's conversation: the target's, then the draft's."""
        draft = self.drafting.sources.draft
        return [self.target] if draft is None else [self.target, draft]


def text_tokens(target: Model, text: str, raw: bool = False, pieces: Sequence[Sequence[int]] = ()) -> list[int]:
    """Tokens of `text` (images already in it as markers, read as `pieces`): verbatim when `raw` (control tokens
    spelt in it are parsed), else wrapped as a user message by the target's chat template (its text stays text: only
    the template's markers are control tokens)."""
    if raw:
        return target.tokenize_prompt(PromptText(text), images=pieces)
    return target.tokenize_prompt(target.format_chat([{"role": "user", "content": text}]), images=pieces)


def held_context(holding: int, most: int) -> int:
    """The context of a sequence that holds at most `holding` tokens (its prompt and its answer), a verify pass's
    rows past them included, within `most`."""
    return max(16, min(most, holding + AUTO_K_MAX + 1))


def trained_context(target: Model, draft: Model | None, sequences: int = 1) -> int:
    """The target's trained context where `sequences` sequences' KV caches (the draft's beside each) fit the room
    where the target runs (`placement.kv_room`), else the most that fits, in whole steps of 256 tokens: llama-server
    reads its default context from the model, and an agent's first request is 8–19k tokens."""
    if target.n_ctx_train <= 0:
        return DEFAULT_CTX
    per_token = sequences * (target.kv_bytes_per_token + (draft.kv_bytes_per_token if draft is not None else 0))
    fits = kv_room(target) // max(per_token, 1) // CONTEXT_STEP * CONTEXT_STEP
    return max(CONTEXT_STEP, min(target.n_ctx_train, fits))


def load_pair(target: str | os.PathLike[str], draft: str | os.PathLike[str] | None = None, *,
              n_ctx: int | None = DEFAULT_CTX, sequences: int = 1, n_threads: int | None = None,
              gpu_layers: int | None = None,
              draft_gpu_layers: int | None = None, max_draft: int = AUTO_K_MAX, rpc: Sequence[str] = (),
              draft_rpc: Sequence[str] = (), tensor_split: Sequence[float] = (),
              mmproj: str | os.PathLike[str] | None = None, draft_mmproj: str | os.PathLike[str] | None = None,
              holding: Callable[[Model], int | None] | None = None) -> Pair:
    """Load a target and (unless `draft` is None) a draft. A draft whose vocabulary is not the target's drafts
    through text (`drafting.text`), exactly too; one that cannot spell plain text is refused. An EAGLE-3 head
    or a DFlash drafter drafts from the target's features, and only for a target it fits (`features`).

    `max_draft` is the largest fixed K that will be asked for (`auto` never goes past `AUTO_K_MAX`).
    `rpc` lists llama.cpp RPC workers ("host:port") the target's layers are split over, weighted by
    `tensor_split` (one weight per device: the workers', then local GPUs); `gpu_layers` of them go to
    devices (default: every layer that fits on a machine with a GPU or with workers, none on a CPU-only
    one; 0 keeps a model on the CPU), the rest stay on this machine's CPU. The draft stays
    local unless `draft_rpc` names workers for it: it is small, and local drafting pays no round trips.

    `mmproj`: the target's projector, for prompts with images (`vision`); `draft_mmproj`: the draft's, so that it
    sees the images too (without one a draft reads the text around them).

    `n_ctx` None: the target's trained context where `sequences` sequences of it fit in memory (`trained_context`).
    `holding`: the most tokens the work holds, read off the loaded target (`spec run`'s prompt and its max_tokens, the
    longest of `spec batch`'s lines; None: not known): the context is then sized to it, within `n_ctx`
    (`held_context`). A model's KV cache is allocated and cleared for every token its context holds: at the demo
    pair's trained 8192 tokens, ~350 MB and ~0.35 s of a 2.5 s `spec run` on a 2-core machine, for a prompt and
    answer of ~60 tokens.
    """
    if n_ctx is not None and n_ctx < 16:
        raise SpecError(f"the context must hold at least 16 tokens, got {n_ctx}")
    if draft_mmproj is not None and draft is None:
        raise BadInput("--draft-mmproj is the draft model's projector: give the draft model too (--draft)")
    threads = n_threads or cpu_threads()
    target_model = load_model(target, gpu_layers, rpc, tensor_split, load_mtp=True)
    draft_model, translation, projectors = None, None, [None, None]
    try:
        if draft is not None:
            # A drafter fed with features decodes whole batches (its encoder, a DFlash block): no kernels that
            # only run one token at a time.
            fed = features.is_drafter(Path(draft))
            draft_model = load_model(draft, draft_gpu_layers, draft_rpc, (), drafts=not fed)
            translation = None if fed else vocab.translation(target_model, draft_model)
        for i, (model, path) in enumerate(((target_model, mmproj), (draft_model, draft_mmproj))):
            if path is not None and model is not None:
                projectors[i] = Projector(model, path, threads)
        if n_ctx is None:
            n_ctx = trained_context(target_model, draft_model, sequences)
        held = holding(target_model) if holding is not None else None
        if held is not None:
            n_ctx = held_context(held, n_ctx)
        return Pair(target_model, draft_model, n_ctx, threads, max(max_draft, AUTO_K_MAX), translation,
                    (projectors[0], projectors[1]))
    except BaseException:
        for projector in projectors:
            if projector is not None:
                projector.close()
        for model in (target_model, draft_model):
            if model is not None:
                model.close()
        raise
