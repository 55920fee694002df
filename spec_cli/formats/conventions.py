"""Tool-call conventions: how each model family writes a call, read off its own chat template.

A chat template that takes `tools` shows how the model was taught to call them when it renders a past call.
`detect` renders one probe call through the template and looks for each known convention's signature in the
text (what the template writes, never the model's name); a template that writes calls some other way keeps
the generic convention (Hermes' `<tool_call>` JSON, what most templates and the spelt-out tools use).

Each `Convention` is one description from which three things are made: the grammar of forced and lazy calls
(`call_grammar`), the reading of an answer's calls (`Reading`, streamed by `tool_calls.AnswerSplitter`), and
the writing of calls (`written`: the history of a template that knows nothing of tools). Its text around a
call: `begin` before the first, `call_open` before each, the call's body in its `shape`, `call_close` after
each, `between` two, `end` after the last. The lazy grammar's trigger is `begin + call_open`; a convention
without one (Llama 3.x's bare JSON) calls only at the start of an answer, as llama.cpp reads it.

Shapes: "object" (`{"name": …, "<arguments_key>": {…}}`), "named" (the name, `name_close`, the arguments as
JSON), "xml" (`NAME>` and `<parameter=KEY>\\nVALUE\\n</parameter>\\n` each, Qwen3-Coder and Qwen3.5/3.6) and
"pythonic" (`NAME(key=value, …)`, LFM2).
"""

from __future__ import annotations

import ast
import json
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

JSON_WHITESPACE = r"(?: |\n[ \t]{0,20})"  # as `structured.JSON_OPTIONS`: no padding until max_tokens
PROBE_NAME, PROBE_KEY = "spec_probe_tool", "spec_probe_key"
Functions = dict[str, dict[str, Any]]  # the listed functions by name
Spell = Callable[[str], str]  # a marker as Lark writes it: text, or a model's control token as itself
XML_VALUE_CLOSE = "\n</parameter>\n"


@dataclass(frozen=True)
class Convention:
    name: str
    writers: str  # the families whose templates write it (docs and `spec models check`)
    signature: str  # a regex on a rendered probe call; {name} stands for the probe function's name
    shape: str
    call_open: str
    call_close: str
    begin: str = ""
    end: str = ""
    between: str = "\n"
    name_close: str = ""  # "named": between the name and the arguments
    arguments_key: str = "arguments"  # "object"
    think_open: str = "<think>"
    think_close: str = "</think>"
    dropped: tuple[str, ...] = ()  # markers that are neither content nor a call (harmony's channels)

    @property
    def trigger(self) -> str | None:
        """The text that starts a call anywhere in an answer; None: a call is the whole answer."""
        return (self.begin + self.call_open) or None

    def written(self, calls: Sequence[tuple[str, dict[str, Any]]]) -> str:
        """`calls` (name, arguments) as a model of this convention writes them."""
        bodies = [self.call_open + _BODY_WRITERS[self.shape](self, name, arguments) + self.call_close
                  for name, arguments in calls]
        return self.begin + self.between.join(bodies) + self.end if bodies else ""

    def calls_grammar(self, functions: Sequence[dict[str, Any]], most: int,
                      spell: Spell | None = None) -> tuple[str, list[str]]:
        """Lark: (the calls' text after the trigger, or whole when there is none, as rule `calls`; the rules it
        uses), for 1 to `most` calls of `functions`. `spell` writes a marker for the grammar (a model's control
        tokens as themselves, `Dialect.spell`); by default as text."""
        spell = spell or _lit
        rules = [f"call: {spell(self.call_open)} body {spell(self.call_close)}",
                 *_BODY_GRAMMARS[self.shape](self, functions, spell)]
        more = f" ({spell(self.between)} call){{0,{most - 1}}}" if most > 1 else ""
        first = ("body " + spell(self.call_close)) if self.trigger else "call"
        return f"calls: {first}{more} {spell(self.end)}".rstrip(), rules


def _lit(text: str) -> str:
    return json.dumps(text) if text else ""


def _json_schema(schema: dict[str, Any]) -> str:
    return "%json " + json.dumps({**schema, "x-guidance": {"whitespace_pattern": JSON_WHITESPACE,
                                                           "json_allow_general_unicode_escapes": True,
                                                           "lenient": True, "coerce_one_of": True}})


