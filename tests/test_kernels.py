"""Which of llama.cpp's CPU kernels run here: the probe in child processes, its verdict and cache, and what each
verdict makes of a pair."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spec_cli import SpecError, load_pair
from spec_cli.cli.app import app
from spec_cli.llama import kernels


@pytest.mark.parametrize("steps, expected", [
    ({"single": "ok", "batch": "ok", "draft": "ok"}, "on"),
    ({"single": "ok", "batch": "killed by SIGILL", "draft": "ok"}, "draft"),
    ({"single": "ok", "batch": "killed by SIGSEGV", "draft": "killed by SIGSEGV"}, "off"),
    ({"single": "killed by SIGILL", "batch": "ok", "draft": "ok"}, "off"),
])
def test_the_verdict_keeps_whatever_runs(steps: dict[str, str], expected: str) -> None:
    assert kernels.decide(steps) == expected


def test_the_session_probe_ran_every_step_and_is_cached_for_this_machine() -> None:
    data = json.loads(kernels.cache_path().read_text())
    assert set(data["steps"]) == set(kernels.STEPS) and data["key"] == kernels.machine_key()
    assert data["verdict"] == kernels.decide(data["steps"])
    assert kernels.known() and kernels.verdict().source == "probe"


def fake_python(tmp_path: Path, crashing_step: str, signal_name: str) -> Path:
    """A stand-in for the interpreter the probe starts: it dies of `signal_name` on `crashing_step` (as
    llama.cpp's kernels do on some CPUs) and runs every other step for real."""
    script = tmp_path / "python"
    script.write_text(f'#!/bin/sh\nif [ "$3" = "{crashing_step}" ]; then kill -{signal_name} $$; fi\n'
                      f'exec {sys.executable} "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_a_probe_whose_batches_crash_keeps_the_kernels_for_the_draft(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels.sys, "executable", str(fake_python(tmp_path, "batch", "ILL")))
    found = kernels.verdict(probe_again=True)
    assert found.name == "draft" and found.source == "probe"
    assert found.steps == {"single": "ok", "batch": "killed by SIGILL", "draft": "ok"}
    assert json.loads(kernels.cache_path().read_text())["verdict"] == "draft"
    assert found.extra_buffers(drafts=True) and not found.extra_buffers(drafts=False)
    monkeypatch.setattr(kernels.sys, "executable", "/nonexistent")  # cached now: no child is started
    assert kernels.verdict() == found


def test_a_probe_that_crashes_on_one_token_turns_them_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels.sys, "executable", str(fake_python(tmp_path, "single", "SEGV")))
    assert kernels.verdict(probe_again=True).name == "off"


@pytest.mark.parametrize("value", ["on", "draft", "off"])
def test_the_environment_decides_by_hand(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kernels.ENV, value)
    assert kernels.verdict() == kernels.Verdict(value, kernels.ENV)


def test_a_wrong_environment_value_is_one_line(monkeypatch: pytest.MonkeyPatch, target_path: Path) -> None:
    monkeypatch.setenv(kernels.ENV, "maybe")
    with pytest.raises(SpecError, match="SPEC_EXTRA_BUFFERS must be one of: auto, on, draft, off"):
        kernels.verdict()
    result = CliRunner().invoke(app, ["run", "--target", str(target_path), "--no-draft", "hi"])
    assert result.exit_code == 1 and "SPEC_EXTRA_BUFFERS must be one of" in result.stderr


def test_under_the_draft_verdict_only_the_draft_uses_them_one_token_at_a_time(
        monkeypatch: pytest.MonkeyPatch, target_path: Path, other_draft_path: Path) -> None:
    monkeypatch.setenv(kernels.ENV, "draft")
    with load_pair(target_path) as alone:
        reference = alone.generate("the cat", raw=True, max_tokens=24, draft_mode="none")
        for _ in reference:
            pass
    with load_pair(target_path, other_draft_path) as pair:
        assert not pair.target.extra_buffers and not pair.target.one_token_batches
        assert pair.draft is not None and pair.draft.extra_buffers and pair.draft.one_token_batches
        assert pair.draft_context is not None and pair.draft_context.n_ubatch == 1
        assert pair.target_context.n_ubatch == pair.target_context.n_batch
        generation = pair.generate("the cat", raw=True, max_tokens=24, draft_max=3, draft_mode="model")
        for _ in generation:
            pass
    assert generation.token_ids == reference.token_ids and generation.stats.drafted > 0


def test_doctor_reports_the_kernels_and_probes_again_when_asked(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["doctor"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "CPU kernels" in result.stdout and "spec doctor --probe" in result.stdout
    monkeypatch.setattr(kernels.sys, "executable", str(fake_python(tmp_path, "batch", "ILL")))
    again = CliRunner().invoke(app, ["doctor", "--probe"], env={"COLUMNS": "300"})
    assert again.exit_code == 0, again.output
    assert "for the draft model only" in again.stdout and "batch: killed by SIGILL" in again.stdout
    by_hand = CliRunner().invoke(app, ["doctor"], env={"COLUMNS": "300", kernels.ENV: "off"})
    assert "off: plain kernels (set by SPEC_EXTRA_BUFFERS)" in by_hand.stdout


def test_the_first_run_says_it_is_probing(target_path: Path) -> None:
    kernels.cache_path().unlink()
    result = CliRunner().invoke(app, ["run", "--target", str(target_path), "--no-draft", "-n", "2", "hi"])
    assert result.exit_code == 0, result.output
    assert "trying which of llama.cpp's CPU kernels this machine runs (once" in result.stderr
    assert kernels.known()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2, reason="one CPU, or no affinity")
def test_the_default_threads_are_the_cpus_the_process_may_run_on(target_path: Path) -> None:
    """Under `taskset` or a container's cpuset, a pair loads with as many threads as CPUs it may run on, not every
    CPU of the machine (threads past them wait their turn, and llama.cpp's spin while they wait)."""
    allowed = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(allowed)})
        assert kernels.cpu_threads() == 1
        with load_pair(target_path) as pair:
            assert pair.n_threads == 1
    finally:
        os.sched_setaffinity(0, allowed)
