"""OpenAI's Responses API (`/v1/responses`) over the chat route, for Codex CLI, the OpenAI Agents SDK and newer
OpenAI SDK code: a Responses body as the chat request it asks for (input items: messages, function_call and
function_call_output; `instructions`; function `tools`; `tool_choice`; `text.format`), and the answer as a response
of output items or as the API's streamed events, in their order. Nothing is stored between requests, so a
`previous_response_id` is refused with what to send instead."""

from __future__ import annotations

import json
import uuid
from typing import Any

from spec_cli.api.errors import RequestError
from spec_cli.api.openai_api import ApiRequest, parse_chat
from spec_cli.decoding.stats import Stats

TEXT_PARTS = ("input_text", "output_text", "text")


def parse_responses(body: object) -> ApiRequest:
    """A Responses body, checked as the chat request it asks for."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    if body.get("previous_response_id") is not None:
        raise RequestError("this server keeps no responses: send the whole conversation as 'input' (the earlier "
                           "items and the new ones) instead of 'previous_response_id'", param="previous_response_id")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise RequestError("'instructions' must be a string", param="instructions")
    chat: dict[str, Any] = {
        "messages": [*([{"role": "system", "content": instructions}] if instructions else []),
                     *_items(body.get("input"))],
        "max_tokens": body.get("max_output_tokens"),
        **{name: body[name] for name in ("model", "temperature", "top_p", "stream", "seed", "parallel_tool_calls")
           if name in body}}
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
        chat["tool_choice"] = _tool_choice(body.get("tool_choice", "auto"))
    text_format = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if text_format is not None:
        chat["response_format"] = _format(text_format)
    return parse_chat(chat)


def _items(value: object) -> list[dict[str, Any]]:
    """The input: text (one user message), or items as chat messages; a run of function_call items is one
    assistant message's tool calls."""
    if isinstance(value, str) and value:
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise RequestError("'input' must be text or a non-empty list of input items", param="input")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            messages.append({"role": item.get("role"), "content": _content(item.get("content"), where)})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")}}
            if messages and messages[-1]["role"] == "assistant" and not messages[-1]["content"]:
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                             "content": output if isinstance(output, str) else json.dumps(output)})
        elif kind != "reasoning":  # a thought is not shown to the model again
            raise RequestError(f"'{where}': input items are messages, function_call and function_call_output, "
                               f"got {kind!r}", param=where)
    return messages


