"""Tool calls and thoughts in OpenAI's shape over a model's plain text.

The convention is Hermes' `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, which Qwen2.5/3/3.5/3.6,
Hermes 2/3 and SmolLM3 are trained on; a thought is a `<think>…</think>` block at the start of the answer
(or after a template that opens it), as DeepSeek-R1, Qwen3 and SmolLM3 write it. A template that takes
`tools` gets them as they are; one that knows nothing of tools gets them described in the system message,
with the convention spelt out (llama-server's generic handler does the same with its own format).
`tool_choice` "required" or a named function forces the call with a grammar: a Lark grammar whose calls hold
llguidance's JSON grammar for the functions' parameters (`%json`), inside the tags, so the arguments always
parse and match their schema. A turn holds at most `MAX_CALLS` calls (one when `parallel_tool_calls` is
false): a model cannot loop on calls until its context is full.

A request's `tools`, `tool_choice` and `parallel_tool_calls` are checked here into `Tools`; `AnswerSplitter`
reads the answer as it streams and hands out OpenAI's delta fields: `reasoning_content`, `content`, and each
`tool_calls` entry once its closing tag has come.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from spec_cli.request import InvalidConstraint, shown
from spec_cli.server.errors import RequestError, unicode_text
from spec_cli.structured import JSON_OPTIONS, schema_grammar

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TOOL_CHOICES = ("auto", "none", "required")
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function's name
MAX_CALLS = 8  # tool calls a turn may hold at most
NEWLINE = "\n"


@dataclass(frozen=True)
class Tools:
    """A request's tools, checked: the functions (OpenAI's `function` objects), `choice` ("auto", "required",
    or the one function's name that must be called) and whether several calls may come in one answer."""

    functions: tuple[dict[str, Any], ...]
    choice: str
    parallel: bool = True

    @property
    def forced(self) -> bool:
        return self.choice != "auto"

    @property
    def most_calls(self) -> int:
        return MAX_CALLS if self.parallel else 1

    def as_template_takes_them(self) -> list[dict[str, Any]]:
        return [{"type": "function", "function": function} for function in self.functions]

    def names(self) -> list[str]:
        return [function["name"] for function in self.functions]


def parse_tools(tools: object, tool_choice: object, parallel: object) -> Tools | None:
    """`tools`, `tool_choice` and `parallel_tool_calls` from a request body; None when no tool may be called
    (no tools, or `tool_choice` "none")."""
    if tools is None or tools == []:
        if tool_choice not in (None, "none", "auto"):
            raise RequestError("'tool_choice' needs 'tools'", param="tool_choice")
        return None
    if not isinstance(tools, list):
        raise RequestError("'tools' must be a list of {\"type\": \"function\", \"function\": {…}}", param="tools")
    functions = tuple(_function(tool, f"tools[{i}]") for i, tool in enumerate(tools))
    names = [function["name"] for function in functions]
    for name in names:
        if names.count(name) > 1:
            raise RequestError(f"'tools' names the function {name!r} twice", param="tools")
    if parallel is not None and not isinstance(parallel, bool):
        raise RequestError("'parallel_tool_calls' must be true or false", param="parallel_tool_calls")
    choice = _choice(tool_choice, names)
    return None if choice == "none" else Tools(functions, choice, parallel is not False)


def _function(tool: object, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise RequestError(f"{where} must be {{\"type\": \"function\", \"function\": {{…}}}}", param=where)
    function = tool["function"]
    name = function.get("name")
    if not isinstance(name, str) or not FUNCTION_NAME.fullmatch(name):
        raise RequestError(f"{where}.function.name must be 1 to 64 letters, digits, _ or -, got {shown(name)}",
                           param=f"{where}.function.name")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise RequestError(f"{where}.function.description must be a string", param=f"{where}.function.description")
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise RequestError(f"{where}.function.parameters of the tool {name!r} must be an object schema "
                           "({\"type\": \"object\", \"properties\": {…}}): a call's arguments are an object; got "
                           f"{shown(parameters)}", param=f"{where}.function.parameters")
    strict = function.get("strict", True)
    if not isinstance(strict, bool):
        raise RequestError(f"{where}.function.strict must be true or false", param=f"{where}.function.strict")
    checked = {"name": name, **({"description": description} if description else {}),
               "parameters": {"type": "object", **parameters}, **({} if strict else {"strict": False})}
    unicode_text(json.dumps(checked, ensure_ascii=False), where)  # its text goes into the prompt
    return checked


def _choice(tool_choice: object, names: list[str]) -> str:
    if tool_choice is None:
        return "auto"
    if isinstance(tool_choice, str):
        if tool_choice not in TOOL_CHOICES:
            raise RequestError(f"'tool_choice' must be one of {', '.join(TOOL_CHOICES)} or a function, got "
                               f"{shown(tool_choice)}", param="tool_choice")
        return tool_choice
    function = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(tool_choice, dict) or tool_choice.get("type") != "function" or not isinstance(name, str):
        raise RequestError("'tool_choice' must be a string or "
                           "{\"type\": \"function\", \"function\": {\"name\": …}}", param="tool_choice")
    if name not in names:
        raise RequestError(f"'tool_choice' names the function {shown(name)}, which 'tools' does not list "
                           f"(it lists {', '.join(names)})", param="tool_choice")
    return name





def checked_parameters(function: dict[str, Any], where: str) -> None:
    """A 400 naming the tool unless its parameters schema can be enforced (every keyword, when the function is
    strict, OpenAI's default for tools here)."""
    try:
        schema_grammar(function["parameters"], "parameters", function.get("strict", True))
    except InvalidConstraint as exc:
        raise RequestError(exc.named({"parameters": f"{where}.function.parameters (tool {function['name']!r})"}),
                           param=f"{where}.function.parameters") from None


def call_grammar(tools: Tools) -> str:
    """llguidance's grammar for the calls `tools.choice` forces: one call (up to `MAX_CALLS` when parallel
    calls are allowed and any function may be called) of the named function or of any, each
    `<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>` with the arguments the function's parameters
    schema describes (each schema checked by `checked_parameters` first)."""
    chosen = [f for f in tools.functions if tools.choice in ("required", f["name"])]
    calls = [{"type": "object", "properties": {"name": {"const": f["name"]}, "arguments": f["parameters"]},
              "required": ["name", "arguments"], "additionalProperties": False} for f in chosen]
    schema = {**(calls[0] if len(calls) == 1 else {"anyOf": calls}),
              "x-guidance": {**JSON_OPTIONS, "lenient": True, "coerce_one_of": True}}
    more = tools.most_calls - 1 if tools.choice == "required" else 0
    repeat = f' ("\\n" call){{0,{more}}}' if more else ""
    lark = (f"start: call{repeat}\n"
            f"call: {json.dumps(CALL_OPEN + NEWLINE)} arguments {json.dumps(NEWLINE + CALL_CLOSE)}\n"
            f"arguments: %json {json.dumps(schema)}\n")
    return json.dumps({"grammars": [{"lark_grammar": lark}]})  # llguidance's own form: taken as it is


def described(tools: Tools) -> str:
    """The system message's part that tells a model whose template knows nothing of tools how to call them."""
    listing = "\n".join(json.dumps(function, ensure_ascii=False) for function in tools.functions)
    how = (f"To call a function, answer with\n{CALL_OPEN}\n{{\"name\": \"<function name>\", \"arguments\": "
           f"<the arguments as a JSON object>}}\n{CALL_CLOSE}")
    when = "You must call a function." if tools.forced else "If no function helps, answer normally."
    return f"You can call these functions:\n{listing}\n\n{how}\n{when}"


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history as a template that takes tools reads it: calls' arguments as objects (Hugging Face's
    convention; OpenAI sends them as JSON text)."""
    return [{**m, "tool_calls": [_with_object_arguments(call) for call in m["tool_calls"]]} if m.get("tool_calls")
            else m for m in messages]


def _with_object_arguments(call: dict[str, Any]) -> dict[str, Any]:
    function = call["function"]
    try:
        arguments = json.loads(function["arguments"])
    except json.JSONDecodeError:
        arguments = function["arguments"]
    return {**call, "function": {**function, "arguments": arguments}}


def spelt_out(messages: list[dict[str, Any]], tools: Tools | None) -> list[dict[str, Any]]:
    """The history for a template that knows nothing of tools: the tools described in the system message,
    past calls spelt in the assistant's text, and tool results as user messages in `<tool_response>` tags."""
    spelt = []
    for message in messages:
        if message.get("tool_calls"):
            calls = "\n".join(f"{CALL_OPEN}\n{json.dumps(_call_json(call), ensure_ascii=False)}\n{CALL_CLOSE}"
                              for call in message["tool_calls"])
            spelt.append({"role": "assistant", "content": "\n".join(filter(None, [message["content"], calls]))})
        elif message["role"] == "tool":
            spelt.append({"role": "user", "content": f"<tool_response>\n{message['content']}\n</tool_response>"})
        else:
            spelt.append({"role": message["role"], "content": message["content"]})
    if tools is not None:
        if spelt and spelt[0]["role"] == "system":
            spelt[0] = {"role": "system", "content": f"{spelt[0]['content']}\n\n{described(tools)}"}
        else:
            spelt.insert(0, {"role": "system", "content": described(tools)})
    return spelt


def _call_json(call: dict[str, Any]) -> dict[str, Any]:
    return {"name": call["function"]["name"], "arguments": _with_object_arguments(call)["function"]["arguments"]}


class AnswerSplitter:
    """An answer's text, fed as it comes, split into OpenAI's delta fields: `reasoning_content` (a thought at
    the start), `content`, and `tool_calls` (each call once its closing tag has come, with an id).

    Text that may be the start of a tag is held back until it is known. Whitespace around the parts is
    dropped once there is more than content (a thought, tools); plain content is the text as written. A
    `<tool_call>` whose text is not a call of a listed function stays in the content as written.
    `thinking`: the prompt opened the thought already (the template ends with `<think>`). Once `full` (the turn
    holds its most calls), the face stops the generation."""

    def __init__(self, tools: Tools | None, thinking: bool = False) -> None:
        self._names = tools.names() if tools is not None else []
        self._most = tools.most_calls if tools is not None else 0
        self._state = "think" if thinking else "start"
        self._trim = thinking or bool(self._names)
        self._buffer = ""
        self._blank = ""  # whitespace held until text follows it
        self._said_content = False
        self.calls: list[dict[str, Any]] = []

    def feed(self, text: str) -> list[dict[str, Any]]:
        self._buffer += text
        deltas: list[dict[str, Any]] = []
        while self._step(deltas):
            pass
        return deltas

    @property
    def full(self) -> bool:
        """The answer holds as many calls as a turn may."""
        return bool(self._names) and len(self.calls) >= self._most

    def flush(self, cut: bool = False) -> list[dict[str, Any]]:
        """What is left at the end: a thought or a call never closed, held-back text. `cut`: the answer ran out
        of tokens, so a call never closed is half a call, neither a call nor content: it is dropped."""
        deltas: list[dict[str, Any]] = []
        rest, self._buffer = self._buffer, ""
        if self.full or (cut and self._names and CALL_OPEN.startswith(rest)):  # past the most calls, or a tag cut
            return deltas
        if self._state == "think":
            self._say(deltas, "reasoning_content", rest)
        elif self._state == "call":
            if not cut:
                self._call(deltas, rest, closed=False)
        else:
            self._say(deltas, "content", rest)
        return deltas

    def _step(self, deltas: list[dict[str, Any]]) -> bool:
        """Move past one part of the buffer; False when what is left must wait for more text (or the turn holds
        its most calls: what follows them is not read)."""
        buffer = self._buffer
        if self.full:
            return False
        if self._state == "start":
            stripped = buffer.lstrip()
            if THINK_OPEN.startswith(stripped):
                return False
            self._state = "text"
            if stripped.startswith(THINK_OPEN):
                self._state, self._buffer, self._trim = "think", stripped[len(THINK_OPEN):], True
            return True
        if self._state == "think":
            return self._until(deltas, THINK_CLOSE, "reasoning_content", "text")
        if self._state == "text":
            if self._names:
                return self._until(deltas, CALL_OPEN, "content", "call")
            self._say(deltas, "content", buffer)
            self._buffer = ""
            return False
        end = buffer.find(CALL_CLOSE)
        if end < 0:
            return False
        self._buffer = buffer[end + len(CALL_CLOSE):]
        self._call(deltas, buffer[:end], closed=True)
        self._state = "text"
        return True

    def _until(self, deltas: list[dict[str, Any]], tag: str, field: str, then: str) -> bool:
        """Say the buffer as `field` up to `tag` and go on in state `then`; without the tag, say what cannot be
        the tag's start and wait."""
        at = self._buffer.find(tag)
        if at >= 0:
            self._say(deltas, field, self._buffer[:at])
            self._buffer, self._state = self._buffer[at + len(tag):], then
            return True
        keep = _partial_tag(self._buffer, tag)
        self._say(deltas, field, self._buffer[:len(self._buffer) - keep])
        self._buffer = self._buffer[len(self._buffer) - keep:]
        return False

    def _say(self, deltas: list[dict[str, Any]], field: str, text: str) -> None:
        if field == "content" and self._trim:
            text = self._blank + text
            stripped = text.rstrip()
            self._blank = text[len(stripped):]
            text = stripped if self._said_content else stripped.lstrip()
            self._said_content = self._said_content or bool(text)
        if text:
            deltas.append({field: text})

    def _call(self, deltas: list[dict[str, Any]], text: str, closed: bool) -> None:
        call = self._parsed(text)
        if call is None:
            self._say(deltas, "content", f"{CALL_OPEN}{text}{CALL_CLOSE if closed else ''}")
            return
        self._blank = ""
        self.calls.append(call)
        deltas.append({"tool_calls": [{"index": len(self.calls) - 1, **call}]})

    def _parsed(self, text: str) -> dict[str, Any] | None:
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return None
        if not isinstance(value, dict) or value.get("name") not in self._names:
            return None
        arguments = value.get("arguments", {})
        if not isinstance(arguments, dict):
            return None
        return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                "function": {"name": value["name"], "arguments": json.dumps(arguments, ensure_ascii=False)}}


def _partial_tag(text: str, tag: str) -> int:
    """How many characters at the end of `text` could start `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
