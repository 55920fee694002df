"""`spec models …`: list, download, inspect, check and derive the GGUF files of pairs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from spec_cli.cli.common import EXIT_USER_ERROR, ThreadsOpt, resolve_files, user_errors
from spec_cli.cli.help import CommandGroup
from spec_cli.errors import SpecError
from spec_cli.llama.gguf import FTYPES, mtp_layers
from spec_cli.models import registry
from spec_cli.reports import models as reports
from spec_cli.models.derive import derive
from spec_cli.paths import user_registry_path
from spec_cli.terminal.output import note, say
from spec_cli.terminal.tables import show_facts, show_pair, show_pairs, show_rules

models_app = typer.Typer(cls=CommandGroup, help="Model pairs: list, download, inspect, check and derive GGUF files.",
                         no_args_is_help=True)



@models_app.command("list")
def models_list() -> None:
    """List the known pairs, which of their files are on disk, and how much space they take."""
    with user_errors():
        known = registry.load_registry()
        show_pairs(reports.pair_rows(known), known.default)


@models_app.command("pull")
def models_pull(name: Annotated[str, typer.Argument(help="Pair name (see spec models list).")]) -> None:
    """Download a pair's files from the Hugging Face Hub into its cache (and derive a self-draft)."""
    with user_errors():
        target, draft = resolve_files(registry.load_registry().get(name), quiet=False, refresh=True)
        say(f"target {target}")
        say(f"draft  {draft or 'the target’s MTP head (no file)'}")


@models_app.command("show")
def models_show(name: Annotated[str, typer.Argument(help="Pair name (see spec models list).")]) -> None:
    """Show a pair's sources, local files, sizes, and what their GGUF metadata says."""
    with user_errors():
        spec = registry.load_registry().get(name)
        settings = {"K": spec.draft_max, "ctx": spec.ctx or "the target's trained context, where it fits",
                    "gpu layers": spec.gpu_layers,
                    "draft gpu layers": spec.draft_gpu_layers, **({"RPC workers": ", ".join(spec.rpc)} if spec.rpc else {}),
                    "from": spec.origin}
        show_pair(spec.name, spec.description, settings, reports.member_reports(spec))


@models_app.command("check", epilog="Examples:\n\n  spec models check qwen3.5-9b\n\n  spec models check big.gguf small.gguf\n\n  spec models check Qwen3.6-27B-Q4_K_M.gguf   # can it draft for itself with its MTP head?")
def models_check(
    pair_or_target: Annotated[str, typer.Argument(metavar="PAIR|TARGET", help="A pair name (its files must be on disk), or the target GGUF file.")],
    draft: Annotated[Optional[Path], typer.Argument(metavar="[DRAFT]", help="The draft GGUF file, when the first argument is a target file (without one: whether the target's MTP head can draft).", show_default=False)] = None,
) -> None:
    """Check whether a draft can draft for a target: every rule for sharing token ids, passed or failed (a pair that fails one drafts through text: what that has to work with), or for an EAGLE-3 or DFlash drafter the target layers it reads and whether the target can feed it; each model's kind of memory and rollback, the target's MTP layers (its own drafter), and whether each reads images."""
    with user_errors():
        target, draft, k, spec = _check_subjects(pair_or_target, draft)
        fed = reports.drafter_facts(target, draft) if draft is not None else None
        if fed is not None:
            show_facts("drafter fed by the target", fed[0])
        elif draft is not None:
            rules, through_text = reports.check_files(target, draft)
            show_rules(rules)
            if through_text:
                show_facts("drafting through text", through_text)
        show_facts("memory", reports.memory_facts(target, draft, k))
        show_facts("chat template", reports.template_facts(target))
        show_facts("images", reports.image_facts(target, draft, spec))
        if draft is None and not mtp_layers(target) or fed is not None and not fed[1]:
            raise typer.Exit(EXIT_USER_ERROR)


def _check_subjects(pair_or_target: str,
                    draft: Path | None) -> tuple[Path, Path | None, int, registry.PairSpec | None]:
    """(target, draft or None, K the target's memory is sized for, the pair): a pair's files, or the files given; a
    GGUF given alone is checked for its MTP head."""
    if draft is not None or pair_or_target.endswith(".gguf") or Path(pair_or_target).is_file():
        return Path(pair_or_target), draft, 0, None
    spec = registry.load_registry().get(pair_or_target)
    files = reports.located_pair(spec)
    if files is None:
        raise SpecError(f"pair {spec.name!r} is not on disk yet: spec models pull {spec.name}")
    return *files, spec.draft_max, spec


@models_app.command("derive")
def models_derive(
    source: Annotated[Path, typer.Argument(help="GGUF file to re-encode.")],
    type_: Annotated[str, typer.Option("--type", help=f"Target encoding: {', '.join(FTYPES)}.")],
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Where to write it (default: the cache).", show_default=False)] = None,
    threads: ThreadsOpt = None,
) -> None:
    """Re-encode a GGUF with llama.cpp's quantizer (e.g. a Q4_0 self-draft of an F16 target); prints the path."""
    with user_errors():
        if out is not None and out.exists():
            raise SpecError(f"{out} already exists; remove it or choose another --out")
        say(str(derive(source, type_.lower(), dest=out, n_threads=threads, notify=note)))


@models_app.command("path")
def models_path() -> None:
    """Print where your own pairs file is (set SPEC_CLI_MODELS to use another)."""
    say(str(user_registry_path()))
