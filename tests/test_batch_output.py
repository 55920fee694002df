"""batch/output.py: output lines in each form, whole lines appended to a file, a partly written last line cut off
when resuming, another batch's file refused, and `--ordered` holding lines back until every earlier one is out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spec_cli.api.errors import RequestError
from spec_cli.batch.lines import JSONL, OPENAI, TEXT, Task, read_tasks
from spec_cli.batch.output import InOrder, Output, Result, check_resumable, done_ids, line_of
from spec_cli.errors import SpecError


def test_a_text_line_gives_its_id_text_and_finish_reason_and_token_ids_only_when_asked() -> None:
    result = Result(Task(2, 2), text="a mat", finish_reason="length", token_ids=(5, 9))
    assert line_of(result, TEXT, token_ids=False) == {"id": 2, "text": "a mat", "finish_reason": "length"}
    assert line_of(result, TEXT, token_ids=True)["token_ids"] == [5, 9]


def test_an_error_line_names_its_input_line() -> None:
    result = Result(Task(4, "q"), error=RequestError("line 4: 'prompt' must be a string", param="prompt"))
    assert line_of(result, JSONL, token_ids=False) == {"id": "q", "line": 4,
                                                        "error": "line 4: 'prompt' must be a string"}


def test_batch_api_lines_get_the_batch_api_s_output_objects_with_the_server_s_status_and_body() -> None:
    ok = line_of(Result(Task(1, "c1"), body={"object": "chat.completion"}), OPENAI, token_ids=False)
    failed = line_of(Result(Task(2, "c2"), error=RequestError("'url' must be one of …", param="url")), OPENAI, False)
    assert ok["custom_id"] == "c1" and ok["error"] is None and ok["id"].startswith("batch_req_")
    assert ok["response"]["status_code"] == 200 and ok["response"]["body"] == {"object": "chat.completion"}
    assert failed["response"]["status_code"] == 400
    assert failed["response"]["body"]["error"]["param"] == "url"
    assert ok["id"] != failed["id"] and ok["response"]["request_id"] != failed["response"]["request_id"]


def test_output_lines_are_appended_whole_to_what_the_file_holds(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_text('{"id": 1, "text": "earlier"}\n')
    output = Output(path)
    output.write({"id": 2, "text": "ünïcode stays as it is"})
    output.close()
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["id"] for line in lines] == [1, 2]
    assert "ünïcode" in lines[1]


def test_an_output_that_cannot_be_opened_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot write .*missing"):
        Output(tmp_path / "missing" / "out.jsonl")


def test_resuming_cuts_off_a_partly_written_last_line_and_returns_the_ids_done(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_bytes(b'{"id": 1, "text": "a"}\n{"id": "two", "text": "b"}\n{"id": 3, "te')
    assert done_ids(path, JSONL) == {"1", '"two"'}
    assert path.read_bytes().endswith(b'"b"}\n')


def test_resuming_reads_batch_api_lines_by_their_custom_id(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_text(json.dumps({"id": "batch_req_x", "custom_id": "c1", "response": {}}) + "\n")
    assert done_ids(path, OPENAI) == {'"c1"'}


def test_no_output_file_yet_means_nothing_done(tmp_path: Path) -> None:
    assert done_ids(tmp_path / "new.jsonl", JSONL) == set()


@pytest.mark.parametrize("content", [b"some notes\n", b'{"text": "no id"}\n', b"[1, 2]\n"])
def test_a_file_spec_batch_did_not_write_is_refused_and_left_as_it_was(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(content)
    with pytest.raises(SpecError, match="line 1 is not a line spec batch writes"):
        done_ids(path, JSONL)
    assert path.read_bytes() == content


def test_another_batch_s_output_is_refused_naming_an_id_not_in_the_input(tmp_path: Path) -> None:
    _, tasks = read_tasks('{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": "y"}', raw=False)
    check_resumable(tmp_path / "out.jsonl", {'"a"'}, tasks)
    with pytest.raises(SpecError, match="such as \"zz\".*another batch's output"):
        check_resumable(tmp_path / "out.jsonl", {'"a"', '"zz"'}, tasks)


def test_in_order_holds_each_line_until_every_earlier_one_is_written(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    tasks = [Task(n, n) for n in (1, 2, 3)]
    output = Output(path)
    ordered = InOrder(output, tasks)

    def written() -> list[int]:
        return [json.loads(line)["id"] for line in path.read_text().splitlines()]

    ordered.write(tasks[2], {"id": 3})
    ordered.write(tasks[1], {"id": 2})
    assert written() == []
    ordered.write(tasks[0], {"id": 1})
    assert written() == [1, 2, 3]
    output.close()
