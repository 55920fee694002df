"""What every `spec` command module shares: exit statuses, turning library errors into one line (naming
request fields by their flags), lists given as comma-separated text, the check of a --host, and resolving a
pair's files with progress bars."""

from __future__ import annotations

import ipaddress
import os
import signal
import sys
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Annotated, Callable, Iterator, Optional, TypeVar

import typer

from spec_cli.errors import BadInput, SpecError
from spec_cli.models import registry
from spec_cli.request import InvalidConstraint, InvalidRequest
from spec_cli.terminal.output import error, note
from spec_cli.terminal.progress import download_progress

T = TypeVar("T")
EXIT_USER_ERROR = 1
EXIT_USAGE = 2  # Click's status for a bad option value; a grammar or schema that cannot be used is one
EXIT_INTERRUPTED = 130
# Request fields by the flags that set them, for messages.
FLAGS = {"draft_max": "--draft-max", "draft_mode": "--draft-mode", "draft_p_min": "--draft-p-min",
         "verify": "--verify", "max_tokens": "--max-tokens", "seed": "--seed", "grammar": "--grammar",
         "grammar_file": "--grammar-file", "json_schema": "--json-schema", "json_schema_file": "--json-schema-file"}

ThreadsOpt = Annotated[Optional[int], typer.Option("--threads", min=1, help="CPU threads per model (default: every CPU this process may run on: all cores, or those taskset or a container allows).", show_default=False)]


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # asked to stop (`kill`, a service manager), and the terminal gone


def exit_status(signum: int) -> SystemExit:
    """What a shell reports for a process signal `signum` ended (128 + its number), raised to end as if it had."""
    return SystemExit(128 + signum)


@contextmanager
def stop_signals_raise(raised: Callable[[int], BaseException] = lambda _signum: KeyboardInterrupt()) -> Iterator[None]:
    """SIGTERM (`kill`, `timeout`, `docker stop`, a service manager) and SIGHUP (the terminal closed) stop a command as
    Ctrl-C does (`raised`, given the signal: what it raises instead, where Ctrl-C means something else: in a chat it
    cancels a line), so that what it keeps is kept: a batch's lines written stay whole, a server's answers in progress
    get their grace (SIGTERM; a hang-up ends them), and the memory and the cost book are written as the pair closes. At
    Python's default either ended the process where it stood: `spec serve` (whose uvicorn re-raises the SIGTERM it
    shut down on), `spec run` and `spec chat` wrote neither (a chat's memory was lost with the window it ran in). A
    signal the process was started ignoring stays ignored: `nohup spec serve` outlives its terminal."""
    def interrupt(signum: int, _frame: FrameType | None) -> None:
        raise raised(signum)

    previous = {signum: signal.signal(signum, interrupt) for signum in STOP_SIGNALS
                if signal.getsignal(signum) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn the library's one-line errors into one line on stderr and a non-zero exit."""
    try:
        yield
    except InvalidRequest as exc:
        error(exc.named(FLAGS))
        raise typer.Exit(EXIT_USAGE if isinstance(exc, InvalidConstraint) else EXIT_USER_ERROR) from None
    except BadInput as exc:
        error(str(exc))
        raise typer.Exit(EXIT_USAGE) from None
    except SpecError as exc:
        error(str(exc))
        raise typer.Exit(EXIT_USER_ERROR) from None


def resolve_files(spec: registry.PairSpec, quiet: bool, refresh: bool = False,
                  images: bool = True) -> tuple[Path, Path | None]:
    """The pair's files (no draft file when the target's MTP head drafts; its mmproj files where `images`),
    downloading (with progress bars) and deriving what is missing."""
    notify = (lambda _m: None) if quiet else note
    with download_progress() as bar:
        return registry.resolve(spec, notify=notify, tqdm_class=bar, refresh=refresh, images=images)


def csv_list(text: str, parse: Callable[[str], T]) -> list[T]:
    items = [parse(item.strip()) for item in text.split(",") if item.strip()]
    if not items:
        raise SpecError(f"expected a comma-separated list, got {text!r}")
    return items


def or_default(value: T | None, default: T) -> T:
    return default if value is None else value


def reachable_from_outside(host: str, allow_remote: bool, risk: str, hint: str = "", ipv4_only: bool = False) -> bool:
    """Whether a --host (an IP address; localhost too unless `ipv4_only`) lets other machines in, which needs
    --allow-remote; the refusal says what they could then do (`risk`, "use this server"), and `hint`."""
    if host == "localhost" and not ipv4_only:
        return False
    try:
        address = ipaddress.IPv4Address(host) if ipv4_only else ipaddress.ip_address(host)
    except ValueError:
        kind = "an IPv4 address" if ipv4_only else "an IP address"
        raise SpecError(f"--host must be {kind} such as 127.0.0.1 or 0.0.0.0, got {host!r}") from None
    if not address.is_loopback and not allow_remote:
        raise SpecError(f"--host {host} lets other machines {risk}; add --allow-remote if that is what you want{hint}")
    return not address.is_loopback


def silence_stdout() -> None:
    """The reader went away (`spec run … | head`): drop further output so Python's exit flush is quiet."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
