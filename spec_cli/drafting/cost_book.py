"""The cost book: what drafting measured for a pair on this machine, kept across runs, so that a new process
chooses how to draft from the costs already known here instead of a fixed warm-up.

One JSON file in the cache folder holds an entry per (machine, pair): the target's passes by rows (c_v), each
drafter's decodes by tokens fed (c_d), the loop's work per token (o), and each own drafter's acceptance by
draft position. A pair starts from its entry (`Drafting.seed`), each stored mean counting as a few calls so
that what is measured now soon outweighs it, and writes what it learnt back when it closes. The machine is
`kernels.machine_key` (this CPU and llama.cpp build) with the kernels it runs and the thread count; the pair,
its files' names and sizes and where they run. Nothing here is tuned by hand: every figure was measured where it is used.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Sequence

from spec_cli.decoding.costs import LoopCosts
from spec_cli.decoding.draft_length import AUTO_K_MAX, PositionAcceptance
from spec_cli.drafting.modes import MODES
from spec_cli.drafting.pair_state import entry_passes
from spec_cli.llama import kernels
from spec_cli.paths import cache_dir, locked

Entry = dict[str, Any]


def path() -> Path:
    return cache_dir() / "costs.json"


def key(files: Sequence[Path], n_threads: int, placement: dict[str, str]) -> str:
    """Whom an entry holds for: this machine at `n_threads` with the kernels it runs, these model files placed so."""
    parts = [kernels.machine_key(), kernels.verdict().name, str(n_threads), json.dumps(placement, sort_keys=True),
             *(f"{file.name}:{file.stat().st_size}" for file in files)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def read_all() -> dict[str, Entry]:
    """Every entry kept, by key ({} when there is no readable book)."""
    try:
        data = json.loads(path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read(book_key: str) -> Entry | None:
    entry = read_all().get(book_key)
    return entry if isinstance(entry, dict) else None


def write(book_key: str, entry: Entry) -> None:
    """Keep `entry` (with when it was written and for which machine). Under the book's lock it reads the entries
    other processes kept meanwhile and replaces the file whole: a reader sees the book before or after, never half
    of it, and two processes that close at once keep both their entries (of one key, the last whole one). A book
    that cannot be written is measured again next time."""
    target = path()
    partial = target.with_name(f".{target.name}.{os.getpid()}.part")
    try:
        with locked(target):
            book = read_all()
            book[book_key] = {**entry, "machine": kernels.machine_key(), "cpu": kernels.cpu_name(),
                              "written": time.strftime("%Y-%m-%d %H:%M")}
            partial.write_text(json.dumps(book, indent=1) + "\n")
            os.replace(partial, target)
    except OSError:
        partial.unlink(missing_ok=True)


def this_machine() -> list[Entry]:
    """The entries measured on this machine (this CPU and llama.cpp build), newest first."""
    machine = kernels.machine_key()
    entries = [entry for entry in read_all().values() if isinstance(entry, dict) and entry.get("machine") == machine]
    return sorted(entries, key=lambda entry: str(entry.get("written", "")), reverse=True)


def reading(entry: Entry) -> list[str]:
    """What an entry says about drafting here, one line per own drafter it measured: its step against the
    target's (c = c_d(1) / c_v(1)), and the best speed-up the cost model predicts from the costs and the
    acceptance measured, with what that implies."""
    try:
        passes = entry_passes(entry)
    except (AttributeError, TypeError, ValueError):
        return []
    lines = []
    for name, book in entry.get("books", {}).items():
        step, target = book.get("draft", {}).get("1"), passes.get("1")
        counts = entry.get("acceptance", {}).get(name)
        if not step or not target or not counts or name not in MODES:
            continue
        costs = LoopCosts(shape=MODES[name].cost_shape)
        costs.verify.seed(passes, 1.0)
        costs.draft.seed(book["draft"], 1.0)
        acceptance = PositionAcceptance(prior_weight=0.0)
        acceptance.seed(counts, float("inf"))
        alone = costs.rate(0, acceptance) or 0.0
        best_k = costs.best_k(acceptance, range(1, AUTO_K_MAX + 1)) or 1
        speedup = (costs.rate(best_k, acceptance) or 0.0) / alone if alone else 0.0
        line = (f"{name}: a draft step costs {step / target:.2f} of a target step here; at acceptance "
                f"{acceptance.alpha:.0%} the cost model predicts {speedup:.2f}× at K = {best_k}")
        if speedup < 1.1:
            line += ": n-gram lookup or an MTP head will pay more than this drafter (the default weighs them each round)"
        lines.append(line)
    return lines
