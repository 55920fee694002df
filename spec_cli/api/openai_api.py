"""OpenAI's HTTP API as data: requests checked into `ApiRequest`s, and the JSON objects the answers are made of.

Pure functions over dicts, no HTTP and no models, so every field rule can be tested on its own. What the API
defines follows OpenAI's reference (`/v1/chat/completions`, `/v1/completions`, errors as
`{"error": {"message", "type", "param", "code"}}`, `response_format`, `tools`); the extensions are those
llama-server users know (top_k, min_p, repeat_penalty, repeat_last_n, grammar, json_schema) and spec-cli's own
(draft_max, draft_mode, verify, and a `speculation` object in every answer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from spec_cli.formats.conventions import HERMES, Convention, Spell
from spec_cli.decoding.stats import Stats
from spec_cli.llama.prompt_text import IMAGE_MARKER
from spec_cli.llama.vision import Image
from spec_cli.request import GenerationRequest, InvalidConstraint, InvalidRequest, shown
from spec_cli.api.errors import RequestError, unicode_text
from spec_cli.api.images import ImageUrl, image_part
from spec_cli.api.tool_calls import Tools, parse_tools
from spec_cli.api.tool_calls import call_grammar, checked_parameters
from spec_cli.formats.structured import ANY_OBJECT, Thought, after_thought, grammar_structure, schema_grammar

ROLES = ("system", "developer", "user", "assistant", "tool")
# Request fields as a client names them, for messages; extensions spec-cli adds to OpenAI's API.
PARAMS = {name: f"'{name}'" for name in ("draft_max", "draft_mode", "draft_p_min", "verify", "max_tokens", "seed")}
REQUEST_FIELDS = ("seed", "draft_max", "draft_mode", "verify")  # set on the GenerationRequest when given

# Request fields that choose sampling, by SamplingParams field; each is checked for its type here and for
# its range by SamplingParams itself.
SAMPLING_FIELDS: dict[str, tuple[str, type]] = {
    "temperature": ("temperature", float), "top_p": ("top_p", float), "top_k": ("top_k", int),
    "min_p": ("min_p", float), "presence_penalty": ("presence_penalty", float),
    "frequency_penalty": ("frequency_penalty", float), "repeat_penalty": ("repeat_penalty", float),
    "repeat_last_n": ("repeat_last_n", int),
}

# Fields whose meaning spec-cli does not implement: a request that uses them gets a 400 rather than an answer
# that silently ignores them. The value given is what "not used" looks like.
UNSUPPORTED: dict[str, object] = {
    "logprobs": False, "top_logprobs": None, "functions": [], "logit_bias": {}, "echo": False,
    "best_of": 1, "suffix": "", "audio": None,
}



@dataclass(frozen=True)
class Asked:
    """The constraint a request asks for, as sent: `field` ("response_format", "grammar" or "json_schema"),
    `value` (a schema, or grammar text), whether a schema is strict, and how messages name it. Compiling it
    is `structure`'s work, done off the event loop."""

    field: str
    value: object
    strict: bool = False
    named: str = ""

    @property
    def name(self) -> str:
        return self.named or f"'{self.field}'"


@dataclass(frozen=True)
class ApiRequest:
    """A checked request: `messages` for chat, `prompt` (text or token ids) for completions."""

    endpoint: str  # "chat" or "completion"
    messages: list[dict[str, Any]] = field(default_factory=list)
    prompt: str | list[int] = ""
    model: str | None = None
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    sampling: dict[str, float | int] = field(default_factory=dict)  # the fields given, by SamplingParams name
    seed: int | None = None
    stop: tuple[str, ...] = ()
    draft_max: int | str | None = None
    draft_mode: str | None = None
    verify: str | None = None
    asked: Asked | None = None  # response_format, grammar or json_schema, as sent
    tools: Tools | None = None  # the functions the answer may call (none: tool_choice "none")
    grammar: str | None = None  # llguidance's grammar for `asked` or a forced call, once `structure` made it
    reasoning_budget: int | None = None  # tokens of thought before the thought is closed (llama-server's)
    unenforced: tuple[str, ...] = ()  # the keywords of a non-strict schema left unenforced
    images: tuple[Image | ImageUrl, ...] = ()  # the messages' images in order, each where IMAGE_MARKER is

    @property
    def fields(self) -> dict[str, object]:
        """The `GenerationRequest` fields this request sets (those it leaves out keep the server's defaults)."""
        return {name: getattr(self, name) for name in REQUEST_FIELDS if getattr(self, name) is not None}


