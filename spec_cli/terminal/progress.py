"""Progress bars on stderr: the benchmark's runs, a batch's lines, and downloads from the Hugging Face Hub."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn,
                           TransferSpeedColumn)


@contextmanager
def progress(total: int) -> Iterator[Callable[[str], None]]:
    """A progress bar with an ETA on stderr; yields a function to call as each run starts."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("starting", total=total)
        started = False

        def advance(label: str) -> None:
            nonlocal started
            bar.update(task, description=label, advance=1 if started else 0)
            started = True

        yield advance


@contextmanager
def download_progress() -> Iterator[type]:
    """Yields a progress-bar class for huggingface_hub downloads, drawn by rich on stderr."""
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True)) as bars:

        class Bar:
            """The part of tqdm's interface huggingface_hub uses: keyword construction, `with`, update."""

            def __init__(self, *, desc: str = "", total: int | None = None, initial: int = 0, **_: object) -> None:
                self.task = bars.add_task(desc, total=total, completed=initial)

            def __enter__(self) -> "Bar":
                return self

            def __exit__(self, *_exc: object) -> None:
                pass

            def update(self, n: int = 1) -> None:
                bars.advance(self.task, n)

        yield Bar


class BatchBar:
    """`spec batch`'s progress on stderr: lines done of the total, tokens per second, acceptance, ETA. Drawn
    only where stderr is a terminal (a pipe or a log gets the summary line alone)."""

    def __init__(self, total: int, shown: bool) -> None:
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                   TimeRemainingColumn())
        console = Console(stderr=True)
        self._bar = Progress(*columns, console=console, transient=True, disable=not (shown and console.is_terminal))
        self._task = self._bar.add_task("batch", total=total, rate="")

    def __enter__(self) -> BatchBar:
        self._bar.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._bar.stop()

    def update(self, done: int, tokens_per_second: float, acceptance: float | None) -> None:
        said = f"{tokens_per_second:.1f} tok/s" + (f" · acceptance {acceptance:.0%}" if acceptance is not None else "")
        self._bar.update(self._task, completed=done, rate=said)
