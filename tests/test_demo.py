"""End to end on the real offline demo pair (SmolLM2-135M Q4_1 drafting for its F32 re-encoding)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from spec_cli.cli import app

pytestmark = pytest.mark.demo


def test_demo_pair_greedy_speculative_text_equals_target_alone() -> None:
    runner = CliRunner()
    prompt = "Name three uses of a paperclip."
    fast = runner.invoke(app, ["run", "-n", "48", "--json", prompt])
    assert fast.exit_code == 0, fast.output
    assert "(first use only)" in fast.stderr
    plain = runner.invoke(app, ["run", "-n", "48", "--json", "--no-draft", prompt])
    assert plain.exit_code == 0, plain.output
    assert "(first use only)" not in plain.stderr  # the derived target is reused
    fast_data, plain_data = json.loads(fast.stdout), json.loads(plain.stdout)
    assert fast_data["text"] == plain_data["text"] and fast_data["text"].strip()
    assert fast_data["token_ids"] == plain_data["token_ids"]
    assert fast_data["stats"]["acceptance_rate"] > 0.5