def parse_chat(body: object) -> ApiRequest:
    """A `/v1/chat/completions` body, checked."""
    fields = _object(body)
    common = _common(fields)
    tools = parse_tools(fields.get("tools"), fields.get("tool_choice"), fields.get("parallel_tool_calls"))
    if tools is not None and common["asked"] is not None:
        raise RequestError("'tools' cannot be combined with a constrained 'response_format' (or 'grammar', "
                           "'json_schema'): a grammar leaves no room for a call; send one of them",
                           param="response_format")
    images: list[Image | ImageUrl] = []
    return ApiRequest("chat", messages=_messages(fields.get("messages"), images), tools=tools,
                      reasoning_budget=_integer(fields, "reasoning_budget", minimum=0), images=tuple(images),
                      **common)


def parse_completion(body: object) -> ApiRequest:
    """A `/v1/completions` body, checked."""
    fields = _object(body)
    if fields.get("tools"):
        raise RequestError("'tools' needs /v1/chat/completions", param="tools", code="unsupported_parameter")
    return ApiRequest("completion", prompt=_prompt(fields.get("prompt")), **_common(fields))


def _object(body: object) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    return body


def _common(fields: dict[str, Any]) -> dict[str, Any]:
    """The fields both endpoints share."""
    for name, unused in UNSUPPORTED.items():
        if fields.get(name, unused) not in (unused, None):
            raise RequestError(f"'{name}' is not supported by this server", param=name, code="unsupported_parameter")
    if _integer(fields, "n", minimum=1) not in (None, 1):
        raise RequestError("only n = 1 is supported: one choice per request", param="n",
                           code="unsupported_parameter")
    options = _object_field(fields, "stream_options")
    max_tokens = _integer(fields, "max_completion_tokens", minimum=1)
    given = {name: fields.get(name) for name in REQUEST_FIELDS if name != "seed"} | {"seed": _integer(fields, "seed")}
    _check_request({name: value for name, value in given.items() if value is not None})
    return {
        "model": _string(fields, "model"),
        "stream": _boolean(fields, "stream"),
        "include_usage": _boolean(options, "include_usage", "stream_options.include_usage"),
        "max_tokens": max_tokens if max_tokens is not None else _integer(fields, "max_tokens", minimum=1),
        "sampling": _sampling(fields),
        "stop": _stop(fields.get("stop")),
        "asked": _asked(fields),
        **given,
    }


def _asked(fields: dict[str, Any]) -> Asked | None:
    """The constraint the answer must follow, as sent: OpenAI's `response_format` ("json_object": any JSON
    object, or llama-server's `"schema"` beside it; "json_schema": its schema, strict or not) or llama-server's
    `grammar` and `json_schema` (not strict); one of them. Only its shape is checked here."""
    given = [name for name in ("response_format", "grammar", "json_schema") if fields.get(name) is not None]
    given = [name for name in given if not (name == "response_format" and fields[name] == {"type": "text"})]
    if len(given) > 1:
        raise RequestError(f"give one of {', '.join(repr(name) for name in given)}, not several", param=given[1])
    if not given:
        return None
    name = given[0]
    value = fields[name]
    if name == "grammar":
        if not isinstance(value, str) or not value.strip():
            raise RequestError("'grammar' must be grammar text (GBNF or Lark)", param="grammar")
        return Asked(name, value)
    if name == "json_schema":
        return Asked(name, _schema_shape(value, "'json_schema'", name))
    return _response_format(value)


def _schema_shape(schema: object, where: str, param: str) -> object:
    """A schema as sent: a JSON object, or its JSON text (what it says is `structure`'s to read)."""
    if not isinstance(schema, (dict, str)):
        raise RequestError(f"{where} must be a JSON object (a JSON Schema), got {shown(schema)}", param=param)
    return schema


