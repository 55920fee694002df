"""The host's work per verify row when several sequences share a pass, at a Qwen-size vocabulary.

N sequences at once, each drafting K (fixed) with a draft model, run through the scheduler as `spec serve
--parallel N` runs them; every step's wall time is split into the target's pass, the draft model's passes
and the rest: the host's work (laws, acceptance tests, residuals, draws, bookkeeping) for
the N × (K + 1) rows. Printed per row and as a share of a step, greedy and sampled side by side.

The pair is `sampled_overhead.py`'s: a 4-layer llama of width 256 over 151 936 tokens and a draft cut from it.
Its layers are small, so its steps are short and the host's share is as large as it gets; `--target/--draft`
measures any pair.

    python benchmarks/batched_host_work.py [-c 8] [-k 4] [-n 64] [--target T --draft D]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sampled_overhead import PROMPT, SETTINGS, generated_pair  # noqa: E402

from spec_cli import GenerationRequest, SamplingParams, load_pair  # noqa: E402
from spec_cli.decoding import scheduler as scheduling  # noqa: E402
from spec_cli.llama.context import Part  # noqa: E402
from spec_cli.llama.model import Model  # noqa: E402
from spec_cli.pair import Pair, Slot  # noqa: E402


class Clock:
    """Seconds spent in the scheduler's passes (the module's `decode_together`, wrapped): the target's, with
    the rows they returned, and the draft model's (its steps of all sequences, one pass a step)."""

    def __init__(self, target: Model) -> None:
        self.target = target
        self.pass_s = self.draft_s = 0.0
        self.rows = 0
        self._decode = scheduling.decode_together
        scheduling.decode_together = self._timed

    def _timed(self, parts: list[Part]) -> list[np.ndarray]:
        started = time.perf_counter()
        rows = self._decode(parts)
        if parts[0][0].model is self.target:
            self.pass_s += time.perf_counter() - started
            self.rows += sum(len(r) for r in rows)
        else:
            self.draft_s += time.perf_counter() - started
        return rows


def measure(pair: Pair, slots: list[Slot], sampling: SamplingParams, k: int, max_tokens: int,
            clock: Clock) -> dict[str, float]:
    """One batch of a generation on each slot, to the end: ms of host work per verify row, and its share."""
    concurrency = len(slots)
    prompts = [pair.prompt_tokens(f"{i}. {PROMPT}", raw=True) for i in range(concurrency)]
    scheduler = scheduling.Scheduler()
    generations = [slot.generate(tokens, GenerationRequest(sampling=sampling, seed=i, draft_max=k,
                                                           draft_mode="model", max_tokens=max_tokens))
                   for i, (slot, tokens) in enumerate(zip(slots, prompts))]
    for generation in generations:
        scheduler.join(generation)
    while any(generation.token_ids == [] for generation in generations):  # the prompts first: not measured
        scheduler.step()
    clock.pass_s, clock.draft_s, clock.rows = 0.0, 0.0, 0
    started = time.perf_counter()
    while len(scheduler):
        scheduler.step()
    wall = time.perf_counter() - started
    host = wall - clock.pass_s - clock.draft_s
    return {"host ms/row": 1000 * host / clock.rows, "host share": host / wall,
            "rows/step": clock.rows / max(1, sum(g.stats.rounds for g in generations) / concurrency),
            "tok/s": sum(len(g.token_ids) for g in generations) / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-c", "--concurrency", type=int, default=8)
    parser.add_argument("-k", "--draft-max", type=int, default=4)
    parser.add_argument("-n", "--max-tokens", type=int, default=64)
    parser.add_argument("-r", "--repeat", type=int, default=3)
    parser.add_argument("--target", type=Path)
    parser.add_argument("--draft", type=Path)
    args = parser.parse_args()
    if args.target is None:
        args.target, args.draft = generated_pair(Path(tempfile.gettempdir()) / "spec-cli-bench")
    with load_pair(args.target, args.draft) as pair:
        clock = Clock(pair.target)
        slots = pair.slots(args.concurrency)
        print(f"{args.concurrency} sequences at once, K = {args.draft_max}, {args.max_tokens} tokens each, "
              f"vocabulary {pair.target.n_vocab}; median of {args.repeat}")
        print(f"{'sampling':58} {'host ms/row':>11} {'host share':>10} {'rows/step':>9} {'tok/s':>7}")
        for name, sampling in SETTINGS.items():
            runs = [measure(pair, slots, sampling, args.draft_max, args.max_tokens, clock)
                    for _ in range(args.repeat)]
            m = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
            print(f"{name:58} {m['host ms/row']:11.3f} {m['host share']:10.1%} {m['rows/step']:9.1f} "
                  f"{m['tok/s']:7.1f}")


if __name__ == "__main__":
    main()
