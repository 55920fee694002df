"""One-line output: remarks and errors on stderr, plain lines on stdout, and the lines a server or a worker
prints when it starts."""

from __future__ import annotations

from rich.console import Console


def note(message: str) -> None:
    """A one-line remark on stderr, dim where stderr is a terminal."""
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"spec: {message}", style="dim", markup=False)


def error(message: str) -> None:
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"spec: error: {message}", style="bold red", markup=False)


def worker_started(endpoint: str, devices: list[tuple[str, str, int, int]], threads: int) -> None:
    """What a worker offers, on stdout: its endpoint, and each device's free and total memory."""
    offered = "; ".join(f"{name} ({description}): {human_size(free)} free of {human_size(total)}"
                        for name, description, free, total in devices)
    say(f"spec worker on {endpoint}: {offered}; {threads} threads. Ctrl-C stops it.")


def serving(name: str, url: str, drafting: str) -> None:
    """The line `spec serve` prints once it listens (with --quiet too: with --port 0 it is the only way to
    learn the port)."""
    Console(stderr=True, highlight=False, soft_wrap=True).print(
        f"spec: serving {name} on {url} · drafting {drafting} · Ctrl-C stops", markup=False)


def say(text: str) -> None:
    """A plain line on stdout (paths and results that scripts may read)."""
    Console(highlight=False, soft_wrap=True).print(text, markup=False)


def human_size(n_bytes: int) -> str:
    size = float(n_bytes)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} TB"