def _response_format(value: object) -> Asked:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "json_object":  # llama-server's "schema" beside it is honoured
        return Asked("response_format", _schema_shape(value.get("schema", ANY_OBJECT), "'response_format.schema'",
                                                      "response_format"), named="'response_format.schema'")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise RequestError("'response_format.json_schema' must be an object with a 'schema'",
                               param="response_format")
        strict = spec.get("strict", False)
        if not isinstance(strict, bool):
            raise RequestError("'response_format.json_schema.strict' must be true or false", param="response_format")
        return Asked("response_format", spec["schema"], strict, "'response_format.json_schema.schema'")
    raise RequestError("'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                       "{\"type\": \"json_schema\", \"json_schema\": {\"name\": …, \"schema\": {…}}}",
                       param="response_format")


def structure(request: ApiRequest, convention: Convention = HERMES, thought: Thought | None = None,
              spell: Spell | None = None) -> ApiRequest:
    """`request` with its constraint compiled: llguidance's grammar for what it asked, or for its calls in the
    template's `convention` (forced, or lazy for `tool_choice` "auto"), and the keywords a non-strict schema
    leaves unenforced. Every tool's parameters are checked here too. On a thinking template (`thought`) a chat's
    JSON answer or calls come after a free thought; a grammar given as text is taken as it is. `spell` writes
    the convention's markers as the model's control tokens where they are (`Dialect.spell`). This is the
    costly part of checking a request (a large schema takes milliseconds to seconds): the server runs it off
    its event loop."""
    tools, asked = request.tools, request.asked
    if tools is not None:
        for i, function in enumerate(tools.functions):
            checked_parameters(function, f"tools[{i}]")
        grammar = call_grammar(tools, convention, spell)
        return replace(request, grammar=after_thought(grammar, thought, tools.forced, spell) if thought else grammar)
    if asked is None:
        return request
    try:
        if asked.field == "grammar":
            assert isinstance(asked.value, str)
            return replace(request, grammar=grammar_structure(asked.value))
        compiled = schema_grammar(asked.value, asked.field, asked.strict)
    except InvalidConstraint as exc:
        raise RequestError(exc.named({asked.field: asked.name}), param=asked.field) from None
    grammar = after_thought(compiled.grammar, thought, spell=spell) if thought else compiled.grammar
    return replace(request, grammar=grammar, unenforced=compiled.unenforced)


def _messages(value: object, images: list[Image | ImageUrl]) -> list[dict[str, Any]]:
    if value is None:
        raise RequestError("'messages' is required", param="messages")
    if not isinstance(value, list) or not value:
        raise RequestError("'messages' must be a non-empty list of messages", param="messages")
    return [_message(message, f"messages[{i}]", images) for i, message in enumerate(value)]


def _message(message: object, where: str, images: list[Image | ImageUrl]) -> dict[str, Any]:
    """A message as chat templates take it: role and text (its images, added to `images`, marked in it), an
    assistant's `tool_calls`, a tool result's `tool_call_id`."""
    if not isinstance(message, dict):
        raise RequestError(f"{where} must be an object with 'role' and 'content'", param=where)
    role = message.get("role")
    if role not in ROLES:
        raise RequestError(f"{where}.role must be one of {', '.join(ROLES)}, got {shown(role)}",
                           param=f"{where}.role")
    # OpenAI's "developer" messages are what chat templates know as system messages.
    checked: dict[str, Any] = {"role": "system" if role == "developer" else role,
                               "content": _content(message.get("content"), where, images)}
    if message.get("tool_calls") is not None:
        if role != "assistant":
            raise RequestError(f"{where}: only assistant messages carry tool calls", param=f"{where}.tool_calls")
        checked["tool_calls"] = _past_calls(message["tool_calls"], f"{where}.tool_calls")
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str):
            raise RequestError(f"{where}.tool_call_id must be the id of the call this answers",
                               param=f"{where}.tool_call_id")
        checked["tool_call_id"] = call_id
    return checked


