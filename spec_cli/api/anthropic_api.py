"""Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) over the chat route, for Claude Code and
other Anthropic-API agents pointed at a local server: a Messages body as the chat request it asks for (system,
text, tool_use and tool_result blocks, tools with their input_schema, tool_choice, stop_sequences), and the answer
as a message of content blocks or as the API's streamed events. Tool calls are in the model's own convention
underneath, held by a grammar, as the chat route's are."""

from __future__ import annotations

import json
from typing import Any

from spec_cli.api.errors import RequestError
from spec_cli.api.openai_api import ApiRequest, parse_chat
from spec_cli.decoding.stats import Stats

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}  # from OpenAI's finish reasons


def parse_messages(body: object, counting: bool = False) -> ApiRequest:
    """A Messages body, checked as the chat request it asks for; `counting` (count_tokens) needs no max_tokens."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    max_tokens = body.get("max_tokens")
    if not counting and max_tokens is None:
        raise RequestError("'max_tokens' is required", param="max_tokens")
    chat: dict[str, Any] = {"messages": [*_system(body.get("system")), *_turns(body.get("messages"))],
                            "max_tokens": max_tokens, "stop": body.get("stop_sequences"),
                            **{name: body[name] for name in ("model", "temperature", "top_p", "top_k", "stream",
                                                             "seed") if name in body}}
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
        chat["tool_choice"] = _tool_choice(body.get("tool_choice"))
    return parse_chat(chat)


def _system(system: object) -> list[dict[str, Any]]:
    if system is None:
        return []
    return [{"role": "system", "content": _text(system, "system")}]


def _text(content: object, where: str) -> str:
    """A string, or the text of a list of text blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(b, dict) and b.get("type") == "text" for b in content):
        return "".join(_string(block.get("text"), f"{where}.text") for block in content)
    raise RequestError(f"'{where}' must be text or a list of text blocks", param=where)


