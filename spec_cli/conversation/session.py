"""A conversation with a pair: history, the chat template, turns, slash commands. No terminal I/O here.

Each turn is tokenized as an extension of the exact tokens already in the caches (the prompt and generated
ids of earlier turns), so both models evaluate only the new text: the chat template renders the whole
conversation, and the part after what was already evaluated is tokenized on its own. When a template
rewrites earlier text (some trim whitespace), the whole conversation is tokenized instead and the caches
keep their longest common prefix. When the conversation outgrows the context, the oldest turns are dropped
(the system message stays).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Callable, Iterator

from spec_cli.decoding.engine import Generation, TokenEvent
from spec_cli.conversation.prompt_cache import PromptCache
from spec_cli.decoding.stats import Stats
from spec_cli.errors import SpecError
from spec_cli.llama.prompt_text import PromptText, with_images
from spec_cli.llama.vision import Image, read_image
from spec_cli.pair import Pair
from spec_cli.request import GenerationRequest, InvalidRequest, draft_max_from_text
from spec_cli.formats.structured import Constraint

CHAT_FORMATS = {
    "chatml": ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
               "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"),
}


def chat_template(chat_format: str | None) -> str | None:
    """--chat-format as given: a known name, a Jinja template file, or None for the model's own."""
    if chat_format is None:
        return None
    if chat_format in CHAT_FORMATS:
        return CHAT_FORMATS[chat_format]
    path = Path(chat_format).expanduser()
    if not path.is_file():
        raise SpecError(f"--chat-format {chat_format!r} is neither {', '.join(CHAT_FORMATS)} nor a template file")
    return path.read_text(encoding="utf-8")


@dataclass(frozen=True)
class Settings(GenerationRequest):
    """The request each answer is generated with, as `/set` changes it between turns, and whether to draft
    (`/draft off` lets the target answer alone and keeps the drafting mode for `/draft on`)."""

    use_draft: bool = True

    @classmethod
    def of(cls, request: GenerationRequest, use_draft: bool = True) -> Settings:
        return cls(**{f.name: getattr(request, f.name) for f in fields(request)}, use_draft=use_draft)

    def describe(self) -> str:
        """One line for the banner and a bare `/set`."""
        drafting = f"{self.draft_mode} K={self.draft_max}" if self.use_draft else "off"
        line = f"{self.sampling.describe()} · drafting {drafting}"
        line = line if self.sampling.greedy else f"{line} · verify {self.verify_rule}"
        return line if self.grammar is None else f"{line} · output constrained by a grammar"


@dataclass
class Turn:
    role: str
    content: str
    interrupted: bool = False
    images: tuple[Image, ...] = ()  # before the text, as `spec run --image` places them