def _past_calls(calls: object, where: str) -> list[dict[str, Any]]:
    """An assistant message's tool calls, as OpenAI sends them back: id, type "function", name and arguments
    (JSON text)."""
    if not isinstance(calls, list):
        raise RequestError(f"{where} must be a list of tool calls", param=where)
    checked = []
    for i, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if (not isinstance(function, dict) or not isinstance(function.get("name"), str)
                or not isinstance(function.get("arguments"), str) or not isinstance(call.get("id", ""), str)):
            raise RequestError(f"{where}[{i}] must be {{\"id\": …, \"type\": \"function\", \"function\": "
                               "{\"name\": …, \"arguments\": \"…\"}}", param=f"{where}[{i}]")
        name = unicode_text(function["name"], f"{where}[{i}].function.name")
        arguments = unicode_text(function["arguments"], f"{where}[{i}].function.arguments")
        checked.append({"id": call.get("id", ""), "type": "function",
                        "function": {"name": name, "arguments": arguments}})
    return checked


def _content(content: object, where: str, images: list[Image | ImageUrl]) -> str:
    """A message's text: a string, or a list of text and image parts (joined, each image an `IMAGE_MARKER`, the
    image added to `images`); other parts (audio, files) are refused."""
    if content is None:
        return ""
    if isinstance(content, str):
        return unicode_text(content, f"{where}.content")
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "image_url":
                images.append(image_part(part.get("image_url"), f"{where}.content[{i}].image_url"))
                texts.append(IMAGE_MARKER)
            elif kind == "text" and isinstance(part.get("text"), str):
                texts.append(unicode_text(part["text"], f"{where}.content"))
            else:
                raise RequestError(f"{where}.content: only text and image_url parts are supported",
                                   param=f"{where}.content")
        return "".join(texts)
    raise RequestError(f"{where}.content must be a string or a list of text and image_url parts",
                       param=f"{where}.content")


def _prompt(value: object) -> str | list[int]:
    """Text, a list holding one text, or token ids."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        value = value[0]
    if isinstance(value, str) and value:
        return unicode_text(value, "prompt")
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                  for t in value):
        return value
    if value is None:
        raise RequestError("'prompt' is required", param="prompt")
    raise RequestError("'prompt' must be a non-empty string, a list of one string, or a list of token ids "
                       "(one prompt per request)", param="prompt")


def _sampling(fields: dict[str, Any]) -> dict[str, float | int]:
    given: dict[str, float | int] = {}
    for name, (field_name, kind) in SAMPLING_FIELDS.items():
        value = _integer(fields, name) if kind is int else _number(fields, name)
        if value is not None:
            given[field_name] = value
    return given


def _stop(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (unicode_text(value, "stop"),)
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(unicode_text(s, "stop") for s in value)
    raise RequestError("'stop' must be a string or a list of strings", param="stop")


def _check_request(given: dict[str, Any]) -> None:
    """The spec-cli fields given, checked by the request they will set, as every face's are."""
    try:
        GenerationRequest(**given)
    except InvalidRequest as exc:
        raise RequestError(exc.named(PARAMS), param=exc.field) from None


def _string(fields: dict[str, Any], name: str) -> str | None:
    value = fields.get(name)
    if value is not None and not isinstance(value, str):
        raise RequestError(f"'{name}' must be a string", param=name)
    return value


def _boolean(fields: dict[str, Any], name: str, param: str | None = None) -> bool:
    value = fields.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RequestError(f"'{param or name}' must be true or false", param=param or name)
    return value


def _object_field(fields: dict[str, Any], name: str) -> dict[str, Any]:
    value = fields.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError(f"'{name}' must be an object", param=name)
    return value


INT64_MAX = 2**63 - 1  # the largest integer any field takes: the C side's widest


def _integer(fields: dict[str, Any], name: str, minimum: int | None = None) -> int | None:
    value = fields.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise RequestError(f"'{name}' must be an integer, got {shown(value)}", param=name)
    if minimum is not None and value < minimum:
        raise RequestError(f"'{name}' must be >= {minimum}, got {shown(value)}", param=name)
    if not -INT64_MAX <= value <= INT64_MAX:
        raise RequestError(f"'{name}' is out of range: at most {INT64_MAX} in size", param=name)
    return value


