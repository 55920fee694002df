"""What choosing each round costs the host: `plan_s` (the K controller, the default drafting's choice of way, the
batch's choice of K under the scheduler) per sequence per round, for the default drafting alone (`Pair.generate`)
and under the scheduler at 1, 2 and 4 sequences, beside the decode time it is part of. The budget is 50 µs per
sequence per round.

Beside the default alone, the least choice there is: one way pinned (`--one-way`, the memory by default) under `-k
auto`, whose planner weighs only that way's K. On a CPU the choice runs right after a decode that streamed the
model's weights through every cache, so its Python runs with the caches cold (on an Intel Xeon the one-way choice,
made again at once, took ~40% of its first run: 30 µs against 70): the one-way row is the floor those cold caches
put under any choice on the machine measured.

Every run starts from an empty memory of earlier outputs (each prompt is a first encounter); the cost book is
this machine's, as a user's would be.

    python benchmarks/planning.py [--pair NAME | --target T.gguf --draft D.gguf] [-n 96] [--levels 1,2,4]
                                  [--one-way memory]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from spec_cli import SamplingParams
from spec_cli.cli.options import LoadOptions, open_pair
from spec_cli.bench.concurrency import Batch, run_batch
from spec_cli.decoding.scheduler import Scheduler
from spec_cli.decoding.stats import Stats
from spec_cli.llama import kernels
from spec_cli.pair import Pair
from spec_cli.request import AUTO, GenerationRequest

PROMPTS = ["Rewrite this function with type hints: def add(a, b):\n    return a + b\n\ndef sub(a, b):\n"
           "    return a - b",
           "Write a short story about a lighthouse keeper.",
           "List the planets of the solar system, one per line, each with one fact.",
           "Explain what a hash map is to a new programmer."]


def alone(pair: Pair, prompts: list[list[int]], request: GenerationRequest) -> Stats:
    """Every prompt generated alone (`Pair.generate`), each from an empty memory of earlier outputs."""
    totals = Stats(draft_max=0)
    for tokens in prompts:
        pair.output_memory.forget()
        generation = pair.generate(tokens, request)
        for _ in generation:
            pass
        totals.merge(generation.stats)
    return totals


def figures(stats: Stats) -> dict[str, float]:
    """Planning seconds per sequence per round, and as a share of the decode time."""
    return {"rounds": stats.rounds, "plan_us_per_round": 1e6 * stats.plan_s / max(1, stats.rounds),
            "plan_share_of_decode": stats.plan_s / stats.decode_s if stats.decode_s else 0.0,
            "tokens_per_second": stats.tokens_per_second}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair")
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("-n", type=int, default=96, help="tokens per answer")
    parser.add_argument("--levels", default="1,2,4", help="sequences at once under the scheduler")
    parser.add_argument("--one-way", default="memory", help="the drafting mode pinned for the one-way row")
    args = parser.parse_args()
    levels = [int(level) for level in args.levels.split(",")]
    request = GenerationRequest(sampling=SamplingParams(), max_tokens=args.n, draft_max=AUTO)  # as `spec run`
    report: dict[str, object] = {"cpu": kernels.cpu_name()}
    paths = {"target": Path(args.target) if args.target else None, "draft": Path(args.draft) if args.draft else None}
    with open_pair(LoadOptions(pair=args.pair, quiet=True, **paths)) as loaded:
        pair = loaded.pair
        prompts = [pair.prompt_tokens(prompt, raw=not pair.has_chat_template) for prompt in PROMPTS]
        report["alone"] = figures(alone(pair, prompts, request))
        one_way = dataclasses.replace(request, draft_mode=args.one_way)
        report[f"alone, {args.one_way} only"] = figures(alone(pair, prompts, one_way))
        for level in levels:
            batch = Batch(level, True)
            slots, scheduler = pair.slots(level), Scheduler()
            run_batch(scheduler, slots, prompts, [request] * len(prompts), batch)  # `level` clients, back to back
            report[f"scheduler at {level}"] = figures(batch.totals)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
