"""Many short extraction prompts, side by side in one run: one `spec run` process each, `spec batch --parallel
1` and `--parallel 4` (the default drafting, and memory drafting alone); then drafting from memory against n-gram lookup alone on a held-back workload of
the same structure, and a second process started from the saved memory.

Part 1 (the shell): wall seconds of each way for the same prompts (models loaded in each `spec run` process, once
per batch), and whether every batch line's tokens are `spec run`'s, up to a float tie of the target alone (the
tie-aware rule of `decoding.ties`). The `spec run` processes share a fresh memory file, as a user's default does;
each batch starts with an empty memory.

Part 2 (memory): one process, the prompts one at a time, greedy, -k auto: tokens per second over the requests
after the first `--warm` in each drafting mode (n-gram lookup, memory, the hybrid default, the target alone),
each mode starting from an empty memory. Then the memory is saved and a new `spec run` process with `--memory`
answers one more prompt drafting from memory alone: what it drafted, and what the same process drafts without it.

    python benchmarks/batch_and_memory.py [--pair NAME | --target T.gguf --draft D.gguf] [-n 64] [--prompts 40]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from spec_cli import SamplingParams
from spec_cli.cli.options import LoadOptions, open_pair
from spec_cli.bench.ties import first_difference

NAMES = ["Alice", "Bob", "Chen", "Dana", "Emil", "Fatima", "Goran", "Hana", "Ivan", "Jia", "Kofi", "Lena", "Mateo",
         "Nora", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tara"]
CITIES = ["Paris", "Lagos", "Lima", "Oslo", "Pune", "Quito", "Seoul", "Tunis", "Vienna", "Zagreb"]
JOBS = ["nurse", "baker", "pilot", "teacher", "welder", "chemist", "lawyer", "farmer"]
MODES = ("ngram", "memory", "hybrid", "none")


def extraction_prompts(n: int, seed: int) -> list[str]:
    """Short extraction prompts of one structure (a person's record as JSON), different people each."""
    rng = random.Random(seed)
    return [f"Extract the person as JSON with keys name, age, city, job. Text: {rng.choice(NAMES)} is a "
            f"{rng.randint(19, 80)}-year-old {rng.choice(JOBS)} who lives in {rng.choice(CITIES)}."
            for _ in range(n)]


def spec(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "spec_cli", *args], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"spec {' '.join(args[:2])} … failed ({done.returncode}):\n{done.stderr}")
    return done


def shell_side(pair_args: list[str], prompts: list[str], n: int, folder: Path) -> dict:
    """Part 1: the three ways, timed, and the batch lines checked against the `spec run` texts."""
    source = folder / "prompts.txt"
    source.write_text("\n".join(prompts) + "\n")
    started = time.perf_counter()
    runs = [json.loads(spec("run", *pair_args, "-n", str(n), "--json", "--memory", str(folder / "runs.mem"),
                            prompt).stdout) for prompt in prompts]
    seconds = {"spec run processes": time.perf_counter() - started}
    batches = {}
    for mode, parallel in ((None, 1), (None, 4), ("memory", 1), ("memory", 4)):
        label = f"spec batch --parallel {parallel}" + (f" --draft-mode {mode}" if mode else "")
        output = folder / f"batch-{parallel}-{mode}.jsonl"
        started = time.perf_counter()
        spec("batch", str(source), *pair_args, "-n", str(n), "--parallel", str(parallel), "--token-ids", "-o",
             str(output), "-q", *(["--draft-mode", mode] if mode else []))
        seconds[label] = time.perf_counter() - started
        batches[label] = [json.loads(line) for line in output.read_text().splitlines()]
    same, ties, other = 0, 0, 0
    with open_pair(LoadOptions(**_load_fields(pair_args), quiet=True)) as loaded:
        target = loaded.pair.target
        for parallel, lines in batches.items():
            for prompt, run, line in zip(prompts, runs, lines):
                difference = first_difference(target, loaded.pair.prompt_tokens(prompt), line["token_ids"],
                                              run["token_ids"])
                same += difference is None
                ties += difference is not None and difference.tie
                other += difference is not None and not difference.tie
    return {"seconds": seconds, "identical_lines": same, "lines_parting_at_a_float_tie": ties,
            "lines_parting_otherwise": other}


def _load_fields(pair_args: list[str]) -> dict:
    fields = dict(zip(pair_args[::2], pair_args[1::2]))
    return {"pair": fields.get("--pair"), "target": Path(fields["--target"]) if "--target" in fields else None,
            "draft": Path(fields["--draft"]) if "--draft" in fields else None}


def memory_side(pair_args: list[str], prompts: list[str], held_out: str, n: int, warm: int, folder: Path) -> dict:
    """Part 2: tokens per second after the first `warm` requests by mode; then a new process from the saved memory."""
    rates, acceptance = {}, {}
    saved = folder / "workload.mem"
    with open_pair(LoadOptions(**_load_fields(pair_args), quiet=True)) as loaded:
        pair = loaded.pair
        for mode in MODES:
            pair.output_memory.forget()
            tokens = seconds = drafted = accepted = 0.0
            for i, prompt in enumerate(prompts):
                generation = pair.generate(prompt, sampling=SamplingParams(), max_tokens=n, draft_mode=mode,
                                           draft_max="auto")
                for _ in generation:
                    pass
                if i >= warm:
                    stats = generation.stats
                    tokens += stats.generated_tokens
                    seconds += stats.decode_s
                    drafted += stats.drafted
                    accepted += stats.accepted
            rates[mode] = tokens / seconds
            acceptance[mode] = accepted / drafted if drafted else None
            if mode == "memory":
                pair.output_memory.save(saved)
    first = {}
    for label, memory_flag in (("with the saved memory", ["--memory", str(saved)]), ("without", ["--no-memory"])):
        stats = json.loads(spec("run", *pair_args, "-n", str(n), "--json", "--draft-mode", "memory", *memory_flag,
                                held_out).stdout)["stats"]
        first[label] = {"drafted": stats["drafted"], "accepted": stats["accepted"],
                        "tokens_per_second": stats["tokens_per_second"]}
    return {"tokens_per_second_after_warm_up": rates, "acceptance": acceptance,
            "memory_over_ngram": rates["memory"] / rates["ngram"], "hybrid_over_none": rates["hybrid"] / rates["none"],
            "second_process_first_request": first}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair")
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("-n", type=int, default=64, help="tokens per answer")
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--warm", type=int, default=10, help="requests before the memory's rate is measured")
    args = parser.parse_args()
    pair_args = [flag for name in ("pair", "target", "draft") if getattr(args, name)
                 for flag in (f"--{name}", getattr(args, name))]
    with tempfile.TemporaryDirectory() as folder:
        shell = shell_side(pair_args, extraction_prompts(args.prompts, seed=0), args.n, Path(folder))
        memory = memory_side(pair_args, extraction_prompts(args.prompts, seed=1), extraction_prompts(1, seed=2)[0],
                             args.n, args.warm, Path(folder))
    seconds = shell["seconds"]
    ratios = {f"{way} over the spec run processes": seconds["spec run processes"] / seconds[way]
              for way in seconds if way != "spec run processes"}
    for suffix in ("", " --draft-mode memory"):
        ratios[f"--parallel 4 over --parallel 1{suffix}"] = (seconds[f"spec batch --parallel 1{suffix}"]
                                                           / seconds[f"spec batch --parallel 4{suffix}"])
    result = {"shell": {**shell, "speedups": ratios}, "memory": memory}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
