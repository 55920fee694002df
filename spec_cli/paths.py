"""Where spec-cli keeps files of its own (derived models and what it measured in the user cache, user pairs in the
config folder), and the lock under which several processes share one."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterator


def cache_dir() -> Path:
    """`$SPEC_CLI_CACHE`, else `$XDG_CACHE_HOME/spec-cli`, else `~/.cache/spec-cli`."""
    explicit = os.environ.get("SPEC_CLI_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "spec-cli"


def config_dir() -> Path:
    """`$XDG_CONFIG_HOME/spec-cli`, else `~/.config/spec-cli`."""
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base).expanduser() / "spec-cli"


def user_registry_path() -> Path:
    """The user's own pairs: `$SPEC_CLI_MODELS` if set, else `models.toml` in the config folder."""
    explicit = os.environ.get("SPEC_CLI_MODELS")
    return Path(explicit).expanduser() if explicit else config_dir() / "models.toml"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path`'s side file (`FILE.lock`), held while a process reads `path`, merges what it adds
    and replaces it: two processes that share a file lose neither's update."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
