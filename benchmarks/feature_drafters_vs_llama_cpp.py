"""spec-cli's EAGLE-3 and DFlash drafting against llama.cpp's own loops (`llama-speculative-simple --spec-type
draft-eagle3` / `draft-dflash`), same models, prompt and K, greedy, side by side in one run.

No EAGLE-3 or DFlash GGUF with a target small enough for a CPU can be downloaded here, so this writes them
with the test suite's writers: a llama target (F32, wide enough that a target step costs milliseconds), an
EAGLE-3 head and a DFlash drafter for it that predict what a bigram of the target's would: the target's
layers add little (`layer_scale`), so the first draft is mostly right; the EAGLE-3 head chains its bigrams,
the DFlash drafter repeats its first draft at every mask, so its later drafts are mostly wrong (trained
drafters are right more often). Equal acceptance on both sides is the evidence that spec-cli feeds
the drafters the target's features as llama.cpp does: the drafts depend on them. Build llama.cpp's tool from
the vendored source of the pinned llama-cpp-python:

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 && tar xzf llama_cpp_python-0.3.36.tar.gz
    cmake -S llama_cpp_python-0.3.36/vendor/llama.cpp -B lcpp -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_CURL=OFF
    cmake --build lcpp --target llama-speculative-simple -j

    python benchmarks/feature_drafters_vs_llama_cpp.py --llama-bin lcpp/bin [-k 2,4] [-n 128] [-r 3]

Prints tokens/s of decoding (after the prompt) for the target alone and for each drafter and K on both sides,
medians of the runs, interleaved, and each side's acceptance (accepted / drafted).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import llama_cpp_tool  # noqa: E402  (beside this script)
from support.tiny_models import write_dflash, write_eagle3, write_model  # noqa: E402  (the test suite's GGUF writers)

from spec_cli import Pair, load_pair  # noqa: E402

PROMPT = "the cat sat on the mat and the dog ran after the red ball in the garden"
LAYERS = {"eagle3": (1, 4, 6), "dflash": (1, 4, 6)}
SPEC_TYPE = {"eagle3": "draft-eagle3", "dflash": "draft-dflash"}


def write_models(folder: Path, width: int, n_layer: int, block: int) -> tuple[Path, dict[str, Path]]:
    """The target and its two drafters, written once per shape."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"llama-{width}x{n_layer}.f32.gguf"
    if not target.exists():
        write_model(target, seed=1, n_embd=width, n_layer=n_layer, layer_scale=0.02)
    drafters = {"eagle3": folder / f"eagle3-{width}.gguf", "dflash": folder / f"dflash-{width}-b{block}.gguf"}
    if not drafters["eagle3"].exists():
        write_eagle3(drafters["eagle3"], target_width=width, target_layers=LAYERS["eagle3"], gain=10.0,
                     norm_g=True)
    if not drafters["dflash"].exists():
        write_dflash(drafters["dflash"], target, target_layers=LAYERS["dflash"], block_size=block)
    return target, drafters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-bin", type=Path, required=True, help="folder holding llama-speculative-simple")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/spec-fed"), help="where the models go")
    parser.add_argument("-k", default="1,2,4", help="draft lengths, comma-separated")
    parser.add_argument("-n", "--max-tokens", type=int, default=128)
    parser.add_argument("-r", "--repeat", type=int, default=3)
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--block", type=int, default=8, help="the DFlash drafter's block size")
    args = parser.parse_args()
    target, drafters = write_models(args.dir, args.width, args.layers, args.block)
    ks = [int(k) for k in args.k.split(",")]
    rows, alone = [], []
    for kind, drafter in drafters.items():
        with load_pair(target, drafter, n_ctx=1024, n_threads=args.threads) as pair:
            prompt = pair.target.tokenize(PROMPT)
            generate(pair, prompt, "none", 0, args.max_tokens)  # warm-up
            alone += [generate(pair, prompt, "none", 0, args.max_tokens)[0] for _ in range(args.repeat)]
            for k in ks:
                mine, llama = [], []
                for _ in range(args.repeat):
                    mine.append(generate(pair, prompt, kind, k, args.max_tokens))
                    llama.append(llama_cpp(args, target, drafter, kind, k))
                rows.append((kind, k, mine, llama))
    report(statistics.median(alone), rows, args)


def generate(pair: Pair, prompt: list[int], mode: str, k: int, max_tokens: int) -> tuple[float, float]:
    """(decoding tok/s, acceptance) of one greedy generation."""
    generation = pair.generate(prompt, draft_mode=mode, draft_max=k, max_tokens=max_tokens, seed=1)
    for _ in generation:
        pass
    stats = generation.stats
    return stats.tokens_per_second, stats.acceptance_rate


def llama_cpp(args: argparse.Namespace, target: Path, drafter: Path, kind: str, k: int) -> tuple[float, float]:
    """(decoding tok/s, acceptance) of llama.cpp's own loop on the same models and prompt, greedy."""
    command = [str(args.llama_bin / "llama-speculative-simple"), "-m", str(target), "-md", str(drafter),
               "--spec-type", SPEC_TYPE[kind], "--spec-draft-n-max", str(k), "-n", str(args.max_tokens),
               "-p", PROMPT, "--temp", "0", "-t", str(args.threads), "-td", str(args.threads), "-c", "1024"]
    tokens, seconds, drafted, accepted = llama_cpp_tool.run(command)
    return tokens / seconds, accepted / drafted if drafted else 0.0


def report(alone: float, rows: list, args: argparse.Namespace) -> None:
    print(f"llama {args.width} wide, {args.layers} layers, F32; EAGLE-3 head reading layers {LAYERS['eagle3']}, "
          f"DFlash block of {args.block} reading {LAYERS['dflash']}; {args.max_tokens} tokens greedy, "
          f"{args.threads} threads, medians of {args.repeat}")
    print(f"target alone (spec-cli, --no-draft): {alone:.1f} tok/s\n")
    print(f"{'drafter':>8} {'K':>3} {'spec-cli tok/s':>15} {'llama.cpp tok/s':>16} {'spec / llama':>13}"
          f" {'spec / alone':>13} {'acceptance spec':>16} {'llama.cpp':>10}")
    for kind, k, mine, llama in rows:
        ours, theirs = statistics.median(r[0] for r in mine), statistics.median(r[0] for r in llama)
        print(f"{kind:>8} {k:>3} {ours:>15.1f} {theirs:>16.1f} {ours / theirs:>12.2f}x {ours / alone:>12.2f}x"
              f" {statistics.median(r[1] for r in mine):>16.1%} {statistics.median(r[1] for r in llama):>10.1%}")


if __name__ == "__main__":
    main()
