"""Constraints as the faces take them: grammars checked before any model loads, JSON schemas through llama.cpp's
converter, each mistake one line naming its field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spec_cli.request import InvalidConstraint
from spec_cli.structured import Constraint, schema_grammar

NAME_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def test_a_schema_becomes_the_converters_grammar() -> None:
    gbnf = schema_grammar(json.dumps(NAME_SCHEMA))
    assert gbnf == schema_grammar(NAME_SCHEMA)
    assert 'root ::= "{" space name-kv "}" space' in gbnf.splitlines()


@pytest.mark.parametrize("schema, message", [
    ("{not json", "'json_schema' is not valid JSON: Expecting property name enclosed in double quotes at line 1"),
    ("[1, 2]", "'json_schema' must be a JSON object (a JSON Schema), got [1, 2]"),
    ('{"type": "strng"}', "'json_schema' is not a JSON Schema this converter supports: Unrecognized schema"),
    ('{"$ref": "#/definitions/missing"}', "'json_schema' is not a JSON Schema this converter supports: Error "
                                          "resolving ref"),
    ('{"$ref": "https://example.com/s.json"}', "'json_schema' is not a JSON Schema this converter supports: a $ref "
                                                "to a remote schema; nothing is fetched"),
])
def test_a_schema_the_converter_cannot_take_is_one_line(schema: str, message: str) -> None:
    with pytest.raises(InvalidConstraint) as caught:
        schema_grammar(schema)
    assert caught.value.named({"json_schema": "'json_schema'"}).startswith(message)


@pytest.mark.parametrize("gbnf, reason", [
    ('root ::= "a', "does not parse: unexpected end of input"),
    ("root ::= missing", "does not parse: Undefined rule identifier 'missing'"),
    ('start ::= "a"', "does not parse: grammar does not contain a 'root' symbol"),
    ('root ::= root "a"', "does not parse: unsupported grammar, left recursion detected"),
])
def test_a_grammar_that_does_not_parse_is_refused_before_a_model_loads(gbnf: str, reason: str) -> None:
    with pytest.raises(InvalidConstraint) as caught:
        Constraint(grammar=gbnf).gbnf()
    assert caught.value.named({"grammar": "--grammar"}).startswith(f"--grammar {reason}")


def test_files_are_read_and_their_mistakes_named(tmp_path: Path) -> None:
    (tmp_path / "g.gbnf").write_text('root ::= "yes" | "no"\n', encoding="utf-8")
    (tmp_path / "s.json").write_text(json.dumps(NAME_SCHEMA), encoding="utf-8")
    assert Constraint(grammar_file=tmp_path / "g.gbnf").gbnf() == 'root ::= "yes" | "no"\n'
    assert Constraint(json_schema_file=tmp_path / "s.json").gbnf() == schema_grammar(NAME_SCHEMA)
    assert Constraint().gbnf() is None
    with pytest.raises(InvalidConstraint, match="grammar_file: file not found: .*nope.gbnf"):
        Constraint(grammar_file=tmp_path / "nope.gbnf").gbnf()
    (tmp_path / "bad.json").write_text("{", encoding="utf-8")
    with pytest.raises(InvalidConstraint) as caught:
        Constraint(json_schema_file=tmp_path / "bad.json").gbnf()
    assert caught.value.field == "json_schema_file"
    with pytest.raises(InvalidConstraint, match="json_schema cannot be given with another constraint"):
        Constraint(grammar='root ::= "a"', json_schema="{}").gbnf()
