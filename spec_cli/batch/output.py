"""The output of `spec batch`: one JSON line per input line, appended whole as each finishes.

Each line goes out in one `write` on a file opened for appending, so a batch stopped by Ctrl-C, SIGTERM or a
crash leaves only whole lines, bar at most a partly written last one. `Resumed` reads what an output file
already holds: a partly written last line is cut off (its task runs again), the ids there are skipped, and a
file whose ids are not the input's (another batch's output) is refused rather than appended to.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spec_cli.batch.lines import OPENAI, Task
from spec_cli.decoding.stats import Stats
from spec_cli.errors import SpecError
from spec_cli.api.errors import RequestError

STATS = ("prompt_tokens", "prompt_cached", "generated_tokens", "drafted", "accepted", "acceptance_rate",
         "tokens_per_second", "draft_mode", "ways")


@dataclass(frozen=True)
class Result:
    """A finished task: its text (or the answer the server would give, for Batch API lines) and statistics, or
    its error."""

    task: Task
    text: str = ""
    finish_reason: str = ""
    token_ids: tuple[int, ...] = ()
    stats: Stats | None = None
    body: dict[str, Any] | None = None
    error: RequestError | None = None


def line_of(result: Result, form: str, token_ids: bool) -> dict[str, Any]:
    """The output line for `result`: the Batch API's output object for its form, else id, text, finish reason,
    token ids (when asked for) and the statistics; an error line names its input line."""
    task = result.task
    if form == OPENAI:
        if result.error is not None:
            response: dict[str, Any] | None = {"status_code": result.error.status, "request_id": _request_id(),
                                               "body": result.error.body()}
        else:
            response = {"status_code": 200, "request_id": _request_id(), "body": result.body}
        custom_id = task.id if isinstance(task.id, str) else None
        return {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": custom_id, "response": response, "error": None}
    if result.error is not None:
        return {"id": task.id, "line": task.line, "error": result.error.message}
    line: dict[str, Any] = {"id": task.id, "text": result.text, "finish_reason": result.finish_reason}
    if token_ids:
        line["token_ids"] = list(result.token_ids)
    if result.stats is not None:
        every = result.stats.as_dict()
        line["stats"] = {name: every[name] for name in STATS}
    return line


def _request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


def done_ids(path: Path, form: str) -> set[str]:
    """The ids (as JSON text) of the lines `path` already holds; a partly written last line is cut off. A line
    that is not one of spec batch's is refused."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return set()
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror}") from None
    whole = data[:data.rfind(b"\n") + 1]
    if len(whole) < len(data):
        with open(path, "r+b") as file:  # the last line was being written when the batch stopped
            file.truncate(len(whole))
    key = "custom_id" if form == OPENAI else "id"
    ids = set()
    for number, line in enumerate(whole.splitlines(), 1):
        try:
            written = json.loads(line)
        except ValueError:
            written = None
        if not isinstance(written, dict) or key not in written:
            raise SpecError(f"{path} line {number} is not a line spec batch writes for this input; "
                            "choose another --output")
        ids.add(json.dumps(written[key]))
    return ids


def check_resumable(path: Path, done: set[str], tasks: list[Task]) -> None:
    """Refuse an output file holding ids the input does not have: it is another batch's."""
    foreign = done - {json.dumps(task.id) for task in tasks}
    if foreign:
        raise SpecError(f"{path} holds ids that are not in the input (such as {sorted(foreign)[0]}): it is another "
                        "batch's output; choose another --output")


class Output:
    """Where output lines go: a file, appended whole line by line, or stdout."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        if path is None:
            return
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            raise SpecError(f"cannot write {path}: {exc.strerror}") from None

    def write(self, line: dict[str, Any]) -> None:
        text = json.dumps(line, ensure_ascii=False) + "\n"
        if self.path is None:
            sys.stdout.write(text)
            sys.stdout.flush()
            return
        data = text.encode()
        while data:
            data = data[os.write(self._fd, data):]

    def close(self) -> None:
        if self.path is not None:
            os.close(self._fd)


class InOrder:
    """Lines handed over in any order, written in the order of their tasks (`--ordered`): each as soon as every
    earlier one has been."""

    def __init__(self, output: Output, order: list[Task]) -> None:
        self.output = output
        self._place = {id(task): i for i, task in enumerate(order)}
        self._held: dict[int, dict[str, Any]] = {}
        self._next = 0

    def write(self, task: Task, line: dict[str, Any]) -> None:
        self._held[self._place[id(task)]] = line
        while self._next in self._held:
            self.output.write(self._held.pop(self._next))
            self._next += 1
