"""Structured output: the grammar a face's constraint stands for, as llguidance takes it (`llama.grammar`).

A grammar is GBNF as llama.cpp writes it, or a Lark grammar; a JSON schema goes through llguidance's own
compiler, which enforces every keyword it accepts. A keyword it cannot enforce is never silently dropped:
a strict schema (the default for the CLI and tools, OpenAI's `strict: true`) is refused naming the keyword
and where it stands; a non-strict one is enforced in every other keyword and the answer lists what was not
(`Structure.unenforced`). Everything here runs without a model, so a face refuses a mistake before any loads.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import llguidance

from spec_cli.llama import grammar
from spec_cli.llama.grammar import GrammarError, one_line
from spec_cli.request import InvalidConstraint, shown

# OpenAI's `{"type": "json_object"}`: any JSON object, as llama-server constrains it.
ANY_OBJECT: dict[str, Any] = {"type": "object"}
# Whitespace between JSON tokens as llama.cpp's converter allows it: a space, or a new line and an indent of
# up to 20, so that a grammar never lets a model pad an answer with blanks until max_tokens. Escapes such as
# \u00e9 (json.dumps writes them) are allowed in strings that have no pattern; raw control characters never are.
JSON_OPTIONS = {"whitespace_pattern": r"(?: |\n[ \t]{0,20})", "json_allow_general_unicode_escapes": True}
UNIMPLEMENTED = re.compile(r"Unimplemented keys: (\[.*?\])")
UNKNOWN_FORMAT = re.compile(r"Unknown format: (.+)")
ONE_OF = "oneOf constraints are not supported"
ONE_OF_READ_AS_ANY_OF = "oneOf not fully supported"


@dataclass(frozen=True)
class Structure:
    """A constraint ready for a `GenerationRequest`: llguidance's grammar, and the keywords of a non-strict
    schema it leaves unenforced (`"uniqueItems at /properties/tags"`)."""

    grammar: str
    unenforced: tuple[str, ...] = ()


@dataclass(frozen=True)
class Constraint:
    """A constraint as a face takes it (flags, `/set`): a grammar, a grammar file, a JSON schema or a schema
    file; one of them, or none. Schemas are strict here: the command line has no answer to list what a
    schema left unenforced in."""

    grammar: str | None = None
    grammar_file: Path | None = None
    json_schema: str | None = None
    json_schema_file: Path | None = None

    def compiled(self) -> str | None:
        """The grammar this stands for (None: no constraint), checked before any model loads."""
        given = [(name, value) for name, value in vars(self).items() if value is not None]
        if len(given) > 1:
            raise InvalidConstraint(given[1][0], "{name} cannot be given with another constraint: give one")
        if not given:
            return None
        (name, value), = given
        if name.endswith("_file"):
            value = read_text(value, name)
        if name.startswith("json_schema"):
            return schema_grammar(value, name).grammar
        return grammar_structure(value, name)


def grammar_structure(text: str, field: str = "grammar") -> str:
    """llguidance's grammar for GBNF or Lark `text`, checked; one line naming `field` when it cannot be used."""
    try:
        compiled = grammar.llguidance_grammar(text)
        grammar.check(compiled)
    except GrammarError as exc:
        raise InvalidConstraint(field, f"{{name}} {exc.reason}") from None
    return compiled


def schema_grammar(schema: object, field: str = "json_schema", strict: bool = True) -> Structure:
    """The grammar of the JSON values `schema` (a JSON Schema: a dict, or its JSON text) accepts.

    Strict: a keyword llguidance cannot enforce is refused by name and path. Not strict: `oneOf` is read as
    `anyOf` and keywords it cannot enforce are left out, each listed in `Structure.unenforced`."""
    schema = _schema_object(schema, field)
    options = {**JSON_OPTIONS, "lenient": not strict, "coerce_one_of": not strict}
    try:
        compiled = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=options)
    except ValueError as exc:
        raise InvalidConstraint(field, f"{{name}} is not a JSON Schema: {one_line(str(exc))}") from None
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(compiled, None)
    if failed:
        raise InvalidConstraint(field, f"{{name}} {_refusal(schema, one_line(messages[0]))}")
    unenforced = [place for message in messages for place in _left_out(schema, one_line(message))]
    if not strict:
        unenforced += [f"oneOf at {path} (read as anyOf)" for path in keyword_paths(schema, "oneOf")]
    return Structure(compiled, tuple(unenforced))


def _schema_object(schema: object, field: str) -> dict[str, Any]:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise InvalidConstraint(field, f"{{name}} is not valid JSON: {exc.msg} at line {exc.lineno} column "
                                        f"{exc.colno}") from None
    if not isinstance(schema, dict):
        raise InvalidConstraint(field, f"{{name}} must be a JSON object (a JSON Schema), got {shown(schema)}")
    return schema


def _refusal(schema: dict[str, Any], message: str) -> str:
    """Why llguidance refused `schema`, in words that name the keyword and where it stands."""
    keywords = _unimplemented(message) or (["oneOf"] if message.startswith(ONE_OF) else [])
    if keywords:
        places = [f"{keyword} at {path}" for keyword in keywords for path in keyword_paths(schema, keyword)]
        read = " (it would be read as anyOf)" if keywords == ["oneOf"] else ""
        return (f"uses {', '.join(places or keywords)}, which cannot be enforced{read}: remove it (spec serve "
                "also takes the schema with \"strict\": false, enforcing the rest and listing it as unenforced)")
    if message.startswith("Resource ") and "retrieving it failed" in message:
        return "has a $ref to a remote schema; nothing is fetched: put that schema in place of the $ref"
    return f"cannot be used: {message}"


