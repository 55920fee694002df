"""terminal/: the view chosen for where the output goes, each view's output from the loop's events, sizes and
metadata numbers as people read them, and the benchmark's verdict on a greedy run that differs."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from spec_cli.decoding.engine import TokenEvent
from spec_cli.decoding.sampling import SamplingParams
from spec_cli.decoding.stats import Stats
from spec_cli.terminal import output
from spec_cli.terminal.tables import _number, _same_text_line
from spec_cli.terminal.views import JsonView, PlainView, make_view


def generation(text: str) -> SimpleNamespace:
    """What a view reads of a finished generation."""
    stats = Stats(draft_max=4, draft_mode="model", generated_tokens=3, rounds=2, drafted=4, accepted=3,
                  decode_s=0.5)
    return SimpleNamespace(text=text, token_ids=[11, 12, 13], finish_reason="length", seed=42, stats=stats,
                           sampling=SamplingParams(temperature=0.0), verification="block")


def event(text: str, from_draft: bool) -> TokenEvent:
    return TokenEvent(token=1, text=text, from_draft=from_draft)


def test_json_when_asked_plain_text_when_stdout_is_not_a_terminal() -> None:
    assert isinstance(make_view(as_json=True, quiet=False), JsonView)
    assert isinstance(make_view(as_json=False, quiet=False), PlainView)  # pytest captures stdout: not a tty


def test_the_plain_view_writes_the_text_alone_on_stdout_ending_its_line_and_the_summary_on_stderr(capsys) -> None:
    view, done = PlainView(quiet=False), generation("a mat")
    view.start(done)
    for piece, drafted in (("a", True), (" mat", False)):
        view.token(event(piece, drafted))
    view.finish(done)
    out, err = capsys.readouterr()
    assert out == "a mat\n"
    assert err.startswith("spec: 3 tokens") and "acceptance 75% (3/4)" in err and "finish: length" in err


def test_the_plain_view_adds_no_newline_to_a_text_that_ends_one_and_quiet_says_nothing_else(capsys) -> None:
    view, done = PlainView(quiet=True), generation("line\n")
    view.token(event("line\n", False))
    view.finish(done)
    assert capsys.readouterr() == ("line\n", "")


def test_the_json_view_writes_one_object_once_generation_has_ended(capsys) -> None:
    view, done = JsonView(), generation("a mat")
    view.start(done)
    view.token(event("a mat", True))
    assert capsys.readouterr().out == ""
    view.finish(done)
    payload = json.loads(capsys.readouterr().out)
    assert payload["text"] == "a mat" and payload["token_ids"] == [11, 12, 13] and payload["seed"] == 42
    assert payload["sampling"]["verify"] == "block" and payload["sampling"]["temperature"] == 0.0
    assert payload["stats"]["accepted"] == 3 and payload["finish_reason"] == "length"


@pytest.mark.parametrize("n_bytes, shown", [(0, "0 B"), (999, "999 B"), (1000, "1.0 KB"), (1_536_000, "1.5 MB"),
                                            (2_000_000_000_000, "2000.0 GB")])
def test_sizes_are_in_decimal_units_up_to_gigabytes(n_bytes: int, shown: str) -> None:
    assert output.human_size(n_bytes) == shown


def test_notes_and_errors_go_to_stderr_as_one_line_with_markup_left_as_written(capsys) -> None:
    output.note("reading [bold]cat.png[/bold]")
    output.error("no such file")
    output.say("/path/[x]")
    out, err = capsys.readouterr()
    assert err == "spec: reading [bold]cat.png[/bold]\nspec: error: no such file\n"
    assert out == "/path/[x]\n"


@pytest.mark.parametrize("text, shown", [("0.600000", "0.6"), ("40", "40"), ("1e-05", "1e-05"), ("greedy", "greedy")])
def test_metadata_numbers_lose_llama_cpp_s_trailing_zeros(text: str, shown: str) -> None:
    assert _number(text) == shown


def test_a_greedy_run_that_differs_is_called_a_float_tie_or_a_bug_by_the_target_s_margin() -> None:
    config = {"label": "model K=4", "task": "code", "same_as_target_alone": {
        "same": 1, "runs": 3, "differences": [
            {"run": 1, "position": 17, "ours": "a", "alone": "the", "margin": 0.00001, "tie": True}]}}
    line, style = _same_text_line(config)
    assert line.startswith("model K=4 (code): 1/3 runs gave the target alone's text")
    assert "run 2 differs from generated token 17" in line and "a float tie" in line and style == "dim"
    config["same_as_target_alone"]["differences"].append(
        {"run": 2, "position": 3, "ours": "x", "alone": "y", "margin": 1.25, "tie": False})
    line, style = _same_text_line(config)
    assert "1.2500 apart: NOT a float tie: a bug, please report it" in line and style == "bold red"