def _write_object(convention: Convention, name: str, arguments: dict[str, Any]) -> str:
    return json.dumps({"name": name, convention.arguments_key: arguments}, ensure_ascii=False)


def _write_named(convention: Convention, name: str, arguments: dict[str, Any]) -> str:
    return f"{name}{convention.name_close}{json.dumps(arguments, ensure_ascii=False)}"


def _write_xml(convention: Convention, name: str, arguments: dict[str, Any]) -> str:
    params = "".join(f"<parameter={key}>\n{value if isinstance(value, str) else json.dumps(value)}{XML_VALUE_CLOSE}"
                     for key, value in arguments.items())
    return f"{name}>\n{params}"


def _write_pythonic(convention: Convention, name: str, arguments: dict[str, Any]) -> str:
    return f"{name}({', '.join(f'{key}={_python_literal(value)}' for key, value in arguments.items())})"


def _python_literal(value: object) -> str:
    return repr(value) if isinstance(value, (bool, type(None))) else json.dumps(value, ensure_ascii=False)


_BODY_WRITERS: dict[str, Callable[[Convention, str, dict[str, Any]], str]] = {
    "object": _write_object, "named": _write_named, "xml": _write_xml, "pythonic": _write_pythonic}


def _object_body(convention: Convention, functions: Sequence[dict[str, Any]], spell: Spell) -> list[str]:
    calls = [{"type": "object", "properties": {"name": {"const": f["name"]}, convention.arguments_key: f["parameters"]},
              "required": ["name", convention.arguments_key], "additionalProperties": False} for f in functions]
    return [f"body: {_json_schema(calls[0] if len(calls) == 1 else {'anyOf': calls})}"]


def _named_body(convention: Convention, functions: Sequence[dict[str, Any]], spell: Spell) -> list[str]:
    return ["body: " + " | ".join(f"{_lit(f['name'])} {spell(convention.name_close)} {_json_schema(f['parameters'])}"
                                  for f in functions)]


def _xml_body(convention: Convention, functions: Sequence[dict[str, Any]], spell: Spell) -> list[str]:
    rules = ["body: " + " | ".join(f"fn_{i}" for i in range(len(functions))),
             f"text_value[lazy]: /(?s:.*)/ {_lit(XML_VALUE_CLOSE)}"]
    for i, function in enumerate(functions):
        params = []
        for j, (key, schema, required) in enumerate(_properties(function)):
            value = ("text_value" if _is_text(schema) else f"{_xml_choices(schema)} {_lit(XML_VALUE_CLOSE)}")
            rules.append(f"fn_{i}_{j}: {_lit(f'<parameter={key}>' + chr(10))} {value}")
            params.append(f"fn_{i}_{j}" + ("" if required else "?"))
        rules.append(f"fn_{i}: {_lit(function['name'] + '>' + chr(10))} {' '.join(params)}".rstrip())
    return rules


def _xml_choices(schema: dict[str, Any]) -> str:
    """A parameter's value that is not free text: a string enum's values as written, else JSON."""
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if values and all(isinstance(value, str) for value in values):
        return "(" + " | ".join(_lit(value) for value in values) + ")"
    return _json_schema(schema)


def _pythonic_body(convention: Convention, functions: Sequence[dict[str, Any]], spell: Spell) -> list[str]:
    rules = ["body: " + " | ".join(f"fn_{i}" for i in range(len(functions)))]
    for i, function in enumerate(functions):
        properties = _properties(function)
        for j, (key, schema, _) in enumerate(properties):
            rules.append(f"fn_{i}_{j}: {_lit(key + '=')} {_python_value(schema)}")
        rules += _separated(f"fn_{i}_s", [(f"fn_{i}_{j}", req) for j, (_, _, req) in enumerate(properties)], ", ")
        rules.append(f"fn_{i}: {_lit(function['name'] + '(')} fn_{i}_s_0_0 \")\"")
    return rules