def _left_out(schema: dict[str, Any], warning: str) -> list[str]:
    """What a warning of a non-strict compile says was left unenforced, by keyword and place."""
    keywords = _unimplemented(warning)
    if keywords:
        return [f"{keyword} at {path}" for keyword in keywords for path in keyword_paths(schema, keyword)]
    if warning.startswith(ONE_OF_READ_AS_ANY_OF):
        return []  # listed with its places by `schema_grammar`
    unknown = UNKNOWN_FORMAT.fullmatch(warning)
    if unknown:
        return [f"format {unknown.group(1)!r} at {path}" for path in keyword_paths(schema, "format")]
    return [warning]


def _unimplemented(message: str) -> list[str]:
    found = UNIMPLEMENTED.search(message)
    return json.loads(found.group(1)) if found else []


# Where JSON Schema keeps subschemas: one under the keyword, a list of them, or a map of names to them.
ONE_SCHEMA = ("items", "additionalProperties", "additionalItems", "not", "if", "then", "else", "contains",
              "propertyNames", "unevaluatedItems", "unevaluatedProperties")
SCHEMA_LIST = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
SCHEMA_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def keyword_paths(schema: object, keyword: str, at: str = "") -> list[str]:
    """JSON pointers to the subschemas of `schema` that use `keyword` ("/" for the root)."""
    return [path or "/" for path in _keyword_paths(schema, keyword, at)]


def _keyword_paths(schema: object, keyword: str, at: str) -> Iterator[str]:
    if not isinstance(schema, dict):
        return
    if keyword in schema:
        yield at
    for name, value in schema.items():
        if name in ONE_SCHEMA:
            yield from _keyword_paths(value, keyword, f"{at}/{name}")
        if name in SCHEMA_LIST and isinstance(value, list):
            for i, item in enumerate(value):
                yield from _keyword_paths(item, keyword, f"{at}/{name}/{i}")
        if name in SCHEMA_MAP and isinstance(value, dict):
            for key, item in value.items():
                escaped = str(key).replace("~", "~0").replace("/", "~1")
                yield from _keyword_paths(item, keyword, f"{at}/{name}/{escaped}")


def read_text(path: Path, field: str) -> str:
    """A grammar or schema file's text, or one line naming `field` that says why it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidConstraint(field, f"{{name}}: file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InvalidConstraint(field, f"{{name}}: cannot read {path}: {reason}") from None


@dataclass(frozen=True)
class Thought:
    """A template that lets its model think before it answers: the thought's markers, and whether the prompt
    opens the thought (Qwen3.5/3.6, DeepSeek-R1) or the model may open one itself (Qwen3)."""

    opened: bool
    open: str = "<think>"
    close: str = "</think>"


def after_thought(compiled: str, thought: Thought, gap: bool = True,
                  spell: Callable[[str], str] | None = None) -> str:
    """llguidance's grammar `compiled` with a free thought in front of it, as llama.cpp puts an optional
    `<think>…</think>` before a grammar on a thinking template: any text up to the thought's close marker
    (where the grammar wakes), after an open marker unless the prompt opened it. `gap`: whitespace may come
    between the thought and what `compiled` allows (a grammar that starts with text of its own takes none);
    `spell` writes the markers (a model's control tokens as themselves), by default as text."""
    spell = spell or json.dumps
    grammars = json.loads(compiled)["grammars"] if compiled.lstrip().startswith("{") else [{"lark_grammar": compiled}]
    answer = grammars[0].get("name") or "answer"
    grammars[0] = {**grammars[0], "name": answer}
    thought_rule = "thought" if thought.opened else f"({spell(thought.open)} thought)?"
    close = spell(thought.close)
    # Text up to the close marker: lazily where the marker is text; a control token ends the text by itself.
    body = f"thought: THOUGHT {close}\nTHOUGHT: /(?s:.*)/" if close.startswith("<[") else \
        f"thought[lazy]: /(?s:.*)/ {close}"
    lark = f"start: {thought_rule} {'GAP ' if gap else ''}@{answer}\n{body}\n" + ("GAP: /[ \\t\\n]*/\n" if gap else "")
    return json.dumps({"grammars": [{"lark_grammar": lark}, *grammars]})


REGEX_SPECIAL = set("\\.+*?()|[]{}^$#&-~/")


def lazy_start(trigger: str, then: str) -> list[str]:
    """Lark rules of a lazy grammar, llama.cpp's for tool calls: `start` is any text without `trigger`, or text
    up to the first `trigger` and rule `then` from there. Before the trigger nothing is constrained but that
    text (an end of generation is allowed); from it on, `then` decides every token."""
    escaped = "".join(f"\\{c}" if c in REGEX_SPECIAL else c for c in trigger)  # Rust's regex, between slashes
    return [f"start: TEXT | text_then_trigger {then}", f"TEXT: /(?s:.*)/ & ~/(?s:.*{escaped}.*)/",
            f"text_then_trigger[lazy]: /(?s:.*)/ {json.dumps(trigger)}"]
