"""batch/lines.py: the input's form told from its first line, each line made the request the server would make of
it, and every line that cannot be used kept as a task with its own error, naming its line and field."""

from __future__ import annotations

import json

import pytest

from spec_cli.batch.lines import JSONL, OPENAI, TEXT, form_of, read_tasks
from spec_cli.errors import SpecError


def jsonl(*objects: object) -> str:
    return "\n".join(json.dumps(o) for o in objects)


def batch_line(custom_id: object, body: dict, url: str = "/v1/chat/completions", method: str = "POST") -> dict:
    return {"custom_id": custom_id, "method": method, "url": url, "body": body}


@pytest.mark.parametrize("lines, form", [
    (["", "  ", "tell me a story"], TEXT),
    (["{\"prompt\": \"hi\"}"], JSONL),
    (["{not json"], JSONL),
    (["[1, 2]"], TEXT),
    ([json.dumps(batch_line("a", {}))], OPENAI),
    ([], TEXT),
])
def test_the_form_is_told_by_the_first_line_that_is_not_blank(lines: list[str], form: str) -> None:
    assert form_of(lines) == form


def test_plain_text_lines_are_user_messages_numbered_by_their_line_blank_ones_skipped() -> None:
    form, tasks = read_tasks("first prompt\n\n  \nsecond prompt\r\n", raw=False)
    assert form == TEXT
    assert [(t.line, t.id) for t in tasks] == [(1, 1), (4, 4)]
    assert tasks[1].request.messages == [{"role": "user", "content": "second prompt"}]
    assert tasks[1].request.endpoint == "chat"


def test_raw_plain_text_lines_are_completions_without_the_template() -> None:
    _, tasks = read_tasks("the cat sat on\n", raw=True)
    assert tasks[0].request.endpoint == "completion"
    assert tasks[0].request.prompt == "the cat sat on"


def test_a_jsonl_line_places_its_system_message_before_the_prompt_and_keeps_its_settings() -> None:
    line = {"id": "q1", "prompt": "name a colour", "system": "answer in one word", "max_tokens": 5,
            "temperature": 0.5, "seed": 7, "stop": ["\n"]}
    _, [task] = read_tasks(jsonl(line), raw=False)
    request = task.request
    assert task.id == "q1" and task.error is None
    assert request.messages == [{"role": "system", "content": "answer in one word"},
                                {"role": "user", "content": "name a colour"}]
    assert (request.max_tokens, request.seed, request.stop) == (5, 7, ("\n",))
    assert request.sampling == {"temperature": 0.5}


@pytest.mark.parametrize("line, message, param", [
    ({"prompt": "x", "colour": "red"}, "unknown field 'colour'", "colour"),
    ({"id": 3}, "give either 'prompt' or 'messages'", "prompt"),
    ({"prompt": "x", "messages": []}, "give either 'prompt' or 'messages'", "prompt"),
    ({"prompt": 5}, "'prompt' must be a string", "prompt"),
    ({"prompt": "x", "system": ["a"]}, "'system' must be a string", "system"),
    ({"prompt": "x", "images": "cat.png"}, "'images' must be a list of image files", "images"),
    ({"prompt": "x", "max_tokens": -1}, "max_tokens", "max_tokens"),
])
def test_a_bad_jsonl_line_becomes_a_task_with_its_error_naming_the_line_and_field(line: dict, message: str,
                                                                                   param: str) -> None:
    _, tasks = read_tasks(jsonl({"prompt": "fine"}, line), raw=False)
    assert tasks[0].error is None and tasks[0].request is not None
    bad = tasks[1]
    assert bad.request is None and bad.line == 2
    assert bad.error.message.startswith("line 2: ") and message in bad.error.message
    assert bad.error.param == param


def test_lines_that_are_not_json_objects_are_error_lines_and_the_rest_still_run() -> None:
    _, tasks = read_tasks('{"prompt": "a"}\n{broken\n[1]\n{"prompt": "b"}', raw=False)
    assert [t.error.code if t.error else None for t in tasks] == [None, "invalid_json", "invalid_json", None]
    assert "line 2 is not valid JSON" in tasks[1].error.message
    assert "line 3 is not a JSON object" in tasks[2].error.message


@pytest.mark.parametrize("task_id", [True, 1.5, None, ["a"]])
def test_a_jsonl_id_must_be_a_string_or_an_integer(task_id: object) -> None:
    _, [task] = read_tasks(jsonl({"id": task_id, "prompt": "x"}), raw=False)
    assert task.error.param == "id" and "'id' must be a string or an integer" in task.error.message


def test_an_id_used_twice_stops_the_batch_naming_both_lines() -> None:
    with pytest.raises(SpecError, match=r'line 3 repeats the id "a" of line 1'):
        read_tasks(jsonl({"id": "a", "prompt": "x"}, {"id": "b", "prompt": "y"}, {"id": "a", "prompt": "z"}), False)


def test_an_integer_id_and_the_same_digits_as_text_are_two_ids() -> None:
    _, tasks = read_tasks(jsonl({"id": 1, "prompt": "x"}, {"id": "1", "prompt": "y"}), raw=False)
    assert [t.id for t in tasks] == [1, "1"]


def test_raw_jsonl_prompts_are_completions_and_a_system_message_is_refused() -> None:
    _, tasks = read_tasks(jsonl({"prompt": "a b c"}, {"prompt": "x", "system": "be brief"}), raw=True)
    assert tasks[0].request.endpoint == "completion" and tasks[0].request.prompt == "a b c"
    assert "'system' needs the chat template" in tasks[1].error.message


def test_batch_api_lines_parse_their_bodies_as_the_server_does() -> None:
    text = jsonl(batch_line("c1", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}),
                 batch_line("c2", {"prompt": "once upon"}, url="/v1/completions"))
    form, tasks = read_tasks(text, raw=False)
    assert form == OPENAI
    assert [(t.id, t.request.endpoint) for t in tasks] == [("c1", "chat"), ("c2", "completion")]
    assert tasks[0].request.max_tokens == 3


@pytest.mark.parametrize("line, message, param", [
    (batch_line("c", {"prompt": "x"}, url="/v1/embeddings"), "'url' must be one of", "url"),
    (batch_line("c", {"prompt": "x"}, url="/v1/completions", method="GET"), "'method' must be POST", "method"),
    (batch_line("c", {"prompt": "x", "stream": True}, url="/v1/completions"), "'stream' is not supported", "stream"),
    (batch_line("c", {"messages": [{"role": "user", "content": "x"}],
                      "tools": [{"type": "function", "function": {"name": "f"}}]}), "'tools' are not supported",
     "tools"),
    (batch_line(7, {"prompt": "x"}, url="/v1/completions"), "'custom_id' must be a string", "id"),
])
def test_a_batch_api_line_the_batch_cannot_serve_is_an_error_line(line: dict, message: str, param: str) -> None:
    _, [task] = read_tasks(json.dumps(line), raw=False)
    assert task.request is None and message in task.error.message and task.error.param == param
