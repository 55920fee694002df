"""OpenAI's HTTP API as data: requests checked into `ApiRequest`s, and the JSON objects the answers are made of.

Pure functions over dicts, no HTTP and no models, so every field rule can be tested on its own. What the API
defines follows OpenAI's reference (`/v1/chat/completions`, `/v1/completions`, errors as
`{"error": {"message", "type", "param", "code"}}`); the extensions are those llama-server users know (top_k,
min_p, repeat_penalty, repeat_last_n) and spec-cli's own (draft_max, draft_mode, verify, and a
`speculation` object in every answer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from spec_cli.decoding.stats import Stats
from spec_cli.request import GenerationRequest, InvalidRequest, shown

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
    "logprobs": False, "top_logprobs": None, "tools": [], "functions": [], "logit_bias": {}, "echo": False,
    "best_of": 1, "suffix": "", "audio": None,
}


class RequestError(Exception):
    """A request that cannot be served as sent: an HTTP status and OpenAI's error fields."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.kind = message, param, code, status, kind

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.kind, self.param, self.code)


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass(frozen=True)
class ApiRequest:
    """A checked request: `messages` for chat, `prompt` (text or token ids) for completions."""

    endpoint: str  # "chat" or "completion"
    messages: list[dict[str, str]] = field(default_factory=list)
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

    @property
    def fields(self) -> dict[str, object]:
        """The `GenerationRequest` fields this request sets (those it leaves out keep the server's defaults)."""
        return {name: getattr(self, name) for name in REQUEST_FIELDS if getattr(self, name) is not None}


def parse_chat(body: object) -> ApiRequest:
    """A `/v1/chat/completions` body, checked."""
    fields = _object(body)
    return ApiRequest("chat", messages=_messages(fields.get("messages")), **_common(fields))


def parse_completion(body: object) -> ApiRequest:
    """A `/v1/completions` body, checked."""
    fields = _object(body)
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
    if fields.get("response_format") not in (None, {"type": "text"}):
        raise RequestError("only the 'text' response format is supported", param="response_format",
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
        **given,
    }


def _messages(value: object) -> list[dict[str, str]]:
    if value is None:
        raise RequestError("'messages' is required", param="messages")
    if not isinstance(value, list) or not value:
        raise RequestError("'messages' must be a non-empty list of messages", param="messages")
    return [_message(message, f"messages[{i}]") for i, message in enumerate(value)]


def _message(message: object, where: str) -> dict[str, str]:
    if not isinstance(message, dict):
        raise RequestError(f"{where} must be an object with 'role' and 'content'", param=where)
    role = message.get("role")
    if role not in ROLES:
        raise RequestError(f"{where}.role must be one of {', '.join(ROLES)}, got {shown(role)}",
                           param=f"{where}.role")
    if message.get("tool_calls"):
        raise RequestError(f"{where}: tool calls are not supported by this server", param=f"{where}.tool_calls",
                           code="unsupported_parameter")
    # OpenAI's "developer" messages are what chat templates know as system messages.
    return {"role": "system" if role == "developer" else role, "content": _content(message.get("content"), where)}


def _content(content: object, where: str) -> str:
    """A message's text: a string, or a list of text parts (joined); other parts (images, audio) are refused."""
    if content is None:
        return ""
    if isinstance(content, str):
        return _unicode(content, f"{where}.content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(f"{where}.content: only text parts are supported", param=f"{where}.content")
            texts.append(_unicode(part["text"], f"{where}.content"))
        return "".join(texts)
    raise RequestError(f"{where}.content must be a string or a list of text parts", param=f"{where}.content")


def _prompt(value: object) -> str | list[int]:
    """Text, a list holding one text, or token ids."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        value = value[0]
    if isinstance(value, str) and value:
        return _unicode(value, "prompt")
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
        return (_unicode(value, "stop"),)
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(_unicode(s, "stop") for s in value)
    raise RequestError("'stop' must be a string or a list of strings", param="stop")


def _unicode(text: str, param: str) -> str:
    """`text`, which JSON's \\u escapes may have given a lone surrogate (half of a UTF-16 pair): no UTF-8 text
    can hold one, so no tokenizer can take it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(f"{param} is not valid Unicode: it holds a lone surrogate, \\u{ord(text[exc.start]):04x}",
                           param=param) from None
    return text


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
    or a full context."""
    return "stop" if stopped_by_string or engine_reason == "stop" else "length"


def usage(stats: Stats) -> dict[str, Any]:
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.generated_tokens,
            "total_tokens": stats.prompt_tokens + stats.generated_tokens,
            "prompt_tokens_details": {"cached_tokens": stats.prompt_cached}}


def speculation(stats: Stats) -> dict[str, Any]:
    """What speculation did so far: the `speculation` object of answers and stream chunks."""
    return {"draft_mode": stats.draft_mode, "draft_max": "auto" if stats.adaptive else stats.draft_max,
            "drafted": stats.drafted, "accepted": stats.accepted, "acceptance": stats.acceptance_rate,
            "tokens_per_pass": stats.mean_accepted_length, "tokens_per_second": stats.tokens_per_second}


@dataclass(frozen=True)
class Answer:
    """What every object of one answer repeats."""

    id: str
    created: int
    model: str
    endpoint: str  # "chat" or "completion"

    def _head(self, object_name: str) -> dict[str, Any]:
        return {"id": self.id, "object": object_name, "created": self.created, "model": self.model}

    def whole(self, text: str, reason: str, stats: Stats) -> dict[str, Any]:
        """The non-streamed answer."""
        if self.endpoint == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": reason}
            head = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            head = self._head("text_completion")
        return {**head, "choices": [choice], "usage": usage(stats), "speculation": speculation(stats)}

    def chunk(self, text: str | None, reason: str | None, stats: Stats | None = None) -> dict[str, Any]:
        """One streamed chunk: `text` (None for chat's opening chunk, which names the role), the finish
        reason on the last one, and the speculation so far."""
        if self.endpoint == "chat":
            delta = {"role": "assistant", "content": ""} if text is None else ({"content": text} if text else {})
            chunk = {**self._head("chat.completion.chunk"),
                     "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]}
        else:
            chunk = {**self._head("text_completion"),
                     "choices": [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}]}
        if stats is not None:
            chunk["speculation"] = speculation(stats)
        return chunk

    def usage_chunk(self, stats: Stats) -> dict[str, Any]:
        """The chunk `stream_options.include_usage` asks for, after the last choice."""
        name = "chat.completion.chunk" if self.endpoint == "chat" else "text_completion"
        return {**self._head(name), "choices": [], "usage": usage(stats)}
