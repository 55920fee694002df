"""What decoding costs outside llama.cpp, greedy and sampled, at a Qwen-size vocabulary: per round and as a share
of the decode time, with and without a draft, side by side in one run.

The pair is generated once (the test suite's GGUF writer): a 4-layer llama of width 256 over 151 936 tokens,
Qwen's vocabulary size, and a draft cut from it (its first 2 layers, the same embeddings and output). Small
layers keep llama.cpp's share small, so the host's work per round shows: softmaxes, filters, acceptance tests
and residuals over the vocabulary. `--target/--draft` runs the same table on any pair (the demo pair's files
are listed by `spec models show smollm2-demo` once `spec models pull smollm2-demo` has derived its target).
Each row is the median of `-r` interleaved generations of `-n` tokens from one prompt, with fixed seeds.
`--before REF` measures spec-cli as of a git revision too (its `spec_cli/` in a child process, the same models
and settings) and prints both side by side:

    python benchmarks/sampled_overhead.py [-n 200] [-k 5] [-r 3] [--before 62c69e2] [--target T --draft D]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support.tiny_models import write_model  # noqa: E402  (the test suite's GGUF writer)

from spec_cli import Pair, SamplingParams, load_pair  # noqa: E402

QWEN_VOCAB = 151_936
PROMPT = "The quick brown fox jumps over the lazy dog. " * 4
SETTINGS = {
    "greedy": SamplingParams(),
    "T 0.8, top-k 40, top-p 0.95, min-p 0.05 (chat defaults)": SamplingParams(temperature=0.8),
    "T 1, top-k 0, top-p 1, min-p 0": SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
}


def generated_pair(folder: Path) -> tuple[Path, Path]:
    """The target and its cut draft, written once."""
    folder.mkdir(parents=True, exist_ok=True)
    target, draft = folder / "qwen-vocab-4l.gguf", folder / "qwen-vocab-2l.gguf"
    for path, kept in ((target, None), (draft, 2)):
        if not path.exists():
            write_model(path, seed=1, vocab_size=QWEN_VOCAB, n_embd=256, n_layer=4, kept_layers=kept)
    return target, draft


def run(pair: Pair, sampling: SamplingParams, k: int, max_tokens: int, seed: int) -> dict[str, float]:
    generation = pair.generate(PROMPT, sampling=sampling, seed=seed, max_tokens=max_tokens, raw=True,
                               draft_max=k, draft_mode="model" if k else "none")
    for _ in generation:
        pass
    stats = generation.stats
    return {"tok/s": stats.tokens_per_second, "share": stats.overhead_s / stats.decode_s,
            "ms/round": 1000 * stats.overhead_s / stats.rounds, "tokens/round": stats.generated_tokens / stats.rounds}


Runs = list[list[dict[str, float]]]  # per configuration, one dict of figures per run


def measure(target: Path, draft: Path, args: argparse.Namespace, seeds: range) -> Runs:
    """Every configuration once per seed, interleaved."""
    configs = [(sampling, k) for sampling in SETTINGS.values() for k in (0, args.draft_max)]
    with load_pair(target, draft, n_threads=args.threads) as pair:
        run(pair, SETTINGS["greedy"], args.draft_max, 16, 0)  # warm-up: weights into memory
        runs: Runs = [[] for _ in configs]
        for seed in seeds:
            for i, (sampling, k) in enumerate(configs):
                runs[i].append(run(pair, sampling, k, args.max_tokens, seed))
    return runs


def measure_in_child(code: Path, seed: int, target: Path, draft: Path, args: argparse.Namespace) -> Runs:
    """One seed's runs in a child process that imports spec_cli from `code`."""
    command = [sys.executable, __file__, "--child-seed", str(seed), "--target", str(target), "--draft", str(draft),
               "-n", str(args.max_tokens), "-k", str(args.draft_max)]
    if args.threads is not None:
        command += ["--threads", str(args.threads)]
    child = subprocess.run(command, env={**os.environ, "PYTHONPATH": str(code)}, capture_output=True, text=True,
                           check=True)
    return json.loads(child.stdout.splitlines()[-1])


def before_and_after(ref: str, target: Path, draft: Path, args: argparse.Namespace) -> tuple[Runs, Runs]:
    """The runs with spec_cli/ as of git `ref` and with this tree's, in child processes taking turns per seed,
    so that both sides load alike and drift hits both."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "spec_cli"], capture_output=True, check=True)
    with tempfile.TemporaryDirectory() as folder:
        tarfile.open(fileobj=io.BytesIO(archive.stdout)).extractall(folder, filter="data")
        sides: dict[Path, Runs] = {Path(folder): [], ROOT: []}
        for seed in range(args.repeat):
            for code, runs in sides.items():
                got = measure_in_child(code, seed, target, draft, args)
                sides[code] = [old + new for old, new in zip(runs, got)] if runs else got
        return sides[Path(folder)], sides[ROOT]


def medians(runs: Runs) -> list[dict[str, float]]:
    return [{key: statistics.median(r[key] for r in config_runs) for key in config_runs[0]} for config_runs in runs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/spec-sampled"), help="where the generated pair goes")
    parser.add_argument("--target", type=Path, help="another target GGUF (with --draft)")
    parser.add_argument("--draft", type=Path, help="its draft GGUF")
    parser.add_argument("-n", "--max-tokens", type=int, default=200)
    parser.add_argument("-k", "--draft-max", type=int, default=5)
    parser.add_argument("-r", "--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: its own choice)")
    parser.add_argument("--before", metavar="REF", help="also measure spec-cli as of this git revision")
    parser.add_argument("--child-seed", type=int, help=argparse.SUPPRESS)  # a child of --before: one seed, as JSON
    args = parser.parse_args()
    target, draft = (args.target, args.draft) if args.target else generated_pair(args.dir)
    if args.child_seed is not None:
        print(json.dumps(measure(target, draft, args, range(args.child_seed, args.child_seed + 1))))
        return
    if args.before:
        before_runs, after_runs = before_and_after(args.before, target, draft, args)
        before, after = medians(before_runs), medians(after_runs)
    else:
        before, after = None, medians(measure(target, draft, args, range(args.repeat)))
    names = [(name, k) for name in SETTINGS for k in (0, args.draft_max)]
    print(f"{target.name} ← {draft.name}: {args.max_tokens} tokens per run, median of {args.repeat}"
          + (f"; {args.before} → this tree" if before else ""))
    columns = ("host ms/round", "outside llama.cpp", "tok/s", "tokens/round")
    forms = {"ms/round": "{:.2f}", "share": "{:.1%}", "tok/s": "{:.1f}", "tokens/round": "{:.2f}"}
    print("| sampling | K | " + " | ".join(columns) + " |")
    print("|" + " --- |" * (2 + len(columns)))
    for i, (name, k) in enumerate(names):
        cells = [" → ".join(form.format(m[i][key]) for m in ((before, after) if before else (after,)))
                 for key, form in forms.items()]
        print(f"| {name} | {k or 'no draft'} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
