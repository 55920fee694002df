"""`/infill` on a code-completion workload, as an editor plugin (llama.vim, llama.vscode) sends it: a prefix and a
suffix cut from real source files (this repository's Python, ~50 tokens each around a gap of a few lines),
greedy, `n_predict` tokens, the default drafting against `--no-draft`.

Each side is its own `spec serve` process, sent every snippet once, interleaved: every snippet is a first
encounter on both sides (neither drafts from an answer it gave before to the same request), while the default
side's memory holds the earlier snippets' answers, as an editor's server would. Figures: decode tokens/s as the
server reports it, end-to-end seconds per request as the client sees it (what a user waits for), acceptance.

With no --target, the demo pair is given fill-in-the-middle token ids (three of SmolLM2's special tokens that it
never uses in text, set with gguf's `gguf_new_metadata`): it was not trained for FIM, so its middles are not
real completions, but the route, the prompt's shape and the drafting are. A FIM-trained model gives the real
figure: `--target qwen2.5-coder-1.5b.gguf [--draft qwen2.5-coder-0.5b.gguf]`.

    python benchmarks/infill.py [--target T.gguf [--draft D.gguf]] [-n 48] [--snippets 24]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from spec_cli.models import registry

sys.path.insert(0, str(Path(__file__).parent))
from serve_overhead import served_url  # noqa: E402

SOURCES = Path(__file__).resolve().parents[1] / "spec_cli"
FIM_IDS = {"fim_pre": 8, "fim_suf": 9, "fim_mid": 10}  # SmolLM2's <issue_start>, <issue_comment>, <issue_closed>
CONTEXT_CHARS = 180  # ~50 tokens of Python on each side of the gap
GAP_LINES = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, help="a FIM-trained target GGUF (default: the demo pair, FIM ids set)")
    parser.add_argument("--draft", type=Path, help="its draft GGUF (optional)")
    parser.add_argument("-n", "--n-predict", type=int, default=48)
    parser.add_argument("--snippets", type=int, default=24)
    args = parser.parse_args()
    snippets = cut_snippets(args.snippets)
    with tempfile.TemporaryDirectory() as folder:
        target, draft = (args.target, args.draft) if args.target else demo_with_fim(Path(folder))
        files = ["--target", str(target), *(["--draft", str(draft)] if draft else [])]
        sides = {"--no-draft": start(files, "--no-draft"), "default": start(files)}
        try:
            urls = {name: served_url(process).removesuffix("/v1") for name, process in sides.items()}
            for url in urls.values():  # warm-up (weights into memory), not counted
                infill(url, {"input_prefix": "def main():\n", "input_suffix": "\n", "n_predict": 8})
            rows = [{name: infill(url, {**snippet, "n_predict": args.n_predict}) for name, url in urls.items()}
                    for snippet in snippets]
        finally:
            for process in sides.values():
                process.terminate()
                process.wait(30)
    report(rows, target, args.n_predict)


def cut_snippets(count: int) -> list[dict[str, str]]:
    """`count` prefix/suffix pairs from the package's own modules: in each, a gap of GAP_LINES lines a third of
    the way down, with about CONTEXT_CHARS characters of whole lines before and after it."""
    modules = [path for path in sorted(SOURCES.rglob("*.py")) if len(path.read_text().splitlines()) > 60]
    snippets = []
    for path in modules[::max(1, len(modules) // count)][:count]:
        lines = path.read_text().splitlines(keepends=True)
        gap = len(lines) // 3
        start = gap
        while start > 0 and sum(map(len, lines[start:gap])) < CONTEXT_CHARS:
            start -= 1
        end = gap + GAP_LINES
        while end < len(lines) and sum(map(len, lines[gap + GAP_LINES:end])) < CONTEXT_CHARS:
            end += 1
        snippets.append({"input_prefix": "".join(lines[start:gap]), "input_suffix": "".join(lines[gap + GAP_LINES:end]),
                         "input_extra": [{"filename": path.name, "text": "".join(lines[:12])}]})
    return snippets


def demo_with_fim(folder: Path) -> tuple[Path, Path]:
    """The demo pair's files, copied with FIM token ids declared in their metadata."""
    models = registry.load_registry()
    copies = []
    for path in registry.resolve(models.get(models.default)):
        copy = folder / path.name
        ids = [arg for name, token in FIM_IDS.items() for arg in ("--special-token-by-id", name, str(token))]
        subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(path), str(copy), *ids,
                        "--force"], check=True, capture_output=True)
        copies.append(copy)
    return copies[0], copies[1]


def start(files: list[str], *flags: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "spec_cli", "serve", *files, *flags, "--port", "0", "--quiet"],
                            stderr=subprocess.PIPE, text=True)


def infill(url: str, body: dict) -> dict:
    started = time.perf_counter()
    answer = httpx.post(f"{url}/infill", json={**body, "temperature": 0}, timeout=600)
    answer.raise_for_status()
    fields = answer.json()
    timings = fields["timings"]
    return {"seconds": time.perf_counter() - started, "tokens": timings["predicted_n"],
            "decode": timings["predicted_per_second"], "drafted": timings["draft_n"],
            "accepted": timings["draft_n_accepted"], "text": fields["content"]}


def report(rows: list[dict], target: Path, n_predict: int) -> None:
    def median(side: str, key: str) -> float:
        return statistics.median(row[side][key] for row in rows)

    def total(side: str, key: str) -> float:
        return sum(row[side][key] for row in rows)

    print(f"/infill, {len(rows)} snippets, {target.name}, greedy, n_predict {n_predict}; medians per request")
    print(f"{'':28}{'--no-draft':>12}{'default':>12}{'default / no-draft':>20}")
    for label, key in (("decode tok/s", "decode"), ("end-to-end seconds", "seconds")):
        alone, drafted = median("--no-draft", key), median("default", key)
        print(f"{label:28}{alone:12.3f}{drafted:12.3f}{drafted / alone:20.2f}")
    whole = {side: total(side, "tokens") / total(side, "seconds") for side in ("--no-draft", "default")}
    print(f"{'all requests, tok/s':28}{whole['--no-draft']:12.1f}{whole['default']:12.1f}"
          f"{whole['default'] / whole['--no-draft']:20.2f}")
    drafted = total("default", "drafted")
    print(f"default drafted {drafted:.0f} tokens, kept {total('default', 'accepted') / max(1, drafted):.0%}; "
          f"same text on both sides: {sum(r['default']['text'] == r['--no-draft']['text'] for r in rows)}/{len(rows)}")


if __name__ == "__main__":
    main()
