"""Constraints as the faces take them: grammars and JSON schemas compiled by llguidance before any model loads,
every keyword enforced or refused by name and path (strict), or listed as unenforced (not strict); and a
corpus of schemas whose every completed walk over the mask validates."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from spec_cli import Pair
from spec_cli.llama.grammar import Constraints
from spec_cli.request import InvalidConstraint
from spec_cli.formats.structured import Constraint, keyword_paths, schema_grammar

NAME_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
NODE = {"type": "object", "properties": {"value": {"type": "integer"},
                                         "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
        "required": ["value", "next"], "additionalProperties": False}
# Every keyword llguidance enforces, and what Pydantic and OpenAI's function-calling examples send.
CORPUS = {
    "minimum and maximum": {"type": "object", "properties": {"age": {"type": "integer", "minimum": 60,
                                                                     "maximum": 90}}, "required": ["age"]},
    "required without properties": {"type": "object", "required": ["name"]},
    "multipleOf": {"type": "integer", "multipleOf": 7},
    "exclusiveMinimum": {"type": "number", "exclusiveMinimum": 1000},
    "maxProperties and patternProperties": {"type": "object", "maxProperties": 1,
                                            "patternProperties": {"^x": {"type": "integer"}},
                                            "additionalProperties": False},
    "prefixItems": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "boolean"}], "items": False},
    "minItems and maxItems": {"type": "array", "items": {"enum": [1, 2]}, "minItems": 1, "maxItems": 2},
    "allOf": {"allOf": [{"type": "integer"}, {"minimum": 3}]},
    "format date": {"type": "string", "format": "date"},
    "string lengths and pattern": {"type": "string", "minLength": 2, "maxLength": 4, "pattern": "^[a-c]+$"},
    "enum with escapes and emoji": {"enum": ["C:\\temp", "a\nb", "😀", "q\"x"]},
    "const with a newline": {"const": "a\nb"},
    "property name with a quote": {"type": "object", "properties": {"a\"b": {"type": "string", "maxLength": 3}},
                                   "required": ["a\"b"], "additionalProperties": False},
    "Pydantic recursive model ($ref at the root)": {"$ref": "#/$defs/node", "$defs": {"node": NODE}},
    "Pydantic optional and union": {"type": "object", "properties": {
        "x": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 3}]},
        "y": {"anyOf": [{"type": "boolean"}, {"type": "null"}], "default": None}}, "required": ["x"]},
    "OpenAI's chain of thought": {"type": "object", "properties": {
        "steps": {"type": "array", "items": {"type": "object", "properties": {
            "explanation": {"type": "string"}, "output": {"type": "string"}},
            "required": ["explanation", "output"], "additionalProperties": False}},
        "final_answer": {"type": "string"}}, "required": ["steps", "final_answer"], "additionalProperties": False},
    "OpenAI's recursive UI": {"type": "object", "properties": {
        "type": {"type": "string", "enum": ["div", "button", "header", "section", "field", "form"]},
        "label": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}},
        "attributes": {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string"}, "value": {"type": "string"}},
            "required": ["name", "value"], "additionalProperties": False}}},
        "required": ["type", "label", "children", "attributes"], "additionalProperties": False},
    "OpenAI get_weather": {"type": "object", "properties": {
        "location": {"type": "string", "description": "City and country e.g. Bogotá, Colombia", "maxLength": 6},
        "units": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["location", "units"], "additionalProperties": False},
}


@pytest.mark.parametrize("name", CORPUS)
def test_every_completed_walk_over_the_mask_validates(alone: Pair, name: str) -> None:
    """Random walks over the allowed tokens (seeded), ended where the end of generation is allowed: each text
    is JSON the schema accepts, so no keyword is silently dropped. Half the steps take a token that closes
    something where one is allowed (a quote, a bracket, a brace), so that walks end."""
    schema = CORPUS[name]
    model, rng = alone.target, np.random.default_rng(0)
    constraints = Constraints(model)
    ends, completed = set(model.end_of_generation_tokens.tolist()), 0
    closing = {t for t in range(model.n_vocab) if model.piece(t) in (b'"', b"]", b"}")}
    for _ in range(12):
        state, text = constraints.start(schema_grammar(schema).grammar), b""
        for _ in range(120):
            allowed = set(state.allowed_tokens().tolist())
            if ends & allowed and rng.random() < 0.5:
                jsonschema.validate(json.loads(text), schema)
                completed += 1
                break
            closers = sorted(allowed & closing) if rng.random() < 0.5 else []
            token = int(rng.choice(closers or sorted(allowed - ends) or sorted(allowed)))
            state.accept(token)
            text += model.piece(token)
    assert completed >= 3


@pytest.mark.parametrize("schema, refusal", [
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uses uniqueItems at /, which"),
    ({"type": "object", "properties": {"v": {"not": {"enum": ["x"]}}}}, "uses not at /properties/v, which"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "uses oneOf at /, which cannot be enforced (it would "
                                                           "be read as anyOf)"),
    ({"type": "array", "minItems": 3, "maxItems": 1}, "cannot be used: Unsatisfiable schema: minItems (3) is "
                                                      "greater than maxItems (1)"),
    ({"type": "string", "pattern": "^[z-a]$"}, "cannot be used: regex parse error"),
    ({"type": "string", "pattern": "^[^\\s\\S]$"}, "cannot be used: Unsatisfiable schema: Regex is empty"),
    ({"$ref": "https://example.com/s.json"}, "has a $ref to a remote schema; nothing is fetched"),
    ({"$ref": "#/definitions/missing"}, "cannot be used: Pointer '/definitions/missing' does not exist"),
    ({"type": "strng"}, "cannot be used: Invalid type: strng"),
    ({"type": "object", "required": "a"}, "cannot be used: Expected array for 'required', got \"a\""),
    ({"type": "object", "properties": [1]}, "cannot be used: properties must be an object"),
])
def test_a_strict_schema_is_refused_naming_the_keyword_or_the_rule(schema: dict, refusal: str) -> None:
    with pytest.raises(InvalidConstraint) as caught:
        schema_grammar(schema)
    message = caught.value.named({"json_schema": "'json_schema'"})
    assert message.startswith(f"'json_schema' {refusal}") and "\n" not in message and "object has no" not in message


def test_a_schema_that_is_not_strict_lists_what_it_leaves_unenforced() -> None:
    schema = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True},
                                               "n": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}}
    structure = schema_grammar(schema, strict=False)
    assert structure.unenforced == ("uniqueItems at /properties/tags", "oneOf at /properties/n (read as anyOf)")
    assert schema_grammar(NAME_SCHEMA, strict=False).unenforced == ()
    assert schema_grammar({"type": "string", "format": "colour"}, strict=False).unenforced == ("format 'colour' at /",)


def test_keyword_paths_walk_every_subschema_and_escape_names() -> None:
    schema = {"$defs": {"a/b": {"not": {}}}, "anyOf": [{}, {"items": {"not": {}}}], "properties": {"not": {}}}
    assert keyword_paths(schema, "not") == ["/$defs/a~1b", "/anyOf/1/items"]


@pytest.mark.parametrize("schema, message", [
    ("{not json", "'json_schema' is not valid JSON: Expecting property name enclosed in double quotes at line 1"),
    ("[1, 2]", "'json_schema' must be a JSON object (a JSON Schema), got [1, 2]"),
])
def test_text_that_is_not_a_schema_is_one_line(schema: str, message: str) -> None:
    with pytest.raises(InvalidConstraint) as caught:
        schema_grammar(schema)
    assert caught.value.named({"json_schema": "'json_schema'"}).startswith(message)


@pytest.mark.parametrize("text, reason", [
    ('root ::= "a', "does not parse: Unexpected end of input at line 1"),
    ("root ::= missing", "does not parse: Rule 'missing' not found"),
    ('start: "a" | nothing', "does not parse: "),
    ('start ::= "a"', "does not parse: a GBNF grammar starts at its 'root' rule, and this one has none"),
])
def test_a_grammar_that_does_not_parse_is_refused_before_a_model_loads(text: str, reason: str) -> None:
    with pytest.raises(InvalidConstraint) as caught:
        Constraint(grammar=text).compiled()
    assert caught.value.named({"grammar": "--grammar"}).startswith(f"--grammar {reason}")


def test_gbnf_and_lark_mean_the_same(alone: Pair) -> None:
    constraints = Constraints(alone.target)
    gbnf, lark = (constraints.start(Constraint(grammar=text).compiled())
                  for text in ('root ::= "yes" | "no"', 'start: "yes" | "no"'))
    np.testing.assert_array_equal(gbnf.mask(), lark.mask())
    assert 2 <= gbnf.mask().sum() <= 8


def test_files_are_read_and_their_mistakes_named(tmp_path: Path) -> None:
    (tmp_path / "g.gbnf").write_text('root ::= "yes" | "no"\n', encoding="utf-8")
    (tmp_path / "s.json").write_text(json.dumps(NAME_SCHEMA), encoding="utf-8")
    yes_or_no = Constraint(grammar='root ::= "yes" | "no"').compiled()
    assert Constraint(grammar_file=tmp_path / "g.gbnf").compiled() == yes_or_no
    assert Constraint(json_schema_file=tmp_path / "s.json").compiled() == schema_grammar(NAME_SCHEMA).grammar
    assert Constraint().compiled() is None
    with pytest.raises(InvalidConstraint, match="grammar_file: file not found: .*nope.gbnf"):
        Constraint(grammar_file=tmp_path / "nope.gbnf").compiled()
    (tmp_path / "bad.json").write_text("{", encoding="utf-8")
    with pytest.raises(InvalidConstraint) as caught:
        Constraint(json_schema_file=tmp_path / "bad.json").compiled()
    assert caught.value.field == "json_schema_file"
    with pytest.raises(InvalidConstraint, match="json_schema cannot be given with another constraint"):
        Constraint(grammar='root ::= "a"', json_schema="{}").compiled()