def _separated(prefix: str, items: list[tuple[str, bool]], separator: str) -> list[str]:
    """Rules `{prefix}_{i}_{started}` for `items` in order, optional ones skippable, `separator` between:
    one rule per item and whether one came before it, so optional items cost no more than required ones."""
    rules = []
    for i in range(len(items), -1, -1):
        for started in (0, 1):
            if i == len(items):
                rules.append(f'{prefix}_{i}_{started}: ""')
                continue
            item, required = items[i]
            taken = f"{_lit(separator) if started else ''} {item} {prefix}_{i + 1}_1".strip()
            skipped = f"{prefix}_{i + 1}_{started}"
            rules.append(f"{prefix}_{i}_{started}: {taken}" + ("" if required else f" | {skipped}"))
    return rules


def _python_value(schema: dict[str, Any]) -> str:
    """A Python literal the schema allows: its enum's values, True/False, None, or JSON's numbers and
    strings; arrays and objects as JSON (read back as JSON)."""
    if "enum" in schema:
        return "(" + " | ".join(_lit(_python_literal(value)) for value in schema["enum"]) + ")"
    kind = schema.get("type")
    if kind == "boolean":
        return '("True" | "False")'
    if kind == "null":
        return '"None"'
    return _json_schema(schema)


def _properties(function: dict[str, Any]) -> list[tuple[str, dict[str, Any], bool]]:
    parameters = function["parameters"]
    required = set(parameters.get("required", []))
    return [(key, schema if isinstance(schema, dict) else {}, key in required)
            for key, schema in parameters.get("properties", {}).items()]


def _is_text(schema: dict[str, Any]) -> bool:
    return schema.get("type") == "string" and not any(k in schema for k in ("enum", "const", "pattern", "format"))


def _is_string(schema: dict[str, Any]) -> bool:
    """A parameter whose values are strings: written as they are in the "xml" shape."""
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    return schema.get("type") == "string" or bool(values) and all(isinstance(value, str) for value in values)


_BODY_GRAMMARS: dict[str, Callable[[Convention, Sequence[dict[str, Any]], Spell], list[str]]] = {
    "object": _object_body, "named": _named_body, "xml": _xml_body, "pythonic": _pythonic_body}

HERMES = Convention("hermes", "Qwen2.5, Qwen3, Hermes 2/3, SmolLM3", r"<tool_call>\s*\{\s*\"name\"\s*:\s*\"{name}\"",
                    "object", "<tool_call>\n", "\n</tool_call>")
CONVENTIONS = (
    Convention("qwen3-xml", "Qwen3-Coder, Qwen3.5, Qwen3.6", r"<function={name}>", "xml",
               "<tool_call>\n<function=", "</function>\n</tool_call>"),
    HERMES,
    Convention("llama3-json", "Llama 3.1, 3.2, 3.3", r"\{\s*\"name\"\s*:\s*\"{name}\"\s*,\s*\"parameters\"",
               "object", "", "", arguments_key="parameters"),
    Convention("mistral", "Mistral Small 3.2, Devstral, Magistral", r"\[TOOL_CALLS\]\s*{name}\s*\[ARGS\]", "named",
               "[TOOL_CALLS]", "", between="", name_close="[ARGS]"),
    Convention("pythonic", "LFM2", r"<\|tool_call_start\|>\s*\[\s*{name}\(", "pythonic", "", "",
               begin="<|tool_call_start|>[", end="]<|tool_call_end|>", between=", "),
    Convention("harmony", "gpt-oss", r"to=functions\.{name}", "named", "<|channel|>commentary to=functions.",
               "<|call|>",
               between="", name_close=" <|constrain|>json<|message|>", think_open="<|channel|>analysis<|message|>",
               think_close="<|end|>", dropped=("<|start|>assistant", "<|channel|>final<|message|>", "<|return|>")),
)


def probe_messages(call: bool = True) -> list[dict[str, Any]]:
    """A conversation holding one past call of the probe function and its result (or, without `call`, a
    plain answer in its place: the two renderings differ in the call alone)."""
    past = {"id": "call_probe", "type": "function", "function": {"name": PROBE_NAME, "arguments": {PROBE_KEY: "probe"}}}
    answer = {"role": "assistant", "content": "", "tool_calls": [past]} if call else \
        {"role": "assistant", "content": "probe answer"}
    result = {"role": "tool", "tool_call_id": "call_probe", "content": "probed"}
    return [{"role": "user", "content": "probe"}, answer, result]


