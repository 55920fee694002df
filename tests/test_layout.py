"""The house's layout, checked: every wing imports only the floors below it (the table of docs/development.md), and
nothing sits loose at the top of the package but the public API and its two helpers.

A wing may import its own modules and any wing on a lower floor; wings on one floor never import each other. So
the loop's floors (`llama`, `decoding`) import nothing above them, `models` reads no drafter and no chat format,
and `server` and `batch` share the OpenAI request layer (`api`) without one importing the other.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import spec_cli

PACKAGE = Path(spec_cli.__file__).parent
FLOORS = [  # bottom first
    {"errors", "paths"},
    {"llama"},
    {"decoding"},
    {"drafting", "models"},
    {"request"},
    {"pair"},
    {"formats"},
    {"api", "bench", "conversation", "reports"},
    {"batch", "server", "terminal"},
    {"cli"},
    {"__main__"},
]
LOOSE = {"__init__", "__main__", "errors", "paths", "pair", "request"}  # top-level modules that are not wings
FLOOR = {wing: level for level, wings in enumerate(FLOORS) for wing in wings}


def wing_of(path: Path) -> str:
    """The wing a module of the package belongs to: its folder, or its own name at the top."""
    relative = path.relative_to(PACKAGE)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def imported_wings(source: str) -> set[str]:
    """The wings of spec_cli a module's source imports, at its top or inside a function (the package itself,
    `from spec_cli import __version__`, is no wing)."""
    modules: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
    parts = [module.split(".") for module in modules]
    return {part[1] for part in parts if part[0] == "spec_cli" and len(part) > 1 and part[1] in FLOOR}


def back_up_imports(wing: str, source: str) -> list[str]:
    """The wings `source`, a module of `wing`, may not import: its floor's other wings and every wing above."""
    return sorted(other for other in imported_wings(source) if other != wing and FLOOR[other] >= FLOOR[wing])


def test_every_module_belongs_to_a_wing_of_the_table() -> None:
    wings = {wing_of(path) for path in PACKAGE.rglob("*.py")} - {"__init__"}
    assert wings <= set(FLOOR), f"wings missing from FLOORS (and docs/development.md): {sorted(wings - set(FLOOR))}"


def test_nothing_sits_loose_at_the_top_but_the_public_api() -> None:
    loose = {path.stem for path in PACKAGE.glob("*.py")}
    assert loose <= LOOSE, f"loose top-level modules: {sorted(loose - LOOSE)}: give each a wing"


def test_no_module_imports_a_wing_above_it_or_beside_it() -> None:
    wrong = {str(path.relative_to(PACKAGE)): bad for path in sorted(PACKAGE.rglob("*.py"))
             if wing_of(path) != "__init__"
             and (bad := back_up_imports(wing_of(path), path.read_text(encoding="utf-8")))}
    assert wrong == {}


def test_a_back_up_import_is_caught_wherever_it_is_written() -> None:
    """The check reads lazy imports too, and a floor's neighbours are as forbidden as the floors above."""
    lazy = "def f():\n    from spec_cli.request import GenerationRequest\n    return GenerationRequest\n"
    assert back_up_imports("decoding", lazy) == ["request"]
    assert back_up_imports("models", "from spec_cli.drafting import cost_book\n") == ["drafting"]
    assert back_up_imports("batch", "from spec_cli.server import app\n") == ["server"]
    assert back_up_imports("server", "from spec_cli.api.errors import RequestError\n") == []


def test_every_module_the_install_script_and_the_package_metadata_name_exists() -> None:
    """install.sh checks the build through spec_cli's own modules: a module moved to another wing must be moved
    there too (the CI caught one that was not)."""
    root = PACKAGE.parent
    named = set()
    for name in ("install.sh", "pyproject.toml"):
        named |= set(re.findall(r"\bspec_cli(?:\.\w+)+", (root / name).read_text(encoding="utf-8")))
    assert named
    missing = [module for module in sorted(named) if importlib.util.find_spec(module) is None]
    assert missing == []