def _number(fields: dict[str, Any], name: str) -> float | None:
    value = fields.get(name)
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise RequestError(f"'{name}' must be a number, got {shown(value)}", param=name)
    try:
        number = float(value)  # an integer of 309 digits or more has no float: OverflowError
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise RequestError(f"'{name}' must be a finite number, got {shown(value)}", param=name)
    return number


def finish_reason(engine_reason: str | None, stopped_by_string: bool) -> str:
    """OpenAI's finish_reason: "stop" at an end-of-generation token or a stop string, "length" at max_tokens
    or a full context (an answer that stopped after calling tools says "tool_calls": `called`)."""
    return "stop" if stopped_by_string or engine_reason == "stop" else "length"


def called(reason: str, calls: list[dict[str, Any]]) -> str:
    """The finish reason of an answer whose text held `calls`: "tool_calls" when it stopped by itself."""
    return "tool_calls" if calls and reason == "stop" else reason


def usage(stats: Stats) -> dict[str, Any]:
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.generated_tokens,
            "total_tokens": stats.prompt_tokens + stats.generated_tokens,
            "prompt_tokens_details": {"cached_tokens": stats.prompt_cached}}


def speculation(stats: Stats) -> dict[str, Any]:
    """What speculation did so far: the `speculation` object of answers and stream chunks."""
    return {"draft_mode": stats.draft_mode, "draft_max": "auto" if stats.adaptive else stats.draft_max,
            "drafted": stats.drafted, "accepted": stats.accepted, "acceptance": stats.acceptance_rate,
            "tokens_per_pass": stats.mean_accepted_length, "tokens_per_second": stats.tokens_per_second,
            "batch_size": stats.batch_size}


@dataclass(frozen=True)
class Answer:
    """What every object of one answer repeats."""

    id: str
    created: int
    model: str
    endpoint: str  # "chat" or "completion"
    unenforced: tuple[str, ...] = ()  # what a non-strict schema left unenforced: said in `speculation`

    def _speculation(self, stats: Stats) -> dict[str, Any]:
        said = speculation(stats)
        return {**said, "unenforced": list(self.unenforced)} if self.unenforced else said

    def _head(self, object_name: str) -> dict[str, Any]:
        return {"id": self.id, "object": object_name, "created": self.created, "model": self.model}

    def whole(self, text: str | dict[str, Any], reason: str, stats: Stats) -> dict[str, Any]:
        """The non-streamed answer: `text`, or for chat the message's fields (content, reasoning_content,
        tool_calls)."""
        if self.endpoint == "chat":
            message = {"content": text} if isinstance(text, str) else text
            choice = {"index": 0, "message": {"role": "assistant", **message}, "logprobs": None,
                      "finish_reason": reason}
            head = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            head = self._head("text_completion")
        return {**head, "choices": [choice], "usage": usage(stats), "speculation": self._speculation(stats)}

    def chunk(self, text: str | dict[str, Any] | None, reason: str | None,
              stats: Stats | None = None) -> dict[str, Any]:
        """One streamed chunk: `text` (for chat, a delta's fields: content, reasoning_content or tool_calls;
        None for chat's opening chunk, which names the role), the finish reason on the last one, and the
        speculation so far."""
        if self.endpoint == "chat":
            if isinstance(text, dict):
                delta = text
            else:
                delta = {"role": "assistant", "content": ""} if text is None else ({"content": text} if text else {})
            chunk = {**self._head("chat.completion.chunk"),
                     "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]}
        else:
            chunk = {**self._head("text_completion"),
                     "choices": [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}]}
        if stats is not None:
            chunk["speculation"] = self._speculation(stats)
        return chunk

    def usage_chunk(self, stats: Stats) -> dict[str, Any]:
        """The chunk `stream_options.include_usage` asks for, after the last choice."""
        name = "chat.completion.chunk" if self.endpoint == "chat" else "text_completion"
        return {**self._head(name), "choices": [], "usage": usage(stats)}