def probe_tools() -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": PROBE_NAME, "parameters": {
        "type": "object", "properties": {PROBE_KEY: {"type": "string"}}, "required": [PROBE_KEY]}}}]


def detect(with_call: str, without_call: str) -> Convention | None:
    """The convention whose signature the template's writing of the probe call shows: the text where its
    renderings with the call (`probe_messages()`) and without it differ, so that the tools' own listing (often
    JSON with their names) is never read as a call. None when no known convention's signature is there."""
    start = len(os.path.commonprefix([with_call, without_call]))
    end = len(os.path.commonprefix([with_call[start:][::-1], without_call[start:][::-1]]))
    call = with_call[start:len(with_call) - end]
    for convention in CONVENTIONS:
        if re.search(convention.signature.replace("{name}", PROBE_NAME), call):
            return convention
    return None


def read_off(render: Callable[..., str]) -> Convention | None:
    """The convention of a template that shows tools, `render` rendering with it (`Model.format_chat`'s
    arguments, giving text): None when it writes calls no known way."""
    return detect(*(render(probe_messages(call), tools=probe_tools(), add_generation_prompt=False)
                    for call in (True, False)))


def in_words(convention: Convention | None) -> str:
    """A template's convention in words, for `spec models check`."""
    if convention is None:
        return "none read off the template (it shows no tools, or writes calls another way): the generic "\
               "<tool_call> JSON (Hermes') is used"
    return f"{convention.name} (as {convention.writers} write calls)"


@dataclass
class Reading:
    """One call read as it streams: its name once known, its arguments' JSON text as far as it is settled (a
    prefix of the final text), whether it is whole, and the text after it."""

    name: str | None = None
    arguments: str = ""
    whole: bool = False
    rest: str = ""


def read_call(convention: Convention, functions: Functions, text: str, final: bool) -> Reading | None:
    """`text` (after the call's opening) read as far as it goes; `final`: nothing more will come. None when it
    is not a call of one of `functions` (text to show as written)."""
    reading = _READERS[convention.shape](convention, text, final, functions)
    if reading is not None and reading.name is not None and reading.name not in functions:
        return None
    return reading


def _settled_json(convention: Convention, raw: str, wrapped: bool, final: bool,
                  ends_at: int | None = None) -> Reading:
    """Arguments written as JSON, up to the call's close (or `ends_at`): what is settled, and whether the call
    is whole. A convention without a close ends a call at the next one's opening."""
    close = convention.call_close or convention.call_open
    at = ends_at if ends_at is not None else raw.find(close) if close else -1
    if at >= 0 or final:
        body = (raw[:at] if at >= 0 else raw).rstrip()
        body = body[:-1].rstrip() if wrapped and body.endswith("}") else body
        rest = raw[at + (0 if ends_at is not None else len(convention.call_close)):] if at >= 0 else ""
        return Reading(arguments=body, whole=True, rest=rest)
    body = raw[:len(raw) - partial_tag(raw, close)].rstrip()
    return Reading(arguments=body[:-1].rstrip() if wrapped and body.endswith("}") else body)


OBJECT_HEAD = r'\s*\{{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"{key}"\s*:\s*'


def _read_object(convention: Convention, text: str, final: bool, functions: Functions) -> Reading | None:
    head = re.match(OBJECT_HEAD.format(key=convention.arguments_key), text)
    if head is None:
        return _read_object_whole(convention, text, final)
    ends_at = None
    if not convention.call_close:  # the call ends where its object does
        try:
            ends_at = json.JSONDecoder().raw_decode(text, len(text) - len(text.lstrip()))[1] - head.end()
        except json.JSONDecodeError:
            pass
    reading = _settled_json(convention, text[head.end():], True, final, ends_at)
    reading.name = json.loads(f'"{head.group(1)}"')
    return reading if not reading.whole or _is_object(reading.arguments) else None