def _content(content: object, where: str) -> object:
    """A message's content as the chat route takes it: text, or its parts (input_image as image_url)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not all(isinstance(part, dict) for part in content):
        raise RequestError(f"'{where}.content' must be text or a list of content parts", param=f"{where}.content")
    parts = []
    for j, part in enumerate(content):
        if part.get("type") in TEXT_PARTS:
            parts.append({"type": "text", "text": part.get("text")})
        elif part.get("type") == "input_image":
            parts.append({"type": "image_url", "image_url": {"url": part.get("image_url")}})
        else:
            raise RequestError(f"'{where}.content[{j}]': parts are input_text, output_text and input_image, got "
                               f"{part.get('type')!r}", param=f"{where}.content[{j}]")
    return parts


def _tools(tools: object) -> list[dict[str, Any]]:
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise RequestError("'tools' must be a list of tools", param="tools")
    unknown = [tool.get("type") for tool in tools if tool.get("type") != "function"]
    if unknown:
        raise RequestError(f"only function tools are served here, got {unknown[0]!r}", param="tools",
                           code="unsupported_parameter")
    return [{"type": "function", "function": {key: tool[key] for key in ("name", "description", "parameters", "strict")
                                              if key in tool}} for tool in tools]


def _tool_choice(choice: object) -> object:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _format(text_format: object) -> dict[str, Any]:
    """`text.format` as the chat route's response_format: json_schema's name, schema and strict sit beside type."""
    if not isinstance(text_format, dict):
        raise RequestError("'text.format' must be an object", param="text.format")
    if text_format.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {key: text_format[key] for key in ("name", "schema", "strict")
                                                       if key in text_format}}
    return text_format


def _usage(stats: Stats) -> dict[str, int]:
    return {"input_tokens": stats.prompt_tokens, "output_tokens": stats.generated_tokens,
            "total_tokens": stats.prompt_tokens + stats.generated_tokens}


class ResponseWriter:
    """One answer as a response: its output items (a thought, a message of output_text, each function_call) whole,
    or as the events that build them, each with its sequence number."""

    def __init__(self, model: str, created: int) -> None:
        self.id, self.model, self.created = f"resp_{uuid.uuid4().hex}", model, created
        self.output: list[dict[str, Any]] = []
        self._sequence = 0
        self._open: dict[str, Any] | None = None  # the item being written

    def response(self, status: str, stats: Stats | None = None, cut: bool = False) -> dict[str, Any]:
        return {"id": self.id, "object": "response", "created_at": self.created, "model": self.model,
                "status": status, "output": self.output, "parallel_tool_calls": True, "tool_choice": "auto",
                "tools": [], "error": None, "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
                "usage": _usage(stats) if stats is not None else None}

    def start(self, _stats: Stats) -> list[str]:
        created = self.response("in_progress")
        return [self._event("response.created", {"response": created}),
                self._event("response.in_progress", {"response": created})]

    def deltas(self, deltas: list[dict[str, Any]]) -> list[str]:
        """The events for the chat route's deltas: text into a message's output_text, a call's name opening a
        function_call item and its arguments as they come."""
        out: list[str] = []
        for delta in deltas:
            if delta.get("reasoning_content"):
                out += self._item({"type": "reasoning", "id": f"rs_{uuid.uuid4().hex}", "summary": [],
                                   "content": [{"type": "reasoning_text", "text": ""}]}, "reasoning")
                self._open["content"][0]["text"] += delta["reasoning_content"]
            if delta.get("content"):
                out += self._item({"type": "message", "id": f"msg_{uuid.uuid4().hex}", "status": "in_progress",
                                   "role": "assistant", "content": []}, "message")
                out += self._text(delta["content"])
            for call in delta.get("tool_calls", []):
                if "id" in call:
                    out += self._item({"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call["id"],
                                       "name": call["function"]["name"], "arguments": "", "status": "in_progress"},
                                      "function_call", new=True)
                if call["function"].get("arguments"):
                    self._open["arguments"] += call["function"]["arguments"]
                    out.append(self._event("response.function_call_arguments.delta", {
                        "item_id": self._open["id"], "output_index": len(self.output) - 1,
                        "delta": call["function"]["arguments"]}))
        return out

    def finish(self, reason: str, _by_stop_string: bool, stats: Stats) -> list[str]:
        """The last events: the open item done, then the response, incomplete where `reason` is OpenAI's
        "length" (max_output_tokens)."""
        cut = reason == "length"
        out = self._close()
        return [*out, self._event("response.incomplete" if cut else "response.completed",
                                  {"response": self.response("incomplete" if cut else "completed", stats, cut)})]

    def error(self, exc: RequestError) -> str:
        return self._event("error", {"code": exc.code or exc.kind, "message": exc.message, "param": exc.param})

    def whole(self, message: dict[str, Any], stats: Stats, cut: bool) -> dict[str, Any]:
        """The response of the chat route's whole `message`: its thought, its text, its calls, as output items."""
        self.deltas([{"reasoning_content": message.get("reasoning_content")}, {"content": message.get("content")},
                     {"tool_calls": [{"id": call["id"], "function": call["function"]}
                                     for call in message.get("tool_calls", [])]}])
        self._close()
        return self.response("incomplete" if cut else "completed", stats, cut)

    def _item(self, item: dict[str, Any], kind: str, new: bool = False) -> list[str]:
        if self._open is not None and self._open["type"] == kind and not new:
            return []
        out = self._close()
        self._open = item
        self.output.append(item)
        out.append(self._event("response.output_item.added", {"output_index": len(self.output) - 1, "item": item}))
        return out

    def _text(self, text: str) -> list[str]:
        message, out = self._open, []
        where = {"item_id": message["id"], "output_index": len(self.output) - 1, "content_index": 0}
        if not message["content"]:
            message["content"].append({"type": "output_text", "text": "", "annotations": []})
            out.append(self._event("response.content_part.added", {**where, "part": message["content"][0]}))
        message["content"][0]["text"] += text
        out.append(self._event("response.output_text.delta", {**where, "delta": text}))
        return out

    def _close(self) -> list[str]:
        item, self._open = self._open, None
        if item is None:
            return []
        where = {"item_id": item["id"], "output_index": len(self.output) - 1}
        out = []
        if item["type"] == "message" and item["content"]:
            part = item["content"][0]
            out += [self._event("response.output_text.done", {**where, "content_index": 0, "text": part["text"]}),
                    self._event("response.content_part.done", {**where, "content_index": 0, "part": part})]
        if item["type"] == "function_call":
            out.append(self._event("response.function_call_arguments.done", {**where, "arguments": item["arguments"]}))
        if "status" in item:
            item["status"] = "completed"
        out.append(self._event("response.output_item.done", {"output_index": where["output_index"], "item": item}))
        return out

    def _event(self, kind: str, payload: dict[str, Any]) -> str:
        self._sequence += 1
        data = {"type": kind, "sequence_number": self._sequence, **payload}
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"
