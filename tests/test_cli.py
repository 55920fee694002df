"""`spec run` and `spec bench` as a user meets them: output formats, stdin, errors, Ctrl-C, pipes."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
from support import children
from support.tiny_models import write_model
from typer.testing import CliRunner

from spec_cli import SpecError
from spec_cli.cli.app import app
from spec_cli.drafting import cost_book

runner = CliRunner()


def spec(*args: str, input: str | None = None, env: dict[str, str] | None = None):
    return runner.invoke(app, list(args), input=input, env=env)


@pytest.fixture()
def pair_args(target_path: Path, other_draft_path: Path) -> list[str]:
    return ["--target", str(target_path), "--draft", str(other_draft_path), "--raw"]


def test_json_has_every_field_and_consistent_arithmetic(pair_args: list[str]) -> None:
    result = spec("run", *pair_args, "-n", "24", "-k", "3", "--json", "the cat")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data) >= {"text", "token_ids", "finish_reason", "stats"}
    s = data["stats"]
    assert set(s) >= {"prompt_tokens", "generated_tokens", "rounds", "drafted", "accepted", "acceptance_rate",
                      "mean_accepted_length", "tokens_per_second", "elapsed_s", "draft_max"}
    assert data["finish_reason"] == "length"
    assert s["generated_tokens"] == len(data["token_ids"]) == 24
    assert s["draft_max"] == 3
    assert s["acceptance_rate"] == pytest.approx(s["accepted"] / s["drafted"])
    assert s["mean_accepted_length"] == pytest.approx(1 + s["accepted"] / s["rounds"])
    assert s["tokens_per_second"] == pytest.approx(s["generated_tokens"] / s["decode_s"])
    assert s["elapsed_s"] == pytest.approx(s["prompt_s"] + s["decode_s"])
    assert s["accepted"] + s["rounds"] == s["generated_tokens"]
    assert 1 <= s["threads"]["last"] <= s["threads"]["most"]  # the generated models' contexts: one thread


def test_speculative_and_no_draft_give_the_same_greedy_tokens(pair_args: list[str]) -> None:
    fast = json.loads(spec("run", *pair_args, "-n", "32", "--json", "the dog").stdout)
    plain = json.loads(spec("run", *pair_args, "-n", "32", "--json", "--no-draft", "the dog").stdout)
    assert fast["token_ids"] == plain["token_ids"]
    assert plain["stats"]["drafted"] == 0 and plain["stats"]["draft_max"] == 0


def test_piped_output_is_text_only_with_summary_on_stderr(pair_args: list[str]) -> None:
    result = spec("run", *pair_args, "-n", "16", "the cat")
    assert result.exit_code == 0
    assert "\x1b" not in result.stdout
    data = json.loads(spec("run", *pair_args, "-n", "16", "--json", "the cat").stdout)
    assert result.stdout == data["text"] + "\n"
    assert "16 tokens" in result.stderr and "finish: length" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_quiet_prints_no_summary(pair_args: list[str]) -> None:
    result = spec("run", *pair_args, "-n", "8", "--quiet", "the cat")
    assert result.exit_code == 0 and result.stderr == ""


@pytest.mark.parametrize("argument", [["-"], []])
def test_prompt_from_stdin(pair_args: list[str], argument: list[str]) -> None:
    from_stdin = spec("run", *pair_args, "-n", "8", "--json", *argument, input="the cat")
    from_arg = spec("run", *pair_args, "-n", "8", "--json", "the cat")
    assert json.loads(from_stdin.stdout)["token_ids"] == json.loads(from_arg.stdout)["token_ids"]


def test_chat_template_wraps_the_prompt_unless_raw(chat_target_path: Path) -> None:
    base = ["--target", str(chat_target_path), "--no-draft", "-n", "4", "--json"]
    wrapped = json.loads(spec("run", *base, "hi").stdout)["stats"]["prompt_tokens"]
    raw = json.loads(spec("run", *base, "--raw", "hi").stdout)["stats"]["prompt_tokens"]
    assert wrapped > raw


def test_model_without_template_falls_back_to_raw_with_a_note(target_path: Path) -> None:
    result = spec("run", "--target", str(target_path), "--no-draft", "-n", "4", "hi")
    assert result.exit_code == 0
    assert "no chat template; sending the prompt as raw text" in result.stderr


def user_error(result, message: str) -> None:
    assert result.exit_code == 1, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1


def test_missing_model_file(tmp_path: Path, target_path: Path) -> None:
    result = spec("run", "--target", str(target_path), "--draft", str(tmp_path / "nope.gguf"), "hi")
    user_error(result, f"model file not found: {tmp_path / 'nope.gguf'}")


def test_not_a_gguf_file(tmp_path: Path, target_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    user_error(spec("run", "--target", str(text), "--draft", str(target_path), "hi"), "not a GGUF file")


def test_a_pair_whose_token_texts_differ_drafts_through_text(tmp_path: Path, target_path: Path) -> None:
    from support.tiny_models import write_model

    renamed = write_model(tmp_path / "renamed.gguf", seed=3, rename_token=300)
    result = spec("run", "--target", str(target_path), "--draft", str(renamed), "-n", "8", "hi")
    assert result.exit_code == 0, result.output
    assert "different vocabularies: drafting goes through text (exact)" in result.stderr


def test_empty_prompt(pair_args: list[str]) -> None:
    user_error(spec("run", *pair_args, "   "), "the prompt is empty")


def test_prompt_longer_than_context(pair_args: list[str]) -> None:
    user_error(spec("run", *pair_args, "--ctx", "16", "the cat and the dog " * 10),
               "but the context holds 16; shorten it or raise --ctx")


@pytest.mark.parametrize("args, message", [
    (["--draft", "d.gguf"], "--draft needs --target"),
    (["--target", "t.gguf"], "model file not found: t.gguf"),
    (["--pair", "nope"], "unknown pair 'nope'"),
])
def test_model_choice_mistakes(args: list[str], message: str) -> None:
    user_error(spec("run", *args, "hi"), message)


def test_a_target_alone_drafts_with_what_it_has_and_a_draft_mode_that_needs_a_file_says_so(target_path: Path) -> None:
    alone = spec("run", "--target", str(target_path), "--raw", "-n", "8", "--json", "hi")
    assert alone.exit_code == 0, alone.output
    stats = json.loads(alone.stdout)["stats"]
    assert stats["draft_mode"] == "hybrid" and set(stats["ways"]) <= {"ngram", "none"}
    user_error(spec("run", "--target", str(target_path), "--draft-mode", "model", "hi"),
               "--target needs a --draft for this draft mode (or leave --draft-mode out: the default drafts with "
               "what the target has, n-gram lookup at least)")


@pytest.mark.parametrize("args, message", [
    (["--sampling", "warm"], "unknown --sampling 'warm'; choose one of: greedy, model"),
    (["--verify", "joint"], "unknown --verify 'joint'; choose one of: block, token, gumbel"),
    (["--repeat-penalty", "0"], "repeat-penalty must be > 0 (1 turns it off), got 0.0"),
    (["--top-p", "0"], "top-p must be in (0, 1], got 0.0"),
])
def test_sampling_mistakes(pair_args: list[str], args: list[str], message: str) -> None:
    user_error(spec("run", *pair_args, *args, "hi"), message)


@pytest.mark.parametrize("args, message", [
    (["--grammar", 'root ::= "a'], "--grammar does not parse: Unexpected end of input"),
    (["--json-schema", "{"], "--json-schema is not valid JSON: Expecting property name enclosed in double quotes"),
    (["-j", '{"type": "strng"}'], "--json-schema cannot be used: Invalid type: strng"),
    (["-j", '{"type": "array", "uniqueItems": true}'], "--json-schema uses uniqueItems at /, which cannot be enforced"),
    (["--grammar", 'root ::= "a"', "-j", "{}"], "--json-schema cannot be given with another constraint: give one"),
    (["--json-schema-file", "/nonexistent/s.json"], "--json-schema-file: file not found: /nonexistent/s.json"),
])
def test_a_constraint_that_cannot_be_used_is_a_usage_error(pair_args: list[str], args: list[str],
                                                           message: str) -> None:
    result = spec("run", *pair_args, *args, "hi")
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_json_schema_output_validates_and_equals_the_target_alone(pair_args: list[str], tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"animal": {"enum": ["cat", "dog"]}, "pet": {"type": "boolean"}},
              "required": ["animal", "pet"], "additionalProperties": False}
    (tmp_path / "animal.json").write_text(json.dumps(schema), encoding="utf-8")
    args = ["-n", "40", "--json", "--json-schema-file", str(tmp_path / "animal.json"), "the cat"]
    fast, plain = spec("run", *pair_args, "-k", "3", *args), spec("run", *pair_args, "--no-draft", *args)
    assert fast.exit_code == 0, fast.output
    fast_data, plain_data = json.loads(fast.stdout), json.loads(plain.stdout)
    assert fast_data["token_ids"] == plain_data["token_ids"]
    assert fast_data["finish_reason"] == "stop"
    jsonschema.validate(json.loads(fast_data["text"]), schema)
    assert fast_data["stats"]["drafted"] > 0


def sampling_used(*args: str) -> dict:
    result = spec("run", *args, "-n", "4", "--json", "the cat")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["sampling"]


def test_run_is_greedy_unless_asked_and_flags_win_over_the_models_settings(tmp_path: Path) -> None:
    model = write_model(tmp_path / "recommends.gguf", seed=1,
                        sampling={"temp": 0.6, "top_k": 20, "top_p": 0.9, "penalty_repeat": 1.1})
    args = ["--target", str(model), "--draft", str(model), "--raw"]
    greedy = sampling_used(*args)
    assert (greedy["temperature"], greedy["top_k"], greedy["verify"]) == (0.0, 40, "block")
    recommended = sampling_used(*args, "--sampling", "model")
    assert (recommended["temperature"], recommended["top_k"], recommended["top_p"], recommended["min_p"],
            recommended["repeat_penalty"]) == (pytest.approx(0.6), 20, pytest.approx(0.9), 0.05, pytest.approx(1.1))
    mixed = sampling_used(*args, "--sampling", "model", "--top-k", "7", "--temp", "1", "--verify", "token")
    assert (mixed["temperature"], mixed["top_k"], mixed["top_p"], mixed["verify"]) == \
        (1.0, 7, pytest.approx(0.9), "token")


def test_a_model_without_recommendations_samples_with_llama_cpps_defaults(pair_args: list[str]) -> None:
    used = sampling_used(*pair_args, "--sampling", "model")
    assert (used["temperature"], used["top_k"], used["top_p"], used["min_p"], used["repeat_penalty"]) == \
        (0.8, 40, 0.95, 0.05, 1.0)


@pytest.mark.parametrize("command", ["run", "chat"])
def test_help_states_llama_cpps_sampler_order(command: str) -> None:
    result = spec(command, "--help")
    assert "penalties → top-k → top-p → min-p → temperature" in " ".join(result.stdout.split())


def test_help_shows_examples() -> None:
    result = spec("run", "--help")
    assert result.exit_code == 0
    assert "Examples" in result.stdout and "spec run --temp 0.7" in result.stdout


def test_help_lists_commands_in_the_order_a_user_meets_them() -> None:
    lines = spec("--help", env={"COLUMNS": "120"}).stdout.splitlines()
    listed = [line.split()[1] for line in lines if line.startswith("│ ") and line[2].isalpha()]  # not wrapped text
    assert listed == ["run", "chat", "batch", "serve", "bench", "models", "doctor", "worker"]


@pytest.mark.parametrize("command", [[], ["run"], ["chat"], ["serve"], ["bench"], ["models", "list"], ["doctor"],
                                     ["worker"]])
def test_flags_show_no_type(command: list[str]) -> None:
    """A flag takes no value: its help line names none (Typer would print <bool>)."""
    result = spec(*command, "--help")
    assert result.exit_code == 0 and "--help" in result.stdout and "<bool>" not in result.stdout


def test_bench_prints_every_configuration_against_the_target_alone(target_path: Path) -> None:
    result = spec("bench", "--target", str(target_path), "--draft", str(target_path), "-n", "16",
                  "-k", "3,auto", "--modes", "model,ngram")
    assert result.exit_code == 0, result.output
    for label in ("target alone", "model K=3", "model K=auto", "ngram K=3", "ngram K=auto"):
        assert label in result.stdout
    assert "1.00×" in result.stdout  # the target alone against itself


@pytest.mark.parametrize("args, message", [
    (["--modes", "model,fast"], "unknown draft mode 'fast'"),
    (["-k", "3,lots"], "--draft-max must be a number from 0 to 64 or 'auto', got 'lots'"),
    (["--task", "poetry"], "unknown task 'poetry'"),
])
def test_bench_option_mistakes(target_path: Path, args: list[str], message: str) -> None:
    user_error(spec("bench", "--target", str(target_path), "--draft", str(target_path), *args), message)


def test_ngram_mode_runs_with_a_target_alone(target_path: Path) -> None:
    result = spec("run", "--target", str(target_path), "--draft-mode", "ngram", "--raw", "-n", "40", "--json",
                  "the cat")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["stats"]["drafted"] > 0


def test_auto_k_in_json(pair_args: list[str]) -> None:
    data = json.loads(spec("run", *pair_args, "-n", "20", "--draft-mode", "model", "--json", "the cat").stdout)
    assert data["stats"]["adaptive_k"] is True and data["stats"]["current_k"] >= 1  # files given: auto
    fixed = json.loads(spec("run", *pair_args, "-k", "3", "-n", "20", "--json", "the cat").stdout)
    assert fixed["stats"]["adaptive_k"] is False and fixed["stats"]["draft_max"] == 3


def long_run(target_path: Path) -> list[str]:
    return [sys.executable, "-m", "spec_cli", "run", "--target", str(target_path), "--draft", str(target_path),
            "--raw", "--ctx", "60000", "-n", "59000", "the cat"]


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_ctrl_c_or_sigterm_keeps_text_and_prints_statistics(target_path: Path, stop: signal.Signals) -> None:
    """Stopped by Ctrl-C, by SIGTERM (`timeout 60 spec run …`, `kill`) or by a hang-up: the text so far stays, the
    statistics are printed, and the cost book is kept as the pair closes (at SIGTERM or SIGHUP the process died where
    it stood)."""
    process = children.popen(long_run(target_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    os.set_blocking(process.stdout.fileno(), False)
    deadline, first = time.monotonic() + 60, b""
    while not first and time.monotonic() < deadline:
        first = process.stdout.read() or b""
        time.sleep(0.1)
    time.sleep(0.5)
    process.send_signal(stop)
    os.set_blocking(process.stdout.fileno(), True)
    rest, err = process.communicate(timeout=60)
    assert process.returncode == 130
    assert first and b"Traceback" not in err
    assert b"finish: interrupted" in err
    assert cost_book.read_all()


def test_closed_pipe_exits_quietly(target_path: Path, tmp_path: Path) -> None:
    command = shlex.join(long_run(target_path)) + f" 2>{tmp_path}/err | head -c 20 > {tmp_path}/out"
    completed = subprocess.run(["bash", "-c", command + "; echo ${PIPESTATUS[0]}"], capture_output=True,
                               text=True, timeout=120)
    assert completed.stdout.strip() == "0"
    assert len((tmp_path / "out").read_bytes()) == 20
    said = (tmp_path / "err").read_text().splitlines()  # the tiny model's context of 60000 is past its 512: said
    assert [line for line in said if "is past the 512 target.gguf was trained on" not in line] == []


@pytest.fixture(scope="module")
def recurrent_pair(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The crash that started it: a recurrent target with a draft that is partly rejected."""
    folder = tmp_path_factory.mktemp("mamba")
    target = write_model(folder / "mamba.gguf", 1, arch="mamba")
    draft = write_model(folder / "mamba-noisy.gguf", 1, arch="mamba", noise=0.1)
    return ["--target", str(target), "--draft", str(draft), "--raw"]