def _read_object_whole(convention: Convention, text: str, final: bool) -> Reading | None:
    """An object call whose head is not (yet) `{"name": …, "<key>": ` as written: read once whole."""
    at = text.find(convention.call_close) if convention.call_close else -1
    if at < 0 and not final:
        return Reading() if not text.strip() or text.lstrip().startswith("{") else None
    try:
        value = json.loads(text[:at] if at >= 0 else text)
    except json.JSONDecodeError:
        return None
    arguments = value.get(convention.arguments_key, {}) if isinstance(value, dict) else None
    if not isinstance(arguments, dict) or not isinstance(value.get("name"), str):
        return None
    return Reading(value["name"], json.dumps(arguments, ensure_ascii=False), True,
                   text[at + len(convention.call_close):] if at >= 0 else "")


def _read_named(convention: Convention, text: str, final: bool, functions: Functions) -> Reading | None:
    at = text.find(convention.name_close)
    if at < 0:
        name = re.match(r"[A-Za-z0-9_-]*", text)
        return None if final or not convention.name_close.startswith(text[name.end():]) else Reading()
    reading = _settled_json(convention, text[at + len(convention.name_close):], False, final)
    reading.name = text[:at]
    return reading if not reading.whole or _is_object(reading.arguments) else None


XML_NAME = re.compile(r"([A-Za-z0-9_-]+)>\n?")
XML_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>\n?", re.DOTALL)


def _read_xml(convention: Convention, text: str, final: bool, functions: Functions) -> Reading | None:
    head = XML_NAME.match(text)
    if head is None:
        return None if final or not re.fullmatch(r"[A-Za-z0-9_-]*", text[:64]) else Reading()
    at = text.find(convention.call_close)
    body = text[head.end():at] if at >= 0 else text[head.end():]
    schemas = {key: schema for key, schema, _ in _properties(functions.get(head.group(1), {"parameters": {}}))}
    pairs = [f"{json.dumps(m.group(1))}: {_xml_value(m.group(2), schemas.get(m.group(1), {}))}"
             for m in XML_PARAMETER.finditer(body)]
    arguments = "{" + ", ".join(pairs)
    whole = at >= 0 or final
    return Reading(head.group(1), arguments + "}" if whole else arguments, whole,
                   text[at + len(convention.call_close):] if at >= 0 else "")


def _xml_value(value: str, schema: dict[str, Any]) -> str:
    """A parameter's text as JSON: a string parameter's text as a string; else a JSON value as it is, anything
    else a string."""
    if not _is_string(schema):
        try:
            json.loads(value)
            return value.strip()
        except json.JSONDecodeError:
            pass
    return json.dumps(value, ensure_ascii=False)


PYTHONIC_NAME = re.compile(r"\s*([A-Za-z0-9_-]+)\(")


def _read_pythonic(convention: Convention, text: str, final: bool, functions: Functions) -> Reading | None:
    head = PYTHONIC_NAME.match(text)
    if head is None:
        return None if final or not re.fullmatch(r"\s*[A-Za-z0-9_-]*", text[:64]) else Reading()
    for close in _positions(text, ")", head.end()):
        arguments = _python_arguments(text[head.end() - 1 - len(head.group(1)):close + 1])
        if arguments is not None:
            return Reading(head.group(1), json.dumps(arguments, ensure_ascii=False), True, text[close + 1:])
    return None if final else Reading(head.group(1))


def _positions(text: str, char: str, start: int) -> Iterator[int]:
    at = text.find(char, start)
    while at >= 0:
        yield at
        at = text.find(char, at + 1)


def _python_arguments(call: str) -> dict[str, Any] | None:
    """`name(key=value, …)`'s keyword arguments, Python literals or JSON; None unless it is such a call."""
    try:
        tree = ast.parse(call, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(tree, ast.Call) or tree.args or any(k.arg is None for k in tree.keywords):
        return None
    arguments = {}
    for keyword in tree.keywords:
        source = ast.get_source_segment(call, keyword.value) or ""
        try:
            arguments[keyword.arg] = ast.literal_eval(keyword.value)
        except ValueError:
            try:
                arguments[keyword.arg] = json.loads(source)
            except json.JSONDecodeError:
                return None
    return arguments


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


_READERS: dict[str, Callable[[Convention, str, bool, Functions], Reading | None]] = {
    "object": _read_object, "named": _read_named, "xml": _read_xml, "pythonic": _read_pythonic}


def partial_tag(text: str, tag: str) -> int:
    """How many characters at the end of `text` could start `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
