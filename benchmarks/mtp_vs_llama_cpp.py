"""spec-cli's MTP drafting against llama.cpp's own MTP loop (`llama-speculative-simple --spec-type draft-mtp`),
same model, prompt and K, side by side in one run.

No Qwen3.5 GGUF can be downloaded here, so this writes one with the test suite's writer: `qwen35` (gated delta
net and attention layers in turn) with one MTP block, F32, wide enough that a target step costs milliseconds
on a CPU (a tiny model would measure only Python's overhead). Its layers add little to the residual stream and
its head keeps the token's half of its input, so the head's drafts are right about half the time (a trained
head's are right more often: llama.cpp reports ~75% on Qwen3.6 27B). Build llama.cpp's tool from the vendored source of the pinned llama-cpp-python:

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 && tar xzf llama_cpp_python-0.3.36.tar.gz
    cmake -S llama_cpp_python-0.3.36/vendor/llama.cpp -B lcpp -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_CURL=OFF
    cmake --build lcpp --target llama-speculative-simple -j

    python benchmarks/mtp_vs_llama_cpp.py --llama-bin lcpp/bin [-k 1,3] [-n 128] [-r 3]

Greedy: tokens/s of decoding (after the prompt) for the target alone, spec-cli's MTP loop and llama.cpp's,
medians of the runs, interleaved. At T = 1: tokens per target pass, spec-cli's block verification (Sun et al.
2025) against llama.cpp's exact match of the draft with the target's sampled token.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import llama_cpp_tool  # noqa: E402  (beside this script)
from support.tiny_models import write_qwen35_mtp  # noqa: E402  (the test suite's GGUF writer)

from spec_cli import Pair, SamplingParams, load_pair  # noqa: E402

PROMPT = "the cat sat on the mat and the dog ran after the red ball in the garden"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-bin", type=Path, required=True, help="folder holding llama-speculative-simple")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/spec-mtp"), help="where the model goes")
    parser.add_argument("-k", default="1,3,5", help="draft lengths, comma-separated")
    parser.add_argument("-n", "--max-tokens", type=int, default=128)
    parser.add_argument("-r", "--repeat", type=int, default=3)
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("--width", type=int, default=1024, help="smaller, with fewer --layers: faster target steps")
    parser.add_argument("--layers", type=int, default=12)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    model = args.dir / f"qwen35-mtp-{args.width}x{args.layers}-s002.f32.gguf"
    if not model.exists():
        write_qwen35_mtp(model, n_embd=args.width, n_trunk=args.layers, layer_scale=0.02)
    ks = [int(k) for k in args.k.split(",")]
    with load_pair(model, n_ctx=1024, n_threads=args.threads) as pair:
        prompt = pair.target.tokenize(PROMPT)
        ours = lambda mode, k, t, seed=1: generate(pair, prompt, mode, k, t, args.max_tokens, seed)  # noqa: E731
        theirs = lambda k, t, seed=1: llama_cpp_mtp(args, model, k, t, seed)  # noqa: E731
        ours("none", 0, 0.0)  # warm-up
        alone = [ours("none", 0, 0.0)[0] for _ in range(args.repeat)]
        rows = []
        for k in ks:
            mine, llama, block, exact = [], [], [], []
            for seed in range(args.repeat):
                mine.append(ours("mtp", k, 0.0))
                llama.append(theirs(k, 0.0))
                block.append(ours("mtp", k, 1.0, seed)[1])
                exact.append(theirs(k, 1.0, seed)[1])
            rows.append((k, mine, llama, statistics.mean(block), statistics.mean(exact)))
    report(statistics.median(alone), rows, args)


def generate(pair: Pair, prompt: list[int], mode: str, k: int, temperature: float, max_tokens: int,
             seed: int) -> tuple[float, float]:
    """(decoding tok/s, tokens per target pass) of one generation; sampling at T = 1 has no filters."""
    sampling = SamplingParams(temperature=temperature, top_k=0, top_p=1.0, min_p=0.0)
    generation = pair.generate(prompt, sampling=sampling, seed=seed, draft_mode=mode, draft_max=k,
                               max_tokens=max_tokens, verify="block")
    for _ in generation:
        pass
    stats = generation.stats
    return stats.tokens_per_second, stats.mean_accepted_length


def llama_cpp_mtp(args: argparse.Namespace, model: Path, k: int, temperature: float, seed: int) -> tuple[float, float]:
    """(decoding tok/s, tokens per target pass) of llama.cpp's own MTP loop on the same model and prompt."""
    command = [str(args.llama_bin / "llama-speculative-simple"), "-m", str(model), "--spec-type", "draft-mtp",
               "--spec-draft-n-max", str(k), "-n", str(args.max_tokens), "-p", PROMPT, "--temp", str(temperature),
               "--top-k", "0", "--top-p", "1", "--min-p", "0", "-s", str(seed), "-t", str(args.threads), "-c", "1024"]
    tokens, seconds, _drafted, accepted = llama_cpp_tool.run(command)
    rounds = tokens - accepted  # each pass yields its accepted drafts and one token of the target's
    return tokens / seconds, tokens / rounds


def report(alone: float, rows: list, args: argparse.Namespace) -> None:
    print(f"qwen35 {args.width} wide, {args.layers} layers + 1 MTP block, F32; {args.max_tokens} tokens, {args.threads} threads, "
          f"medians of {args.repeat} (T = 1: means over {args.repeat} seeds)")
    print(f"target alone (spec-cli, --no-draft): {alone:.1f} tok/s\n")
    print(f"{'K':>3} {'spec-cli tok/s':>15} {'llama.cpp tok/s':>16} {'spec / llama':>13} {'spec / alone':>13}"
          f" {'tokens/pass T=1: block':>23} {'exact match (llama.cpp)':>24}")
    for k, mine, llama, block, exact in rows:
        ours, theirs = statistics.median(r[0] for r in mine), statistics.median(r[0] for r in llama)
        print(f"{k:>3} {ours:>15.1f} {theirs:>16.1f} {ours / theirs:>12.2f}x {ours / alone:>12.2f}x"
              f" {block:>23.2f} {exact:>24.2f}")
    print(f"\ngreedy tokens/pass, spec-cli: {', '.join(f'K={r[0]} {statistics.median(x[1] for x in r[1]):.2f}' for r in rows)}"
          f"; llama.cpp: {', '.join(f'K={r[0]} {statistics.median(x[1] for x in r[2]):.2f}' for r in rows)}")


if __name__ == "__main__":
    main()
