"""What `spec models` and `spec doctor` report, gathered as data for the UI to draw."""

from __future__ import annotations

import platform
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from spec_cli import __version__
from spec_cli.formats import conventions
from spec_cli.decoding.draft_length import AUTO_K_MAX
from spec_cli.drafting import cost_book
from spec_cli.formats.dialect import Dialect
from spec_cli.errors import SpecError
from spec_cli.llama import features, gguf, kernels, rpc
from spec_cli.llama.model import Model, supports_gpu_offload, versions
from spec_cli.drafting import vocab
from spec_cli.models import hub
from spec_cli.models.registry import PROJECTORS, PairSpec, Registry, describe, locate, mmproj_beside, projectors
from spec_cli.paths import cache_dir, user_registry_path


@dataclass(frozen=True)
class PairRow:
    name: str
    target: str
    draft: str
    target_present: bool
    draft_present: bool
    size_bytes: int
    memory: str  # the target's kind of memory, "" when neither the entry nor a local file says


@dataclass(frozen=True)
class MemberReport:
    member: str
    source: str
    path: Path | None
    size_bytes: int
    info: gguf.ModelInfo | None
    is_file: bool = True  # False for a draft that is the target's MTP head
    drafter: list[tuple[str, str]] = field(default_factory=list)  # an EAGLE-3 or DFlash drafter's facts


def pair_rows(registry: Registry) -> list[PairRow]:
    """One row per pair: its sources, which files are on disk now, and how much disk they take."""
    rows = []
    for spec in registry.pairs.values():
        paths = {m: locate(spec, m) for m in spec.files}
        rows.append(PairRow(spec.name, _short(spec.target), _short(spec.draft),
                            paths["target"] is not None,
                            paths.get("draft") is not None or spec.drafts_with_mtp and paths["target"] is not None,
                            sum(p.stat().st_size for p in paths.values() if p is not None),
                            spec.memory or (gguf.memory_of(paths["target"]) if paths["target"] else "")))
    return rows


def _short(source: dict[str, object]) -> str:
    """A member in a table cell: its file name, or how it is derived."""
    if "derive" in source:
        return f"{source['derive']} as {str(source['type']).upper()}"
    if "mtp" in source:
        return "MTP head"
    return Path(str(source.get("file") or source.get("path"))).name


def member_reports(spec: PairSpec) -> list[MemberReport]:
    """Each member's source, local file and GGUF metadata (read without loading weights), and for an EAGLE-3 or
    DFlash draft what it reads and whether the target feeds it (`drafter_facts`)."""
    reports, target = [], locate(spec, "target")
    for member in spec.files:
        path = locate(spec, member)
        fed = drafter_facts(target, path) if member == "draft" and path else None
        info = gguf.model_info(path, _rollback_sized_for(member, spec.draft_max)) \
            if path and member not in PROJECTORS else None
        reports.append(MemberReport(member, describe(spec.source(member)), path, path.stat().st_size if path else 0,
                                    info, drafter=fed[0] if fed else []))
    if spec.drafts_with_mtp:
        reports.append(MemberReport("draft", describe(spec.draft), None, 0, None, is_file=False))
    return reports


def _rollback_sized_for(member: str, draft_max: int) -> int:
    """The K a member's memory is sized for, as `Pair` sizes it: the target's takes back whole rounds, the
    draft's nothing in place."""
    return max(draft_max, AUTO_K_MAX) if member == "target" else 0


def memory_facts(target: Path, draft: Path | None, draft_max: int) -> list[tuple[str, str]]:
    """Each member's kind of memory and how spec takes rejected tokens back from it, and the target's MTP
    layers (what drafts when there is no draft file)."""
    facts = []
    for member, path in (("target", target), ("draft", draft)):
        if path is None:
            continue
        info = gguf.model_info(path, _rollback_sized_for(member, draft_max))
        facts.append((f"{member} memory", f"{info.memory}; rollback: {info.rollback}"))
        if member == "target":
            facts.append(("target MTP layers", mtp_verdict(info.mtp_layers, drafts_alone=draft is None)))
    return facts


