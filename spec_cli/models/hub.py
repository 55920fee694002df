"""Model files from the Hugging Face Hub, through huggingface_hub's cache.

The endpoint, cache folder and offline switch are read from the environment at call time (huggingface_hub
reads them once, at import), so `HF_ENDPOINT`, `HF_HOME`, `HF_HUB_CACHE` and `HF_HUB_OFFLINE` set by a test
or a wrapper script are honoured. huggingface_hub downloads into a temporary file that is renamed into the
cache only when complete, and retries a dropped connection with a Range request from where it stopped;
`download` then checks a fresh file against its SHA-256.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

import huggingface_hub
from huggingface_hub.errors import (EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError,
                                    RepositoryNotFoundError)

from spec_cli.errors import SpecError

DEFAULT_REVISION = "main"
SHA256 = re.compile(r"[0-9a-f]{64}")


def cache_dir() -> Path:
    """huggingface_hub's cache folder, by its own precedence: HF_HUB_CACHE, HF_HOME/hub, XDG, home."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "huggingface" / "hub"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def describe(repo: str, file: str, revision: str | None) -> str:
    at = f"@{revision}" if revision and revision != DEFAULT_REVISION else ""
    return f"{repo}{at}/{file}"


def cached(repo: str, file: str, revision: str | None) -> Path | None:
    """The local copy of a Hub file if it is already in the cache, without any network access."""
    found = huggingface_hub.try_to_load_from_cache(repo, file, cache_dir=cache_dir(),
                                                   revision=revision or DEFAULT_REVISION)
    return Path(found) if isinstance(found, str) else None


def download(repo: str, file: str, revision: str | None, pull_hint: str,
             tqdm_class: Any = None) -> Path:
    """The cached file, downloading it first if needed; every failure is one line that says what to do.

    `pull_hint` is the command that fetches the file (e.g. "spec models pull NAME"), named in errors.
    """
    where = describe(repo, file, revision)
    before = cached(repo, file, revision)
    try:
        path = huggingface_hub.hf_hub_download(
            repo, file, revision=revision or DEFAULT_REVISION, cache_dir=cache_dir(),
            endpoint=os.environ.get("HF_ENDPOINT") or None, local_files_only=offline(), tqdm_class=tqdm_class,
        )
    except LocalEntryNotFoundError as exc:
        reason = "HF_HUB_OFFLINE is set" if offline() else "the Hub cannot be reached"
        raise SpecError(f"{where} is not downloaded and {reason}; run `{pull_hint}` with network access") from exc
    except (RepositoryNotFoundError, EntryNotFoundError) as exc:  # after its subclass above
        raise SpecError(f"{where} does not exist on the Hub (or needs a token: huggingface-cli login)") from exc
    except (HfHubHTTPError, OSError) as exc:
        raise SpecError(f"downloading {where} failed: {_first_line(exc)}") from exc
    if before is None or before.resolve() != Path(path).resolve():
        verify(Path(path), where)
    return Path(path)


def verify(path: Path, where: str) -> None:
    """Check a fresh download against its SHA-256, which the cache names its blob after for LFS files.

    A mismatch removes the file from the cache (so the next pull starts clean) and fails in one line.
    """
    blob = path.resolve()
    expected = blob.name
    if not SHA256.fullmatch(expected):
        return  # a small non-LFS file: its ETag is a git hash, not the content's SHA-256
    digest = hashlib.sha256()
    with blob.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        blob.unlink(missing_ok=True)
        path.unlink(missing_ok=True)
        raise SpecError(f"{where} is corrupt (SHA-256 {digest.hexdigest()[:12]}…, expected {expected[:12]}…); "
                        f"it was removed, pull it again")


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
