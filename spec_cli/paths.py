"""Where spec-cli keeps files of its own: derived models in the user cache."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """`$SPEC_CLI_CACHE`, else `$XDG_CACHE_HOME/spec-cli`, else `~/.cache/spec-cli`."""
    explicit = os.environ.get("SPEC_CLI_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "spec-cli"