def image_facts(target: Path, draft: Path | None, spec: PairSpec | None = None) -> list[tuple[str, str]]:
    """Whether each side reads images: through the pair's mmproj files, else (files given by hand) a single
    mmproj beside each model, as `spec run` finds them (the draft's in a folder of its own)."""
    if spec is not None:
        mmproj, draft_mmproj = projectors(spec)
    else:
        mmproj = mmproj_beside(target)
        draft_mmproj = mmproj_beside(draft) if draft is not None and draft.parent != target.parent else None
    facts = [("target reads images", f"yes, through {mmproj.name}" if mmproj else
              "no mmproj (give one with --mmproj, or put it beside the model): text only")]
    if draft is not None:
        facts.append(("draft reads images", f"yes, through {draft_mmproj.name}: it sees what the target sees"
                      if draft_mmproj else "no: it drafts from the text around the images" if mmproj else "no"))
    return facts


def template_facts(target: Path) -> list[tuple[str, str]]:
    """How the target's chat template writes tool calls, and whether its prompt opens a thought (`Dialect`)."""
    model = Model(target, vocab_only=True)
    try:
        if model.chat_template() is None:
            return [("tool calls", "no chat template in the GGUF (give one with --chat-format)")]
        dialect = Dialect(model)
        thought = dialect.thought
        opened = "opened by the prompt: a constrained answer comes after it" if thought and thought.opened else \
            "the model may open one: a constrained answer may come after it" if thought else "none"
        return [("tool calls", conventions.in_words(dialect.known_convention)), ("thought", opened)]
    finally:
        model.close()


def mtp_verdict(layers: int, drafts_alone: bool) -> str:
    """A target's MTP layers in words: what `--draft-mode mtp` can do with them; when nothing else would draft
    (`drafts_alone`), why there are none."""
    if layers:
        return f"{layers}: it drafts for itself (--draft-mode mtp, the default without a draft)"
    if not drafts_alone:
        return "0"
    return ("0: no MTP head to draft with (this architecture has none, or the conversion left the MTP layers "
            "out; use a GGUF converted with them)")


def located_pair(spec: PairSpec) -> tuple[Path, Path | None] | None:
    """The pair's (target, draft) files when they are on disk now (no draft file when its MTP head drafts)."""
    target, draft = locate(spec, "target"), None if spec.drafts_with_mtp else locate(spec, "draft")
    if target is None or (draft is None and not spec.drafts_with_mtp):
        return None
    return target, draft


def check_files(target: Path, draft: Path) -> tuple[list[vocab.Rule], list[tuple[str, str]]]:
    """The compatibility report for two files, loading only their vocabularies: llama.cpp's rules for sharing
    token ids, and where they fail, what drafting through text has to work with (a `SpecError` when the
    pair cannot draft even so)."""
    target_model = Model(target, vocab_only=True)
    try:
        draft_model = Model(draft, vocab_only=True)
        try:
            rules = vocab.compare(target_model, draft_model)
            both = vocab.translation(target_model, draft_model)
            return rules, vocab.through_text_facts(both) if both else []
        finally:
            draft_model.close()
    finally:
        target_model.close()


def drafter_facts(target: Path | None, draft: Path) -> tuple[list[tuple[str, str]], bool] | None:
    """For an EAGLE-3 or DFlash drafter file: what it is (its kind, the target layers it reads) and whether
    `target` (where on disk) can feed it, with whether it can; None for an ordinary draft. The files are
    memory-mapped, not read: the drafter's layers are known only to a load with weights."""
    if not features.is_drafter(draft):
        return None
    drafter = Model(draft, extra_buffers=False)
    try:
        found = features.drafter_file(drafter)
        assert found is not None
        facts = [("drafter", found.describe())]
        if target is None:
            return facts, True
        target_model = Model(target, extra_buffers=False)
        try:
            features.check_pair(target_model, drafter, found)
            arch = target_model.metadata("general.architecture")
            facts.append(("target feeds it", f"yes: {target.name} ({arch}) hands over those layers' inputs"))
            return facts, True
        except SpecError as exc:
            return [*facts, ("target feeds it", f"no: {exc}")], False
        finally:
            target_model.close()
    finally:
        drafter.close()


def machine_gpu() -> str | None:
    """The GPU this machine has, whatever llama.cpp was built for: an NVIDIA driver, or Apple Silicon."""
    if shutil.which("nvidia-smi") or Path("/proc/driver/nvidia").exists():
        return "an NVIDIA GPU"
    if sys.platform == "darwin" and platform.machine() == "arm64":
        return "an Apple Silicon GPU (Metal)"
    return None


def gpu_install_command() -> str:
    """The reinstall that gives llama-cpp-python a GPU backend on this platform, keeping RPC (`spec worker`,
    `--rpc`)."""
    flag = "-DGGML_METAL=on" if sys.platform == "darwin" else "-DGGML_CUDA=on"
    version, _ = versions()
    return (f'CMAKE_ARGS="{flag} -DGGML_RPC=on" pip install --force-reinstall --no-cache-dir --no-binary '
            f'llama-cpp-python llama-cpp-python=={version}')


