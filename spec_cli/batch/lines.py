"""The input of `spec batch`: each line a task, checked as the server checks a request.

Three forms, told by the first line that is not blank:
- plain text: each line a prompt (blank lines skipped), its id its line number;
- JSONL: each line an object with `prompt` or `messages` and optional `id`, `system`, `images` (image files,
  placed before the prompt), `max_tokens`, `temperature`, `seed`, `json_schema`, `grammar`, `stop`;
- the OpenAI Batch API's request lines (`custom_id`, `method`, `url`, `body`), whose bodies are those of
  `/v1/chat/completions` or `/v1/completions`.

A line that cannot be used (not JSON, an unknown field, a bad value) becomes a task with its error, answered
by an error line; only ids used twice stop the batch before it starts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from spec_cli.errors import SpecError
from spec_cli.llama.prompt_text import with_images
from spec_cli.llama.vision import Image, read_image
from spec_cli.api import openai_api
from spec_cli.api.errors import RequestError
from spec_cli.api.images import ImageUrl
from spec_cli.api.openai_api import ApiRequest

TEXT, JSONL, OPENAI = "text", "jsonl", "openai"
FIELDS = ("id", "prompt", "messages", "system", "images", "max_tokens", "temperature", "seed", "json_schema", "grammar",
          "stop")
ENDPOINTS = {"/v1/chat/completions": openai_api.parse_chat, "/v1/completions": openai_api.parse_completion}

Id = str | int


@dataclass(frozen=True)
class Task:
    """One input line: its number, its id, and the request it makes, or why it cannot make one."""

    line: int
    id: Id
    request: ApiRequest | None = None
    error: RequestError | None = None


def form_of(lines: list[str]) -> str:
    """The input's form, from its first line that is not blank."""
    first = next((line.strip() for line in lines if line.strip()), "")
    if not first.startswith("{"):
        return TEXT
    try:
        parsed = json.loads(first)
    except ValueError:
        return JSONL
    return OPENAI if isinstance(parsed, dict) and "custom_id" in parsed else JSONL


def read_tasks(text: str, raw: bool) -> tuple[str, list[Task]]:
    """The input's form and its tasks; `raw`: JSONL prompts go to the model as they are (no chat template).
    Ids used twice are refused, naming both lines."""
    lines = text.splitlines()
    form = form_of(lines)
    tasks = [_task(number, line, form, raw) for number, line in enumerate(lines, 1) if line.strip()]
    seen: dict[str, int] = {}
    for task in tasks:
        key = json.dumps(task.id)
        if key in seen:
            raise SpecError(f"line {task.line} repeats the id {key} of line {seen[key]}: ids must be unique")
        seen[key] = task.line
    return form, tasks


def _task(number: int, line: str, form: str, raw: bool) -> Task:
    if form == TEXT:
        prompt = line.rstrip("\r")
        if raw:
            return Task(number, number, ApiRequest("completion", prompt=prompt))
        return Task(number, number, ApiRequest("chat", messages=[{"role": "user", "content": prompt}]))
    try:
        fields = json.loads(line)
    except (ValueError, RecursionError):
        return Task(number, number, error=RequestError(f"line {number} is not valid JSON", code="invalid_json"))
    if not isinstance(fields, dict):
        return Task(number, number, error=RequestError(f"line {number} is not a JSON object", code="invalid_json"))
    task_id = fields.get("custom_id" if form == OPENAI else "id", number)
    if isinstance(task_id, bool) or not isinstance(task_id, str if form == OPENAI else (str, int)):
        what = "'custom_id' must be a string" if form == OPENAI else "'id' must be a string or an integer"
        return Task(number, number, error=RequestError(f"line {number}: {what}", param="id"))
    try:
        request = _openai_request(fields) if form == OPENAI else _jsonl_request(fields, raw)
    except RequestError as exc:
        exc.message = f"line {number}: {exc.message}"
        return Task(number, task_id, error=exc)
    return Task(number, task_id, request)


def _jsonl_request(fields: dict[str, Any], raw: bool) -> ApiRequest:
    """A JSONL line as the server's request: `prompt` as a user message (raw: a completion), after `system`."""
    unknown = [name for name in fields if name not in FIELDS]
    if unknown:
        raise RequestError(f"unknown field {unknown[0]!r}; a line takes {', '.join(FIELDS)}", param=unknown[0])
    if ("prompt" in fields) == ("messages" in fields):
        raise RequestError("give either 'prompt' or 'messages'", param="prompt")
    body = {name: fields[name] for name in FIELDS[5:] if name in fields}
    images = _images(fields.get("images", []))
    if images and "messages" in fields:
        raise RequestError("'images' goes with 'prompt'; in 'messages' give image_url parts", param="images")
    system = fields.get("system")
    if system is not None and not isinstance(system, str):
        raise RequestError("'system' must be a string", param="system")
    if "prompt" in fields and raw:
        if system is not None:
            raise RequestError("'system' needs the chat template, which --raw leaves out", param="system")
        return replace(openai_api.parse_completion({**body, "prompt": fields["prompt"]}), images=images)
    if "prompt" in fields:
        if not isinstance(fields["prompt"], str):
            raise RequestError("'prompt' must be a string", param="prompt")
        messages: object = [{"role": "user", "content": with_images(fields["prompt"], len(images))}]
    else:
        messages = fields["messages"]
    if system is not None and isinstance(messages, list):
        messages = [{"role": "system", "content": system}, *messages]
    request = openai_api.parse_chat({**body, "messages": messages})
    if any(isinstance(image, ImageUrl) for image in request.images):
        raise RequestError("a batch fetches no image URLs: give files in 'images', or data: URLs", param="messages")
    return replace(request, images=images) if images else request


def _images(value: object) -> tuple[Image, ...]:
    """The files a line's `images` names (paths from the working folder), read now: a bad one fails its line."""
    if not isinstance(value, list) or not all(isinstance(path, str) for path in value):
        raise RequestError("'images' must be a list of image files", param="images")
    try:
        return tuple(read_image(Path(path).expanduser()) for path in value)
    except SpecError as exc:
        raise RequestError(str(exc), param="images") from None


def _openai_request(fields: dict[str, Any]) -> ApiRequest:
    """A Batch API request line: POST to one of the two endpoints, with its body checked as the server would."""
    if fields.get("method", "POST") != "POST":
        raise RequestError("'method' must be POST", param="method")
    parse = ENDPOINTS.get(fields.get("url"))  # type: ignore[arg-type]
    if parse is None:
        raise RequestError(f"'url' must be one of {', '.join(ENDPOINTS)}", param="url")
    request = parse(fields.get("body"))
    if request.stream:
        raise RequestError("'stream' is not supported in a batch", param="stream")
    if request.tools is not None:
        raise RequestError("'tools' are not supported by spec batch; send them to spec serve", param="tools")
    return request
