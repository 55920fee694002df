"""The demo pair against llama.cpp's own loops, side by side in one run: spec-cli's speculative loop, llama.cpp's
target alone (`llama-bench`) and llama.cpp's speculative loop (`llama-speculative-simple`), greedy, a
short-story prompt, 128 tokens; each with llama.cpp's extra buffer types (repacked weights, AMX) as this
machine's probe decided (spec-cli) or on (llama.cpp's default), and with them off. Build the two tools from
the vendored source of the pinned llama-cpp-python:

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 && tar xzf llama_cpp_python-0.3.36.tar.gz
    cmake -S llama_cpp_python-0.3.36/vendor/llama.cpp -B lcpp -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_CURL=OFF
    cmake --build lcpp --target llama-bench llama-speculative-simple -j

    python benchmarks/vs_llama_cpp.py --llama-bin lcpp/bin [-k 5] [-n 128] [-r 3]

spec-cli's rows give decoding tok/s (after the prompt) and the milliseconds each generated token spent
drafting and verifying; llama.cpp's, its own decoding tok/s. Medians of the runs, interleaved.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
from pathlib import Path

from spec_cli import SamplingParams, load_pair
from spec_cli.llama import kernels
from spec_cli.models import registry

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
BENCH_ROW = re.compile(r"\|\s*tg(\d+)\s*\|\s*([\d.]+)\s*±")


def demo_files() -> tuple[Path, Path]:
    spec = registry.load_registry().get("smollm2-demo")
    target, draft = registry.resolve(spec)
    assert draft is not None
    return target, draft


def as_user_turn(target: Path) -> str:
    """The prompt as the target's chat template writes it: the same text for both programs."""
    with load_pair(target) as alone:
        return alone.target.format_chat([{"role": "user", "content": PROMPT}])


def spec_cli_run(target: Path, draft: Path, text: str, k: int, args: argparse.Namespace) -> list[tuple[float, float, float]]:
    """(tok/s, draft ms per token, verify ms per token) of each run; kernels as SPEC_EXTRA_BUFFERS says."""
    with load_pair(target, draft, n_threads=args.threads) as pair:
        prompt = pair.prompt_tokens(text, raw=True)
        runs = []
        for _ in range(args.repeat + 1):  # the first warms the caches up
            generation = pair.generate(prompt, sampling=SamplingParams(), draft_max=k, max_tokens=args.max_tokens)
            for _ in generation:
                pass
            s = generation.stats
            runs.append((s.tokens_per_second, 1000 * s.draft_s / s.generated_tokens,
                         1000 * s.verify_s / s.generated_tokens))
        return runs[1:]


def llama_bench(target: Path, repack: bool, args: argparse.Namespace) -> float:
    command = [str(args.llama_bin / "llama-bench"), "-m", str(target), "-p", "0", "-n", str(args.max_tokens),
               "-t", str(args.threads), "-r", str(args.repeat), "--repack", "1" if repack else "0"]
    output = subprocess.run(command, capture_output=True, text=True, errors="replace", check=True).stdout
    return float(BENCH_ROW.search(output).group(2))


def llama_speculative(target: Path, draft: Path, text: str, k: int, repack: bool, args: argparse.Namespace) -> float:
    command = [str(args.llama_bin / "llama-speculative-simple"), "-m", str(target), "-md", str(draft),
               "--spec-type", "draft-simple",
               "--spec-draft-n-max", str(k), "-n", str(args.max_tokens), "-p", text, "--temp", "0",
               "-t", str(args.threads), "-c", "2048", *(() if repack else ("--no-repack",))]
    output = subprocess.run(command, capture_output=True, text=True, errors="replace", check=True).stderr
    tokens, seconds = DECODED.search(output).groups()
    return int(tokens) / float(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-bin", type=Path, required=True, help="folder holding llama-bench and "
                                                                      "llama-speculative-simple")
    parser.add_argument("-k", type=int, default=5, help="draft tokens per round (the demo pair's tuned K: 5)")
    parser.add_argument("-n", "--max-tokens", type=int, default=128)
    parser.add_argument("-r", "--repeat", type=int, default=3)
    parser.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    target, draft = demo_files()
    text = as_user_turn(target)
    found = kernels.verdict()
    rows = []
    for setting, repack in ((found.name, True), ("off", False)):
        os.environ[kernels.ENV] = setting
        ours = spec_cli_run(target, draft, text, args.k, args)
        alone = llama_bench(target, repack, args)
        theirs = statistics.median(llama_speculative(target, draft, text, args.k, repack, args)
                                   for _ in range(args.repeat))
        rows.append((setting, ours, alone, theirs))
    print(f"demo pair (SmolLM2-135M-Instruct F32 drafted by its Q4_1), greedy, K = {args.k}, {args.max_tokens} "
          f"tokens, {args.threads} threads, medians of {args.repeat}; probe verdict: {found.name}")
    print(f"{'extra buffers':>14} {'spec-cli tok/s':>15} {'draft ms/tok':>13} {'verify ms/tok':>14} "
          f"{'llama-bench alone':>18} {'llama spec':>11} {'spec / alone':>13} {'spec / llama spec':>18}")
    for setting, ours, alone, theirs in rows:
        rate = statistics.median(r[0] for r in ours)
        draft_ms, verify_ms = statistics.median(r[1] for r in ours), statistics.median(r[2] for r in ours)
        print(f"{setting:>14} {rate:>15.1f} {draft_ms:>13.2f} {verify_ms:>14.2f} {alone:>18.1f} {theirs:>11.1f} "
              f"{rate / alone:>12.2f}x {rate / theirs:>17.2f}x")


if __name__ == "__main__":
    main()
