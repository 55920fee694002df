"""`spec batch`: every input form answered line for line with what a single run writes, bad lines as error lines,
ids refused when used twice, and an output that resumes: only whole lines, each id exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.tiny_models import N_CTX_TRAIN
from typer.testing import CliRunner

from spec_cli import load_pair
from spec_cli import pair as pairs
from spec_cli.batch.lines import read_tasks
from spec_cli.batch.runner import BatchRunner
from spec_cli.cli import options
from spec_cli.cli.app import app
from spec_cli.decoding.draft_length import AUTO_K_MAX
from spec_cli.request import GenerationRequest
from support import children
from support.exactness import finish, greedy_agreement

runner = CliRunner()
PROMPTS = ["the cat sat on", "a dog ran to the", "the cat sat on the mat and", "one two three four"]


def batch(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = runner.invoke(app, ["batch", *args], input=stdin)
    return result.exit_code, result.stdout, result.stderr


def lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def alone_texts(model: Path, prompts: list[str], n: int) -> list[str]:
    """What `spec run` writes for each prompt, greedy, the target alone (its chat template around the prompt)."""
    with load_pair(model) as pair:
        return [finish(pair.generate(p, max_tokens=n, draft_mode="none")).text for p in prompts]


def assert_as_alone(model: Path, got: list[dict], prompts: list[str], n: int) -> None:
    """Each line's tokens are the target alone's for its prompt, up to a float tie (`greedy_agreement`): lines
    verified beside others may round a near-tie otherwise than a pass of one row."""
    with load_pair(model) as pair:
        for line, prompt in zip(got, prompts):
            alone = finish(pair.generate(prompt, max_tokens=n, draft_mode="none"))
            greedy_agreement(pair.target, pair.prompt_tokens(prompt), line["token_ids"], alone.token_ids)


def test_plain_prompts_give_the_target_alones_texts_in_order(chat_target_path: Path, other_draft_path: Path,
                                                            tmp_path: Path) -> None:
    source = tmp_path / "prompts.txt"
    source.write_text("\n".join([PROMPTS[0], "", *PROMPTS[1:]]) + "\n")
    status, out, err = batch(str(source), "-t", str(chat_target_path), "-d", str(other_draft_path), "-n", "12",
                             "--parallel", "3", "--token-ids")
    assert status == 0, err
    got = lines(out)
    assert [line["id"] for line in got] == [1, 3, 4, 5]  # line numbers; the blank line is no prompt
    assert_as_alone(chat_target_path, got, PROMPTS, 12)
    assert all(line["finish_reason"] in ("stop", "length") and line["stats"]["generated_tokens"] == len(line["token_ids"])
               for line in got)
    assert sum(line["stats"]["drafted"] for line in got) > 0
    assert "4 lines · none failed" in err


def test_bad_lines_become_error_lines_and_the_status_counts_them(chat_target_path: Path, tmp_path: Path) -> None:
    long_prompt = "word " * 600
    requests = [
        {"id": "ok", "prompt": PROMPTS[0], "max_tokens": 5},
        "{not json",
        {"id": "extra", "prompt": "hi", "colour": "blue"},
        {"id": "schema", "prompt": "hi", "json_schema": {"type": "string", "pattern": "(?=a)"}},
        {"id": "long", "prompt": long_prompt},
        {"id": "chat", "system": "be brief", "messages": [{"role": "user", "content": PROMPTS[1]}], "max_tokens": 5,
         "stop": ["zzz"]},
    ]
    source = tmp_path / "requests.jsonl"
    source.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in requests) + "\n")
    status, out, err = batch(str(source), "-t", str(chat_target_path), "--ctx", "256", "-o", str(tmp_path / "o.jsonl"))
    assert status == 4, err
    got = lines((tmp_path / "o.jsonl").read_text())
    assert [line["id"] for line in got] == ["ok", 2, "extra", "schema", "long", "chat"]
    errors = {line["id"]: line["error"] for line in got if "error" in line}
    assert errors[2] == "line 2 is not valid JSON"
    assert errors["extra"].startswith("line 3: unknown field 'colour'")
    assert errors["schema"].startswith("line 4: 'json_schema' cannot be used") and "look-around" in errors["schema"]
    assert errors["long"].startswith("line 5: the prompt is ") and "context holds 256" in errors["long"]
    assert got[0]["text"] and got[5]["text"] and "4 failed" in err


def test_an_id_used_twice_stops_the_batch_before_it_starts(chat_target_path: Path, tmp_path: Path) -> None:
    source = tmp_path / "requests.jsonl"
    source.write_text('{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": "y"}\n{"id": "a", "prompt": "z"}\n')
    output = tmp_path / "out.jsonl"
    status, _out, err = batch(str(source), "-t", str(chat_target_path), "-o", str(output))
    assert status == 2 and err.strip() == 'spec: error: line 3 repeats the id "a" of line 1: ids must be unique'
    assert not output.exists()


def test_unreadable_input_and_unwritable_output_are_one_line(chat_target_path: Path, tmp_path: Path) -> None:
    status, _out, err = batch(str(tmp_path / "missing.txt"), "-t", str(chat_target_path))
    assert status == 2 and err.strip() == f"spec: error: cannot read {tmp_path / 'missing.txt'}: No such file or directory"
    source = tmp_path / "p.txt"
    source.write_text("hello\n")
    status, _out, err = batch(str(source), "-t", str(chat_target_path), "-o", str(tmp_path))
    assert status == 2 and err.startswith("spec: error: cannot ") and len(err.strip().splitlines()) == 1


def test_a_resumed_batch_redoes_a_half_written_line_and_skips_the_rest(chat_target_path: Path, tmp_path: Path) -> None:
    source = tmp_path / "prompts.txt"
    source.write_text("\n".join(PROMPTS) + "\n")
    whole = tmp_path / "whole.jsonl"
    assert batch(str(source), "-t", str(chat_target_path), "-n", "8", "-o", str(whole), "--parallel", "1")[0] == 0
    written = whole.read_text().splitlines(keepends=True)
    resumed = tmp_path / "resumed.jsonl"
    resumed.write_text(written[0] + written[2] + written[1][:10])  # two whole lines, one cut halfway
    status, _out, err = batch(str(source), "-t", str(chat_target_path), "-n", "8", "-o", str(resumed), "--parallel", "1")
    assert status == 0 and "(2 done before)" in err
    texts = {line["id"]: line["text"] for line in lines(resumed.read_text())}
    assert len(lines(resumed.read_text())) == 4 and texts == {line["id"]: line["text"] for line in lines(whole.read_text())}
    status, _out, err = batch(str(source), "-t", str(chat_target_path), "-o", str(resumed))
    assert status == 0 and "all 4 lines are in" in err


def test_another_batchs_output_is_not_appended_to(chat_target_path: Path, tmp_path: Path) -> None:
    source = tmp_path / "prompts.txt"
    source.write_text("hello\n")
    output = tmp_path / "out.jsonl"
    output.write_text('{"id": "from-elsewhere", "text": "x"}\n')
    status, _out, err = batch(str(source), "-t", str(chat_target_path), "-o", str(output))
    assert status == 2 and "holds ids that are not in the input" in err
    assert output.read_text() == '{"id": "from-elsewhere", "text": "x"}\n'


def test_openai_batch_lines_are_answered_as_the_batch_api_does(chat_target_path: Path, tmp_path: Path) -> None:
    requests = [
        {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "m", "messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 6}},
        {"custom_id": "r2", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}},
        {"custom_id": "r3", "method": "POST", "url": "/v1/completions", "body": {"prompt": PROMPTS[1], "max_tokens": 4}},
    ]
    source = tmp_path / "batch.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in requests))
    status, out, _err = batch(str(source), "-t", str(chat_target_path), "--unordered")
    assert status == 1
    got = {line["custom_id"]: line for line in lines(out)}
    assert set(got) == {"r1", "r2", "r3"} and all(line["id"].startswith("batch_req_") for line in got.values())
    chat = got["r1"]["response"]
    assert chat["status_code"] == 200 and chat["body"]["object"] == "chat.completion"
    assert chat["body"]["choices"][0]["message"]["content"] == alone_texts(chat_target_path, PROMPTS[:1], 6)[0]
    assert got["r2"]["response"]["status_code"] == 400
    assert "'url' must be one of" in got["r2"]["response"]["body"]["error"]["message"]
    assert got["r3"]["response"]["body"]["object"] == "text_completion"


def test_a_batch_killed_midway_and_run_again_has_every_id_once(chat_target_path: Path, tmp_path: Path) -> None:
    """SIGKILL while lines are being written; the second run ends with every id exactly once, the same texts."""
    prompts = [f"{PROMPTS[i % 4]} {i}" for i in range(12)]
    source = tmp_path / "prompts.txt"
    source.write_text("\n".join(prompts) + "\n")
    output = tmp_path / "out.jsonl"
    command = [sys.executable, "-m", "spec_cli", "batch", str(source), "-t", str(chat_target_path), "-n", "24",
               "--parallel", "2", "-o", str(output), "-q", "--no-draft", "--token-ids"]
    process = children.popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not output.exists() or output.read_text().count("\n") < 2):
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(10)
    first = output.read_text().count("\n")
    assert 2 <= first < 12
    assert subprocess.run(command, timeout=120).returncode == 0
    got = lines(output.read_text())
    assert sorted(line["id"] for line in got) == list(range(1, 13))
    assert_as_alone(chat_target_path, sorted(got, key=lambda line: line["id"]), prompts, 24)


def test_several_slots_hold_what_the_longest_task_needs_and_a_batch_of_images_the_whole_context(
        chat_target_path: Path, tmp_path: Path) -> None:
    lines_in = [json.dumps({"prompt": PROMPTS[0]}), json.dumps({"prompt": PROMPTS[2], "max_tokens": 40}), "not json"]
    _form, tasks = read_tasks("\n".join(lines_in), raw=True)
    with load_pair(chat_target_path, n_ctx=1024) as pair:
        needed = max(len(pair.prompt_tokens(PROMPTS[0], raw=True)) + 12,
                     len(pair.prompt_tokens(PROMPTS[2], raw=True)) + 40) + AUTO_K_MAX + 1
        sized = BatchRunner(pair, 2, GenerationRequest(max_tokens=12), "text", "m", tasks)
        assert [slot.target.n_ctx for slot in sized._slots] == [needed, needed]
        pictured = read_tasks(lines_in[0] + "\n" + json.dumps({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is it"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]}), raw=True)[1]
        whole = BatchRunner(pair, 2, GenerationRequest(max_tokens=12), "text", "m", pictured)
        assert [slot.target.n_ctx for slot in whole._slots] == [1024, 1024]
        huge = read_tasks(json.dumps({"prompt": PROMPTS[0], "max_tokens": 5000}), raw=True)[1]
        capped = BatchRunner(pair, 2, GenerationRequest(max_tokens=12), "text", "m", huge)
        assert [slot.target.n_ctx for slot in capped._slots] == [1024, 1024]


def test_spec_batch_sizes_its_pair_to_its_longest_line_and_a_batch_of_images_keeps_the_whole_context(
        target_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pair's own contexts (`--parallel 1`'s, and those the pair makes besides its slots') hold the longest
    line's prompt, as the batch tokenizes it (verbatim: the tiny model has no chat template), and its max_tokens; a
    line with an image leaves the whole context, as does a --ctx given."""
    contexts: list[int] = []
    load = options.load_pair

    def loading(*args: object, **kwargs: object) -> pairs.Pair:
        pair = load(*args, **kwargs)  # type: ignore[arg-type]
        contexts.append(pair.n_ctx)
        return pair

    monkeypatch.setattr(options, "load_pair", loading)
    plain = tmp_path / "plain.txt"
    plain.write_text(f"{PROMPTS[0]}\n{PROMPTS[2]}\n")
    pictured = tmp_path / "pictured.jsonl"
    image = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is it"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]}
    pictured.write_text(json.dumps({"prompt": PROMPTS[0]}) + "\n" + json.dumps(image) + "\n")
    for args in ([str(plain), "--parallel", "1"], [str(plain), "--parallel", "2", "--ctx", "300"],
                 [str(pictured), "--parallel", "2"]):
        code, _out, err = batch("--target", str(target_path), "--no-draft", "-n", "5", "-q", *args)
        assert code in (0, 1), err  # the image line fails: the tiny model reads no images
    with load_pair(target_path) as pair:
        longest = max(len(pairs.text_tokens(pair.target, prompt, raw=True)) for prompt in (PROMPTS[0], PROMPTS[2]))
    assert contexts == [longest + 5 + AUTO_K_MAX + 1, 300, N_CTX_TRAIN]