def backends(system_info: str) -> list[str]:
    """Backend names from llama.cpp's system info ("CUDA : ARCHS = … | CPU : AVX2 = 1 | …")."""
    names = []
    for part in system_info.split("|"):
        if " : " in part:
            name = part.split(" : ", 1)[0].strip()
            if name and name not in names:
                names.append(name)
    return names or ["CPU"]


def worker_facts(workers: list[rpc.WorkerInfo]) -> list[tuple[str, str]]:
    """One line per RPC worker that answered: its protocol and each device's free and total memory."""
    return [(str(w.endpoint), f"protocol {'.'.join(map(str, w.version))}; " + "; ".join(
        f"device {i}: {free / 1e9:.1f} GB free of {total / 1e9:.1f} GB" for i, (free, total) in enumerate(w.memory)))
        for w in workers]


def kernels_fact(found: kernels.Verdict) -> str:
    """Which of llama.cpp's extra CPU kernels run here, why, and how to decide again."""
    what = {"on": "llama.cpp's extra buffer types (repacked weights; AMX where the CPU has it) on for every model",
            "draft": "extra buffer types (repacked weights, AMX) for the draft model only, which decodes its "
                     "batches one token at a time; the target goes without",
            "off": "extra buffer types (repacked weights, AMX) off: plain kernels"}[found.name]
    if found.source != "probe":
        return f"{what} (set by {found.source})"
    steps = "; ".join(f"{step}: {outcome}" for step, outcome in (found.steps or {}).items())
    return (f"{what}. Probe of {found.checked} ({steps}); `spec doctor --probe` tries again, "
            f"{kernels.ENV}=on|draft|off decides by hand")


def doctor_facts(default: PairSpec, probe_again: bool = False) -> list[tuple[str, str]]:
    version, system_info = versions()
    gpu = supports_gpu_offload()
    memory = kernels.machine_memory()
    registry_path = user_registry_path()
    facts = [
        ("spec-cli", __version__),
        ("llama-cpp-python", version),
        ("llama.cpp backends", ", ".join(backends(system_info))),
        ("GPU offload", "yes" if gpu else "no (CPU-only build)"),
        ("llama.cpp system info", system_info),
        ("CPU", kernels.cpu_name()),
        ("CPU threads", str(kernels.cpu_threads())),
        ("memory", f"{memory / 1e9:.1f} GB" if memory else "unknown"),
        ("derived models cache", str(cache_dir() / "derived")),
        ("Hugging Face cache", str(hub.cache_dir()) + (" (offline: HF_HUB_OFFLINE)" if hub.offline() else "")),
        ("user pairs", f"{registry_path}" + ("" if registry_path.is_file() else " (not created yet)")),
    ]
    facts.append(("RPC (spec worker, --rpc)", f"yes, protocol {'.'.join(map(str, rpc.PROTOCOL))}" if rpc.supported()
                   else f"no: rebuild with {rpc.REBUILD}"))
    found = machine_gpu()
    if not gpu and found:
        facts.append(("enable GPU", f"this machine has {found}, which this build cannot use: {gpu_install_command()}"))
    facts.append(("CPU kernels", kernels_fact(kernels.verdict(probe_again))))
    facts += cost_facts()
    files = located_pair(default)
    if files is None:
        facts.append((f"pair {default.name}", f"not on disk yet (spec models pull {default.name})"))
    else:
        facts += [(f"{default.name}: {key}", value) for key, value in memory_facts(*files, default.draft_max)]
        facts += [(f"{default.name}: {key}", value) for key, value in image_facts(*files, default)]
    return facts


def cost_facts() -> list[tuple[str, str]]:
    """What the cost book measured on this machine, pair by pair (newest first): each own drafter's step against
    the target's and what it implies; one line saying how to measure when nothing is booked yet."""
    entries = cost_book.this_machine()
    if not entries:
        return [("measured here", "nothing yet: spec run, chat, serve and bench keep their costs in "
                                  f"{cost_book.path()}")]
    facts: list[tuple[str, str]] = []
    for entry in entries:
        pair = " ← ".join(entry.get("pair", [])) or "a pair"
        lines = cost_book.reading(entry) or ["no own drafter measured yet (only n-gram lookup or the target alone)"]
        facts += [(f"measured here: {pair}", line) for line in lines]
    return facts