def _turns(messages: object) -> list[dict[str, Any]]:
    """Anthropic's turns as chat messages: a user turn's tool_result blocks become tool messages (before its
    text), an assistant turn's tool_use blocks its tool calls."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list of messages", param="messages")
    turns: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise RequestError(f"'{where}' must be an object with role 'user' or 'assistant'", param=where)
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list) or not all(isinstance(block, dict) for block in blocks):
            raise RequestError(f"'{where}.content' must be text or a list of content blocks", param=f"{where}.content")
        turns += _user(blocks, where) if message["role"] == "user" else [_assistant(blocks, where)]
    return turns


def _user(blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    results, parts = [], []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        if block.get("type") == "tool_result":
            content = block.get("content", "")
            results.append({"role": "tool", "tool_call_id": _string(block.get("tool_use_id"), f"{at}.tool_use_id"),
                            "content": _text(content, f"{at}.content") if content else ""})
        elif block.get("type") == "text":
            parts.append({"type": "text", "text": _string(block.get("text"), f"{at}.text")})
        elif block.get("type") == "image" and isinstance(block.get("source"), dict) \
                and block["source"].get("type") == "base64":
            source = block["source"]
            parts.append({"type": "image_url", "image_url": {
                "url": f"data:{source.get('media_type', '')};base64,{source.get('data', '')}"}})
        else:
            raise RequestError(f"'{at}': a user turn takes text, base64 image and tool_result blocks, got "
                               f"{block.get('type')!r}", param=at)
    return [*results, *([{"role": "user", "content": parts}] if parts else [])]


def _assistant(blocks: list[dict[str, Any]], where: str) -> dict[str, Any]:
    text, calls = [], []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        if block.get("type") == "text":
            text.append(_string(block.get("text"), f"{at}.text"))
        elif block.get("type") == "tool_use":
            calls.append({"id": _string(block.get("id"), f"{at}.id"), "type": "function",
                          "function": {"name": _string(block.get("name"), f"{at}.name"),
                                       "arguments": json.dumps(block.get("input", {}))}})
        elif block.get("type") not in ("thinking", "redacted_thinking"):  # a thought is not shown to the model again
            raise RequestError(f"'{at}': an assistant turn takes text, tool_use and thinking blocks, got "
                               f"{block.get('type')!r}", param=at)
    return {"role": "assistant", "content": "".join(text), **({"tool_calls": calls} if calls else {})}


def _tools(tools: object) -> list[dict[str, Any]]:
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise RequestError("'tools' must be a list of tools", param="tools")
    return [{"type": "function", "function": {"name": tool.get("name"), "description": tool.get("description", ""),
                                              "parameters": tool.get("input_schema", {"type": "object"})}}
            for tool in tools]


def _tool_choice(choice: object) -> object:
    if choice is None:
        return "auto"
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if kind in ("auto", "any", "none"):
        return {"auto": "auto", "any": "required", "none": "none"}[kind]
    raise RequestError("'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"none\" | \"tool\"}",
                       param="tool_choice")


def _string(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise RequestError(f"'{where}' must be a string", param=where)
    return value


def stop_reason(finish: str, by_stop_string: bool) -> str:
    """Anthropic's stop_reason for an answer that ended with OpenAI's `finish` reason."""
    return "stop_sequence" if by_stop_string else STOP_REASONS.get(finish, "end_turn")


def usage(stats: Stats) -> dict[str, int]:
    return {"input_tokens": stats.prompt_tokens, "output_tokens": stats.generated_tokens}


def message(answer_id: str, model: str, chat_message: dict[str, Any], reason: str, stop_sequence: str | None,
            stats: Stats) -> dict[str, Any]:
    """The whole answer: a thought, text and tool_use blocks, as the chat route's message holds them."""
    blocks: list[dict[str, Any]] = []
    if chat_message.get("reasoning_content"):
        blocks.append({"type": "thinking", "thinking": chat_message["reasoning_content"], "signature": ""})
    if chat_message.get("content"):
        blocks.append({"type": "text", "text": chat_message["content"]})
    blocks += [{"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                "input": _input(call["function"]["arguments"])} for call in chat_message.get("tool_calls", [])]
    return {"id": answer_id, "type": "message", "role": "assistant", "model": model, "content": blocks,
            "stop_reason": reason, "stop_sequence": stop_sequence, "usage": usage(stats)}


def _input(arguments: str) -> dict[str, Any]:
    """A call's input object; a call that max_tokens cut short has none yet (its stop_reason says so)."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class EventWriter:
    """The streamed events of one answer, from the chat route's deltas: message_start, then a content block at a
    time (content_block_start, its deltas, content_block_stop: a thought, text, each tool_use with its input's
    JSON as it is written), message_delta with the stop reason and usage, message_stop."""

    def __init__(self, answer_id: str, model: str) -> None:
        self.answer_id, self.model = answer_id, model
        self._open: str | None = None  # the kind of the block open now
        self._index = -1

    def start(self, stats: Stats) -> list[str]:
        return [event("message_start", {"message": {
            "id": self.answer_id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": stats.prompt_tokens,
                                                                 "output_tokens": 0}}})]

    def deltas(self, deltas: list[dict[str, Any]]) -> list[str]:
        out: list[str] = []
        for delta in deltas:
            if delta.get("reasoning_content"):
                out += self._block("thinking", {"type": "thinking", "thinking": ""})
                out.append(self._delta({"type": "thinking_delta", "thinking": delta["reasoning_content"]}))
            if delta.get("content"):
                out += self._block("text", {"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": delta["content"]}))
            for call in delta.get("tool_calls", []):
                if "id" in call:
                    out += self._block("tool_use", {"type": "tool_use", "id": call["id"],
                                                    "name": call["function"]["name"], "input": {}}, new=True)
                if call["function"].get("arguments"):
                    out.append(self._delta({"type": "input_json_delta",
                                            "partial_json": call["function"]["arguments"]}))
        return out

    def finish(self, reason: str, by_stop_string: bool, stats: Stats) -> list[str]:
        """The last events, for an answer that ended with OpenAI's finish `reason`."""
        delta = {"stop_reason": stop_reason(reason, by_stop_string), "stop_sequence": None}
        return [*self._close(), event("message_delta", {"delta": delta,
                                                        "usage": {"output_tokens": stats.generated_tokens}}),
                event("message_stop", {})]

    def error(self, exc: RequestError) -> str:
        return event("error", {"error": error(exc)["error"]})

    def _block(self, kind: str, start: dict[str, Any], new: bool = False) -> list[str]:
        if self._open == kind and not new:
            return []
        out = self._close()
        self._open, self._index = kind, self._index + 1
        return [*out, event("content_block_start", {"index": self._index, "content_block": start})]

    def _delta(self, delta: dict[str, Any]) -> str:
        return event("content_block_delta", {"index": self._index, "delta": delta})

    def _close(self) -> list[str]:
        if self._open is None:
            return []
        self._open = None
        return [event("content_block_stop", {"index": self._index})]


def event(kind: str, payload: dict[str, Any]) -> str:
    """One server-sent event as the Messages API sends it: its type on the event line and in the data."""
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **payload}, ensure_ascii=False)}\n\n"


def error(exc: RequestError) -> dict[str, Any]:
    """Anthropic's error object for a request that cannot be served."""
    kind = {401: "authentication_error", 404: "not_found_error", 413: "request_too_large",
            503: "overloaded_error"}.get(exc.status, "invalid_request_error" if exc.status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": exc.message}}