def test_recurrent_pair_gives_the_target_alone_text(recurrent_pair: list[str]) -> None:
    fast = spec("run", *recurrent_pair, "-k", "4", "-n", "40", "--json", "the cat sat on the mat")
    assert fast.exit_code == 0, fast.output
    plain = spec("run", *recurrent_pair, "--no-draft", "-n", "40", "--json", "the cat sat on the mat")
    fast_data, plain_data = json.loads(fast.stdout), json.loads(plain.stdout)
    assert fast_data["token_ids"] == plain_data["token_ids"]
    stats = fast_data["stats"]
    assert stats["rejected_rounds"] > 0 and stats["accepted"] > 0
    assert stats["memory"]["target"] == {"kind": "recurrent", "rollback": "snapshot + replay"}
    assert stats["memory"]["draft"]["kind"] == "recurrent"
    assert 0 < stats["rollback_s"] <= stats["llama_s"]
    assert set(plain_data["stats"]["memory"]) == {"target"}  # the draft model is not in use


def test_llama_cpp_refusing_mid_generation_is_one_line_and_keeps_the_text(
        pair_args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from spec_cli.llama.context import Context

    decode, calls = Context._decode, []

    def failing(self: Context, tokens: list[int], n_logits: int):
        calls.append(tokens)
        if len(calls) == 12:
            raise SpecError(f"llama.cpp could not decode with {self.model.path.name}: no room in the memory")
        return decode(self, tokens, n_logits)

    monkeypatch.setattr(Context, "_decode", failing)
    result = spec("run", *pair_args, "-k", "2", "-n", "40", "--draft-mode", "model", "the cat")
    assert result.exit_code == 1
    assert result.stdout.strip()  # the text generated before the failure stays
    assert result.stderr.strip().splitlines()[-1].endswith("could not decode with other.gguf: no room in the memory")
    assert "Traceback" not in result.output


@pytest.mark.parametrize("how", ["stdin", "argument"])
def test_invalid_utf8_prompt_is_replaced_with_a_note(pair_args: list[str], how: str) -> None:
    if how == "stdin":
        result = runner.invoke(app, ["run", *pair_args, "-n", "4", "--json", "-"], input=b"Say \xff\xfe hi")
    else:
        result = spec("run", *pair_args, "-n", "4", "--json", "Say \udcff\udcfe hi")  # how argv carries such bytes
    assert result.exit_code == 0, result.output
    assert "not valid UTF-8" in result.stderr and "Traceback" not in result.output
    replaced = spec("run", *pair_args, "-n", "4", "--json", "Say \ufffd\ufffd hi")
    assert json.loads(result.stdout)["token_ids"] == json.loads(replaced.stdout)["token_ids"]
