"""Tool calls and thoughts in OpenAI's shape over a model's plain text, in the convention its template uses.

The convention (`conventions`) is read off the chat template; a template that knows nothing of tools gets them
described in the system message in the generic convention, Hermes' `<tool_call>{"name": …, "arguments": …}`
(llama-server's generic handler does the same with its own format). A thought is a block at the start of the
answer (`<think>…</think>`, or the convention's own markers), or after a template that opens it.
Every request with tools is constrained (`call_grammar`): `tool_choice` "required" or a named function forces
the calls; "auto" is a lazy grammar, free text until the convention's trigger and calls from there. Either
way a call names a listed function and its arguments match its parameters schema. A turn holds at most
`MAX_CALLS` calls (one when `parallel_tool_calls` is false): a model cannot loop on calls until its context
is full.

A request's `tools`, `tool_choice` and `parallel_tool_calls` are checked here into `Tools`; `AnswerSplitter`
reads the answer as it streams and hands out OpenAI's delta fields: `reasoning_content`, `content`, and
`tool_calls`, a call's name first and then its arguments as they are written.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from spec_cli.formats.conventions import HERMES, Convention, Spell, partial_tag, read_call
from spec_cli.request import InvalidConstraint, shown
from spec_cli.api.errors import RequestError, unicode_text
from spec_cli.formats.structured import lazy_start, schema_grammar

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_CHOICES = ("auto", "none", "required")
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function's name
MAX_CALLS = 8  # tool calls a turn may hold at most


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


def call_grammar(tools: Tools, convention: Convention = HERMES, spell: Spell | None = None) -> str:
    """llguidance's grammar for `tools`' calls in `convention`, each call's arguments held to its function's
    parameters schema (each checked by `checked_parameters` first).

    Forced (`tool_choice` "required" or a function): the answer is the calls, one of the named function or up
    to `MAX_CALLS` (one when parallel calls are off) of any. Auto: a lazy grammar, as llama.cpp's: any text
    without the convention's trigger, or text up to the trigger and calls from there (a convention without a
    trigger calls only with its whole answer). `spell` writes the convention's markers (`Dialect.spell`: a
    control token of the model as itself); by default as text."""
    chosen = [f for f in tools.functions if tools.choice in ("required", "auto", f["name"])]
    calls, rules = convention.calls_grammar(chosen, tools.most_calls if tools.choice in ("required", "auto") else 1,
                                            spell)
    trigger = convention.trigger
    spelt = (spell or json.dumps)(trigger) if trigger else ""
    if tools.forced:
        start = [f"start: {spelt} calls" if trigger else "start: calls"]
    elif trigger and spelt.startswith("<["):  # a control token opens the calls: no text spells it
        start = [f"start: TEXT | TEXT {spelt} calls", "TEXT: /(?s:.*)/"]
    elif trigger:
        start = lazy_start(trigger, "calls")
    else:
        start = ["start: TEXT | calls", "TEXT: /(?s:([^{].*)?)/"]
    return json.dumps({"grammars": [{"lark_grammar": "\n".join([*start, calls, *rules]) + "\n"}]})


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
            calls = HERMES.written([_call_of(call) for call in message["tool_calls"]])
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


def _call_of(call: dict[str, Any]) -> tuple[str, Any]:
    return call["function"]["name"], _with_object_arguments(call)["function"]["arguments"]


class AnswerSplitter:
    """An answer's text, fed as it comes, split into OpenAI's delta fields: `reasoning_content` (a thought at
    the start), `content`, and `tool_calls` in the template's convention: each call's id and name once its name
    is written, then its arguments' JSON text as it settles (OpenAI's and llama-server's streamed calls).

    Text that may be the start of a marker is held back until it is known. Whitespace around the parts is
    dropped once there is more than content (a thought, tools); plain content is the text as written. Text
    after a trigger that is not a call of a listed function stays in the content as written. `thinking`: the
    prompt opened the thought already. Once `full` (the turn holds its most calls), the face stops it."""

    def __init__(self, tools: Tools | None, thinking: bool = False, convention: Convention = HERMES) -> None:
        self._functions = {f["name"]: f for f in tools.functions} if tools is not None else {}
        self._most = tools.most_calls if tools is not None else 0
        self._convention = convention
        self._state = "think" if thinking else "start"
        self._trim = thinking or bool(self._functions)
        self._buffer = ""
        self._blank = ""  # whitespace held until text follows it
        self._said_content = False
        self._call: dict[str, Any] | None = None  # the call being read: its index, id, name, arguments said
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
        return bool(self._functions) and len(self.calls) >= self._most

    def flush(self, cut: bool = False) -> list[dict[str, Any]]:
        """What is left at the end: a thought or a call never closed, held-back text. `cut`: the answer ran out
        of tokens: a call begun keeps the arguments said so far, and a trigger cut short is dropped."""
        deltas: list[dict[str, Any]] = []
        if self.full:
            return deltas
        if self._state == "call":
            if cut:
                return deltas
            self._read(deltas, final=True)
        rest, self._buffer = self._buffer, ""
        if cut and self._trigger and self._trigger.startswith(rest) and rest:
            return deltas
        self._say(deltas, "reasoning_content" if self._state == "think" else "content", rest)
        return deltas

    @property
    def _trigger(self) -> str | None:
        return self._convention.trigger if self._functions else None

    def _step(self, deltas: list[dict[str, Any]]) -> bool:
        """Move past one part of the buffer; False when what is left must wait for more text (or the turn holds
        its most calls: what follows them is not read)."""
        if self.full:
            return False
        return getattr(self, f"_in_{self._state}")(deltas)

    def _in_start(self, deltas: list[dict[str, Any]]) -> bool:
        stripped, opening = self._buffer.lstrip(), self._convention.think_open
        if opening.startswith(stripped):
            return False
        self._state = "text"
        if stripped.startswith(opening):
            self._state, self._buffer, self._trim = "think", stripped[len(opening):], True
        elif self._functions and self._trigger is None and stripped.startswith("{"):
            self._state, self._buffer = "call", stripped  # a convention whose call is the whole answer
        return True

    def _in_think(self, deltas: list[dict[str, Any]]) -> bool:
        return self._until(deltas, [self._convention.think_close], "reasoning_content")

    def _in_text(self, deltas: list[dict[str, Any]]) -> bool:
        markers = [*([self._trigger] if self._trigger else []), *self._convention.dropped]
        if not markers:
            self._say(deltas, "content", self._buffer)
            self._buffer = ""
            return False
        found = self._until(deltas, markers, "content")
        if found == self._trigger:
            self._state = "call"
        return bool(found)

    def _in_call(self, deltas: list[dict[str, Any]]) -> bool:
        return self._read(deltas, final=False)

    def _in_after(self, deltas: list[dict[str, Any]]) -> bool:
        """Between calls: the next one, the calls' end, or text."""
        convention = self._convention
        following = convention.between + convention.call_open
        for marker, state in ((following, "call"), (convention.end, "text")):
            if marker and self._buffer.startswith(marker):
                self._buffer, self._state = self._buffer[len(marker):], state
                return True
        if any(marker.startswith(self._buffer) for marker in (following, convention.end) if marker):
            return False
        self._state = "text"
        return True

    def _read(self, deltas: list[dict[str, Any]], final: bool) -> bool:
        """Read the call in the buffer as far as it goes; False when it waits for more text."""
        reading = read_call(self._convention, self._functions, self._buffer, final)
        if reading is None:  # not a call: the trigger and its text as written
            if self._call is not None:
                self._call = None
                self._buffer = ""
                self._state = "text"
                return True
            self._say(deltas, "content", (self._trigger or "") + self._buffer)
            self._buffer, self._state = "", "text"
            return False
        if reading.name is not None and self._call is None:
            self._blank = ""
            self._call = {"index": len(self.calls), "id": f"call_{uuid.uuid4().hex[:24]}", "said": ""}
            deltas.append({"tool_calls": [{"index": self._call["index"], "id": self._call["id"], "type": "function",
                                           "function": {"name": reading.name, "arguments": ""}}]})
        if self._call is not None and len(reading.arguments) > len(self._call["said"]):
            fragment = reading.arguments[len(self._call["said"]):]
            self._call["said"] = reading.arguments
            deltas.append({"tool_calls": [{"index": self._call["index"], "function": {"arguments": fragment}}]})
        if not reading.whole:
            return False
        self.calls.append({"id": self._call["id"], "name": reading.name, "arguments": reading.arguments})
        self._call, self._buffer, self._state = None, reading.rest, "after"
        return True

    def _until(self, deltas: list[dict[str, Any]], markers: list[str], field: str) -> str | None:
        """Say the buffer as `field` up to the first of `markers` and return the marker found (leaving the thought
        when it is the thought's close); without one, say what cannot start a marker and wait (None)."""
        found = [(at, marker) for marker in markers if (at := self._buffer.find(marker)) >= 0]
        if found:
            at, marker = min(found)
            self._say(deltas, field, self._buffer[:at])
            self._buffer = self._buffer[at + len(marker):]
            if self._state == "think":
                self._state = "text"
            return marker
        keep = max(partial_tag(self._buffer, marker) for marker in markers)
        self._say(deltas, field, self._buffer[:len(self._buffer) - keep])
        self._buffer = self._buffer[len(self._buffer) - keep:]
        return None

    def _say(self, deltas: list[dict[str, Any]], field: str, text: str) -> None:
        if field == "content" and self._trim:
            text = self._blank + text
            stripped = text.rstrip()
            self._blank = text[len(stripped):]
            text = stripped if self._said_content else stripped.lstrip()
            self._said_content = self._said_content or bool(text)
        if text:
            deltas.append({field: text})
