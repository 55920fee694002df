"""Structured output: the GBNF grammar a face's constraint stands for (a grammar as written, or a JSON schema
turned into one by llama-cpp-python's own converter, the Python port of llama.cpp's), so that `--grammar` and
`--json-schema` mean what they mean to llama.cpp. The grammar then runs on llama.cpp's grammar sampler
(`llama.grammar`), parsed against the target's vocabulary when a generation starts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llama_cpp.llama_grammar import json_schema_to_gbnf

from spec_cli.llama import grammar
from spec_cli.llama.grammar import GrammarError
from spec_cli.request import InvalidConstraint, shown

# OpenAI's `{"type": "json_object"}`: any JSON object, as llama-server constrains it.
ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class Constraint:
    """A constraint as a face takes it (flags, `/set`): a grammar, a grammar file, a JSON schema or a schema
    file; one of them, or none."""

    grammar: str | None = None
    grammar_file: Path | None = None
    json_schema: str | None = None
    json_schema_file: Path | None = None

    def gbnf(self) -> str | None:
        """The grammar this stands for (None: no constraint), checked before any model loads: a grammar that
        does not parse, or a schema the converter cannot take, is refused naming its field."""
        given = [(name, value) for name, value in vars(self).items() if value is not None]
        if len(given) > 1:
            raise InvalidConstraint(given[1][0], "{name} cannot be given with another constraint: give one")
        if not given:
            return None
        (name, value), = given
        if name.endswith("_file"):
            value = read_text(value, name)
        gbnf = schema_grammar(value, name) if name.startswith("json_schema") else value
        try:
            grammar.check(gbnf)
        except GrammarError as exc:
            raise InvalidConstraint(name, f"{{name}} {exc.reason}") from None
        return gbnf


def schema_grammar(schema: object, field: str = "json_schema") -> str:
    """GBNF for the JSON values `schema` (a JSON Schema: a dict, or its JSON text) accepts.

    The converter's refusals (a type it does not know, a `$ref` it cannot resolve, a remote `$ref`, a pattern
    without ^…$) become one line naming `field`."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise InvalidConstraint(field, f"{{name}} is not valid JSON: {exc.msg} at line {exc.lineno} column "
                                        f"{exc.colno}") from None
    if not isinstance(schema, dict):
        raise InvalidConstraint(field, f"{{name}} must be a JSON object (a JSON Schema), got {shown(schema)}")
    try:
        return json_schema_to_gbnf(json.dumps(schema))
    except (AssertionError, ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        if reason.startswith("Fetching remote schemas is not allowed"):
            reason = "a $ref to a remote schema; nothing is fetched: put that schema in place of the $ref"
        raise InvalidConstraint(field, f"{{name}} is not a JSON Schema this converter supports: "
                                    f"{reason if len(reason) <= 200 else reason[:199] + '…'}") from None


def read_text(path: Path, field: str) -> str:
    """A grammar or schema file's text, or one line naming `field` that says why it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidConstraint(field, f"{{name}}: file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InvalidConstraint(field, f"{{name}}: cannot read {path}: {reason}") from None
