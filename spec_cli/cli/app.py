"""The `spec` command line: the Typer app, its commands in the order a user meets them, and `main`.

Each command lives in a module of its own and only parses, builds a request, calls the library and hands what
comes back to `terminal`; library errors (`SpecError`) become one line on stderr and exit status 1, in one
place (`common.user_errors`).
"""

from __future__ import annotations

from typing import Annotated

import typer

from spec_cli import __version__
from spec_cli.cli.batch import BATCH_EXAMPLES, batch
from spec_cli.cli.bench import BENCH_EXAMPLES, bench
from spec_cli.cli.chat import CHAT_EXAMPLES, chat
from spec_cli.cli.common import silence_stdout
from spec_cli.cli.help import CommandGroup
from spec_cli.cli.machine import DOCTOR_EXAMPLES, WORKER_EXAMPLES, doctor, worker
from spec_cli.cli.models import models_app
from spec_cli.cli.run import RUN_EXAMPLES, run
from spec_cli.cli.serve import SERVE_EXAMPLES, serve

app = typer.Typer(
    cls=CommandGroup,
    help="Exact speculative decoding for GGUF models: a small draft model proposes, the target verifies.",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"spec-cli {__version__}")
        raise typer.Exit()


@app.callback()
def spec(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")] = False,
) -> None:
    """Exact speculative decoding for GGUF models: a small draft model proposes, the target verifies."""


# `spec --help` lists them in the order a user meets them (`help.ORDER`).
app.command(epilog=RUN_EXAMPLES)(run)
app.command(epilog=CHAT_EXAMPLES)(chat)
app.command(epilog=BATCH_EXAMPLES)(batch)
app.command(epilog=SERVE_EXAMPLES)(serve)
app.command(epilog=BENCH_EXAMPLES)(bench)
app.add_typer(models_app, name="models")
app.command(epilog=DOCTOR_EXAMPLES)(doctor)
app.command(epilog=WORKER_EXAMPLES)(worker)


def main() -> None:
    try:
        app()
    except BrokenPipeError:
        silence_stdout()
