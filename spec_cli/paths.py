"""Where spec-cli keeps files of its own: derived models in the user cache, user pairs in the config folder."""

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


def config_dir() -> Path:
    """`$XDG_CONFIG_HOME/spec-cli`, else `~/.config/spec-cli`."""
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base).expanduser() / "spec-cli"


def user_registry_path() -> Path:
    """The user's own pairs: `$SPEC_CLI_MODELS` if set, else `models.toml` in the config folder."""
    explicit = os.environ.get("SPEC_CLI_MODELS")
    return Path(explicit).expanduser() if explicit else config_dir() / "models.toml"