@dataclass
class ChatSession:
    pair: Pair
    settings: Settings
    system: str | None = None
    template: str | None = None  # a Jinja chat template overriding the target's own
    turns: list[Turn] = field(default_factory=list)
    totals: Stats = field(default_factory=lambda: Stats(draft_max=0))
    last: Generation | None = None
    notices: list[str] = field(default_factory=list)
    attached: list[Image] = field(default_factory=list)  # `/image` files for the next message
    _cache: PromptCache = field(default_factory=PromptCache)
    _rendered: PromptText = PromptText("")

    def messages(self, turns: list[Turn] | None = None) -> list[dict[str, str]]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + [{"role": t.role, "content": with_images(t.content, len(t.images))}
                         for t in (self.turns if turns is None else turns)]

    def attach(self, path: Path) -> str:
        """Attach an image to the next message (read now: a bad file, or a target that reads none, is said at
        once)."""
        image = read_image(path)
        self.pair.see([image])
        self.attached.append(image)
        count = len(self.attached)
        return f"{path} attached to the next message" + (f" ({count} images)" if count > 1 else "")

    def reply(self, text: str) -> Iterator[TokenEvent]:
        """Answer a user message, streaming events; the answer joins the history even if cut short."""
        if not text.strip() and not self.attached:
            raise SpecError("the message is empty")
        turns = self.turns
        self.turns = turns + [Turn("user", text, images=tuple(self.attached))]
        try:
            prompt = self._prompt_tokens()
            generation = self.pair.generate(prompt, self.settings, draft_mode=self._drafting())
        except SpecError:
            self.turns = turns
            raise
        self.attached = []
        self.last = generation
        try:
            yield from generation
        finally:
            self.turns.append(Turn("assistant", generation.text, interrupted=generation.finish_reason == "interrupted"))
            self._cache.remember(self._rendered.text + generation.text, prompt + generation.token_ids)
            self.totals.merge(generation.stats)

    def _drafting(self) -> str:
        """The mode this turn drafts with: the settings' own, or none after `/draft off`."""
        return self.pair.mode_for(self.settings) if self.settings.use_draft else "none"

    def _prompt_tokens(self) -> list[int]:
        """The conversation's tokens, extending the exact tokens of earlier turns where the template allows,
        after dropping the oldest turns if it would not leave room to answer."""
        model = self.pair.target
        room = self.pair.n_ctx - min(self.settings.max_tokens, self.pair.n_ctx // 2)
        dropped = 0
        while True:
            self._rendered = model.format_chat(self.messages(), template=self.template)
            images = self.pair.see([image for turn in self.turns for image in turn.images])
            tokens = self._cache.tokens_for(model, self._rendered, images)
            if len(tokens) <= room:
                break
            if len(self.turns) <= 1:
                raise SpecError(f"the message is {len(tokens)} tokens; with room for the answer the context holds "
                                f"{room} (raise --ctx or lower --max-tokens)")
            self.turns = self.turns[2:] if self.turns[0].role == "user" else self.turns[1:]
            self._cache.forget()
            dropped += 1
        if dropped:
            self.notices.append(f"the conversation outgrew the {self.pair.n_ctx}-token context: "
                                f"dropped the {dropped} oldest turn{'s' * (dropped > 1)}")
        return tokens

    def reset(self) -> None:
        self.turns = []
        self.attached = []
        self._cache.forget()

    def set_system(self, text: str) -> None:
        self.system = text or None
        self._cache.forget()

    def save(self, path: Path) -> None:
        """The conversation as JSON (.json) or Markdown (anything else); interrupted answers are marked."""
        if path.suffix.lower() == ".json":
            turns = [{"role": t.role, "content": t.content, **({"interrupted": True} if t.interrupted else {}),
                      **({"images": [image.name for image in t.images]} if t.images else {})} for t in self.turns]
            body = json.dumps({"system": self.system, "turns": turns}, indent=2, ensure_ascii=False) + "\n"
        else:
            parts = [f"**system:** {self.system}\n"] if self.system else []
            parts += [f"**{t.role}:**{' _(interrupted)_' if t.interrupted else ''}"
                      f"{''.join(f' ![]({image.name})' for image in t.images)} {t.content}\n" for t in self.turns]
            body = "\n".join(parts)
        try:
            path.write_text(body, encoding="utf-8")
        except OSError as exc:
            raise SpecError(f"cannot write {path}: {exc.strerror}") from exc


# /set names of the sampling settings, with the SamplingParams field and the type of each.
SAMPLING_FIELDS: dict[str, tuple[str, type]] = {
    "temp": ("temperature", float), "top-k": ("top_k", int), "top-p": ("top_p", float), "min-p": ("min_p", float),
    "repeat-penalty": ("repeat_penalty", float), "repeat-last-n": ("repeat_last_n", int),
    "presence-penalty": ("presence_penalty", float), "frequency-penalty": ("frequency_penalty", float),
}
# /set names of the request's other fields, with the field and how the value is read.
REQUEST_FIELDS: dict[str, tuple[str, Callable[[str], object]]] = {
    "k": ("draft_max", draft_max_from_text), "verify": ("verify", str), "max-tokens": ("max_tokens", int),
    "mode": ("draft_mode", str), "p-min": ("draft_p_min", float),
}
# /set names of the structured-output settings, by `Constraint` field; "off" clears the constraint.
CONSTRAINT_FIELDS = {"grammar": "grammar", "grammar-file": "grammar_file", "json-schema": "json_schema",
                     "json-schema-file": "json_schema_file"}
CLEAR = "off"
SET_NAMES = {field_name: key for key, (field_name, _parse) in REQUEST_FIELDS.items()}  # for messages
SET_NAMES |= {field_name: key for key, field_name in CONSTRAINT_FIELDS.items()}
SETTING_NAMES = ("k", *SAMPLING_FIELDS, "verify", "max-tokens", "mode", "p-min", *CONSTRAINT_FIELDS)

COMMANDS = {
    "/help": "this list",
    "/stats": "totals for the session and acceptance by draft position",
    "/reset": "forget the conversation (the system message stays)",
    "/system TEXT": "set the system message (empty: none) and start over",
    "/set NAME VALUE": f"{', '.join(SETTING_NAMES)} (/set alone shows them)",
    "/draft on|off": "speculate, or let the target answer alone, to compare",
    "/image FILE": "attach an image to the next message (the conversation keeps it)",
    "/save FILE": "write the conversation as JSON (.json) or Markdown",
    "/exit": "leave (Ctrl-D too)",
}


class Exit(Exception):
    """/exit was asked for."""


def run_command(session: ChatSession, line: str) -> str | None:
    """Carry out a slash command; return what to tell the user (None for /stats and /help, drawn by the UI)."""
    name, _, argument = line.strip().partition(" ")
    argument = argument.strip()
    if name == "/exit":
        raise Exit
    if name in ("/help", "/stats"):
        return None
    if name == "/reset":
        session.reset()
        return "conversation cleared"
    if name == "/system":
        session.set_system(argument)
        session.reset()
        return f"system message {'set' if argument else 'removed'}; conversation cleared"
    if name == "/draft":
        if argument not in ("on", "off"):
            raise SpecError("usage: /draft on|off")
        if argument == "on" and session.pair.mode_for(session.settings) not in session.pair.drafting_modes:
            raise SpecError("no draft model is loaded (start spec chat with one, or /set mode ngram)")
        session.settings = replace(session.settings, use_draft=argument == "on")
        return f"drafting {argument}"
    if name == "/set":
        session.settings, said = _set(session.settings, argument)
        return said
    if name == "/image":
        if not argument:
            raise SpecError("usage: /image FILE")
        return session.attach(Path(argument).expanduser())
    if name == "/save":
        if not argument:
            raise SpecError("usage: /save FILE (.json or .md)")
        session.save(Path(argument).expanduser())
        return f"saved to {argument}"
    raise SpecError(f"unknown command {name}; known: {', '.join(c.split()[0] for c in COMMANDS)}")


def _set(settings: Settings, argument: str) -> tuple[Settings, str]:
    """The settings with one changed, and what to say; the request checks the value as it checks every face's."""
    key, _, value = argument.partition(" ")
    value = value.strip()
    if not key:
        return settings, settings.describe()
    if key not in SETTING_NAMES:
        raise SpecError(f"usage: /set {'|'.join(SETTING_NAMES)} VALUE")
    try:
        if key in SAMPLING_FIELDS:
            field_name, kind = SAMPLING_FIELDS[key]
            changed = replace(settings, sampling=replace(settings.sampling, **{field_name: kind(value)}))
        elif key in CONSTRAINT_FIELDS:
            if value == CLEAR:
                return replace(settings, grammar=None), "output no longer constrained"
            kind = CONSTRAINT_FIELDS[key]
            given = Path(value).expanduser() if kind.endswith("_file") else value
            what = "JSON schema" if kind.startswith("json") else "grammar"
            return (replace(settings, grammar=Constraint(**{kind: given}).compiled()),
                    f"output constrained by the {what} ({CLEAR} clears it)")
        else:
            field_name, parse = REQUEST_FIELDS[key]
            changed = replace(settings, **{field_name: parse(value)})
    except ValueError:
        raise SpecError(f"bad value for {key}: {value!r}") from None
    except InvalidRequest as exc:
        raise SpecError(exc.named(SET_NAMES)) from None
    return changed, f"{key} = {value}"
