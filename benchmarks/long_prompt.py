"""Long prompts under every way of drafting: `spec run --no-memory -n 8` on prompts of ~1.5k and ~7.5k tokens (this
repository's docs), the target alone beside the default and each pinned mode, interleaved, median of `-r`.

Prompt time is the target's prefill (a draft catches up after it, between rounds: `drafting/window.py`); wall time
is the whole command, loading included, so a catch-up shows there. Each command runs once uncounted first, so that
the cost book holds this machine's rates, as it does after a first run. `SPEC_EXTRA_BUFFERS=draft` in the
environment reproduces the kernels of a CPU whose verdict is `draft` (`spec doctor`).

    python benchmarks/long_prompt.py [--pair NAME] [--sizes 1500,7500] [-r 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from spec_cli.cli.options import LoadOptions, open_pair
from spec_cli.llama import kernels
from spec_cli.llama.model import Model

DOCS = Path(__file__).resolve().parent.parent / "docs"
QUESTION = "\n\nSummarise the text above in one sentence."
MODES = {"--no-draft": ["--no-draft"], "default": [], "model": ["--draft-mode", "model"],
         "memory": ["--draft-mode", "memory"], "ngram": ["--draft-mode", "ngram"]}


def prompt_of(model: Model, tokens: int) -> str:
    """This repository's docs cut to about `tokens` tokens of `model`, then a question."""
    text = "\n\n".join(path.read_text() for path in sorted(DOCS.glob("*.md")))
    low, high = 0, len(text)
    while low < high:
        middle = (low + high) // 2
        if len(model.tokenize(text[:middle])) < tokens:
            low = middle + 1
        else:
            high = middle
    return text[:low] + QUESTION


def run(pair: list[str], flags: list[str], prompt: str, ctx: int) -> tuple[float, float, dict]:
    """(prompt seconds, wall seconds, stats) of one `spec run`."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "spec_cli", "run", *pair, *flags, "--no-memory", "--ctx", str(ctx),
                           "-n", "8", "--json", "-"], input=prompt, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    stats = json.loads(done.stdout)["stats"]
    return stats["prompt_s"], wall, stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", help="a registry pair (default: the registry's default)")
    parser.add_argument("--sizes", default="1500,7500", help="prompt sizes in tokens, comma-separated")
    parser.add_argument("-r", "--repeat", type=int, default=3)
    args = parser.parse_args()
    pair = ["--pair", args.pair] if args.pair else []
    with open_pair(LoadOptions(None, None, args.pair, quiet=True)) as loaded:
        model = Model(loaded.pair.target.path, vocab_only=True)
    print(f"CPU: {kernels.cpu_name()}; kernels: {kernels.verdict().name} ({kernels.verdict().source})")
    for size in (int(s) for s in args.sizes.split(",")):
        prompt = prompt_of(model, size)
        ctx = size + 512
        seen: dict[str, list[tuple[float, float, dict]]] = {name: [] for name in MODES}
        for repeat in range(args.repeat + 1):  # the first round warms the cost book up, uncounted
            for name, flags in MODES.items():
                measured = run(pair, flags, prompt, ctx)
                if repeat:
                    seen[name].append(measured)
        alone_prompt = statistics.median(p for p, _, _ in seen["--no-draft"])
        alone_wall = statistics.median(w for _, w, _ in seen["--no-draft"])
        print(f"\n{size}-token prompt, median of {args.repeat}")
        print(f"{'':14}{'prompt s':>10}{'x alone':>9}{'wall s':>9}{'x alone':>9}{'caught up':>11}{'drafted':>9}")
        for name, rows in seen.items():
            prompt_s = statistics.median(p for p, _, _ in rows)
            wall = statistics.median(w for _, w, _ in rows)
            caught = statistics.median(s["caught_up"] for _, _, s in rows)
            drafted = statistics.median(s["drafted"] for _, _, s in rows)
            print(f"{name:14}{prompt_s:10.2f}{prompt_s / alone_prompt:9.2f}{wall:9.2f}{wall / alone_wall:9.2f}"
                  f"{caught:11.0f}{drafted:9.0f}")


if __name__ == "__main__":
    main()
