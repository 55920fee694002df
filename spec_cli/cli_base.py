"""What every `spec` command module shares: exit statuses, turning library errors into one line, lists given
as comma-separated text, and resolving a pair's files with progress bars."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Callable, Iterator, Optional, TypeVar

import typer

from spec_cli import registry, ui
from spec_cli.errors import SpecError

T = TypeVar("T")
EXIT_USER_ERROR = 1
EXIT_INTERRUPTED = 130

ThreadsOpt = Annotated[Optional[int], typer.Option("--threads", min=1, help="CPU threads per model (default: all cores).", show_default=False)]


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn the library's one-line errors into one line on stderr and a non-zero exit."""
    try:
        yield
    except SpecError as exc:
        ui.error(str(exc))
        raise typer.Exit(EXIT_USER_ERROR) from None


def resolve_files(spec: registry.PairSpec, quiet: bool, refresh: bool = False) -> tuple[Path, Path | None]:
    """The pair's files (no draft file when the target's MTP head drafts), downloading (with progress bars) and
    deriving what is missing."""
    notify = (lambda _m: None) if quiet else ui.note
    with ui.download_progress() as bar:
        return registry.resolve(spec, notify=notify, tqdm_class=bar, refresh=refresh)


def csv_list(text: str, parse: Callable[[str], T]) -> list[T]:
    items = [parse(item.strip()) for item in text.split(",") if item.strip()]
    if not items:
        raise SpecError(f"expected a comma-separated list, got {text!r}")
    return items
