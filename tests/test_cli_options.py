"""cli/options.py and cli/common.py: what the flags describe, checked before any model loads; the options shared by
several commands declared once; library errors turned into one line and the right exit status."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Annotated, Optional

import pytest
import typer
from typer.testing import CliRunner

from spec_cli.cli.common import (EXIT_USAGE, EXIT_USER_ERROR, csv_list, reachable_from_outside, stop_signals_raise,
                                 user_errors)
from spec_cli.cli.options import (LoadOptions, MemoryOptions, RequestFlags, Sampling, _pair_spec, largest_k,
                                  with_options)
from spec_cli.errors import BadInput, SpecError
from spec_cli.request import AUTO, InvalidRequest


def test_a_comma_separated_list_skips_blanks_and_refuses_an_empty_one() -> None:
    assert csv_list(" 1, 2,,3 ", int) == [1, 2, 3]
    with pytest.raises(SpecError, match="expected a comma-separated list, got ' , '"):
        csv_list(" , ", int)


@pytest.mark.parametrize("host, allow_remote, outside", [
    ("127.0.0.1", False, False), ("::1", False, False), ("localhost", False, False), ("0.0.0.0", True, True),
    ("192.168.1.5", True, True)])
def test_a_host_other_machines_reach_needs_allow_remote(host: str, allow_remote: bool, outside: bool) -> None:
    assert reachable_from_outside(host, allow_remote, "use this server") is outside


def test_a_remote_host_without_allow_remote_says_what_others_could_do_and_a_name_is_refused() -> None:
    with pytest.raises(SpecError, match="--host 0.0.0.0 lets other machines use this server; add --allow-remote"):
        reachable_from_outside("0.0.0.0", False, "use this server")
    with pytest.raises(SpecError, match="--host must be an IP address"):
        reachable_from_outside("example.org", True, "use this server")
    with pytest.raises(SpecError, match="--host must be an IPv4 address"):
        reachable_from_outside("localhost", False, "run models", ipv4_only=True)


@pytest.mark.parametrize("raised, status, said", [
    (SpecError("no such pair"), EXIT_USER_ERROR, "spec: error: no such pair"),
    (BadInput("--grammar does not parse"), EXIT_USAGE, "spec: error: --grammar does not parse"),
])
def test_library_errors_become_one_line_on_stderr_and_an_exit_status(raised: Exception, status: int, said: str,
                                                                     capsys) -> None:
    with pytest.raises(typer.Exit) as exited, user_errors():
        raise raised
    assert exited.value.exit_code == status
    assert capsys.readouterr().err.strip() == said


def test_a_request_error_names_the_flag_that_set_the_field(capsys) -> None:
    with pytest.raises(typer.Exit) as exited, user_errors():
        RequestFlags.from_flags("65", None)
    assert exited.value.exit_code == EXIT_USER_ERROR
    assert "--draft-max" in capsys.readouterr().err


def test_request_flags_say_what_loads_and_the_largest_fixed_k() -> None:
    default = RequestFlags.from_flags(None, None)
    assert default.loads_draft and not default.requires_draft and default.max_draft == 0
    model = RequestFlags.from_flags("5", "model")
    assert model.requires_draft and model.max_draft == 5 and model.request.draft_max == 5
    ngram = RequestFlags.from_flags("3", "ngram")
    assert not ngram.loads_draft and not ngram.requires_draft
    assert RequestFlags.from_flags(None, "model", no_draft=True).request.draft_mode == "none"
    assert RequestFlags.from_flags("auto", None).request.draft_max == AUTO


def test_an_unknown_draft_mode_is_refused_before_anything_loads() -> None:
    with pytest.raises(InvalidRequest, match="unknown draft mode 'telepathy'; choose one of: model,") as refused:
        RequestFlags.from_flags(None, "telepathy")
    assert refused.value.field == "draft_mode"


def test_largest_k_reads_only_fixed_ks() -> None:
    assert largest_k([3, AUTO, 7]) == 7
    assert largest_k([AUTO]) == 0


def test_sampling_flags_are_checked_with_the_command_s_default_preset() -> None:
    assert Sampling().checked("greedy").preset == "greedy"
    assert Sampling("model", {"top_k": 5}).checked("greedy") == Sampling("model", {"top_k": 5})
    with pytest.raises(SpecError, match="unknown --sampling 'hot'; choose one of: greedy, model"):
        Sampling("hot").checked("greedy")


def test_memory_flags_that_contradict_each_other_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="either --memory FILE or --no-memory"):
        MemoryOptions(tmp_path / "memory.npz", no_memory=True).checked()
    assert MemoryOptions(no_memory=True).checked().no_memory


@pytest.mark.parametrize("options, message", [
    (LoadOptions(draft=Path("d.gguf")), "--draft needs --target"),
    (LoadOptions(target=Path("t.gguf"), pair="demo"), "either --pair or --target/--draft"),
    (LoadOptions(target=Path("t.gguf"), requires_draft=True), "--target needs a --draft for this draft mode"),
])
def test_files_and_pairs_given_together_wrongly_are_refused_before_loading(options: LoadOptions,
                                                                           message: str) -> None:
    with pytest.raises(SpecError, match=message):
        _pair_spec(options)


def test_a_target_alone_with_no_draft_mode_named_needs_no_registry_entry() -> None:
    assert _pair_spec(LoadOptions(target=Path("t.gguf"))) is None
    assert _pair_spec(LoadOptions(target=Path("t.gguf"), requires_draft=True, no_draft=True)) is None


def test_shared_options_are_declared_once_and_gathered_into_one_parameter_in_place() -> None:
    CountOpt = Annotated[Optional[int], typer.Option("--count", help="How many.")]
    NameOpt = Annotated[Optional[str], typer.Option("--name", help="Whose.")]
    gathered = with_options("who", {"count": CountOpt, "name": NameOpt}, lambda count, name: (count, name))
    app = typer.Typer()

    @app.command()
    @gathered
    def greet(first: Annotated[str, typer.Argument()], who: tuple, loud: bool = False) -> None:
        typer.echo(f"{first} {who} {loud}")

    runner = CliRunner()
    result = runner.invoke(app, ["hi", "--count", "2", "--loud"])
    assert result.exit_code == 0 and result.stdout.strip() == "hi (2, None) True"
    help_text = runner.invoke(app, ["--help"]).stdout
    assert help_text.index("--count") < help_text.index("--name") < help_text.index("--loud")


def test_a_stop_signal_raises_and_one_the_process_was_started_ignoring_stays_ignored() -> None:
    """SIGTERM and SIGHUP raise what the command ends on (Ctrl-C's path) while the block runs, and their handlers are
    put back after it; under `nohup` (SIGHUP ignored) a hang-up stays ignored: the server outlives its terminal."""
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stop_signals_raise(lambda signum: SystemExit(128 + signum)):
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)  # ignored
            with pytest.raises(SystemExit) as stopped:
                os.kill(os.getpid(), signal.SIGTERM)
        assert stopped.value.code == 128 + signal.SIGTERM
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        with pytest.raises(KeyboardInterrupt), stop_signals_raise():
            os.kill(os.getpid(), signal.SIGHUP)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGHUP, before)
