"""N `openai` clients against `spec serve --parallel N`: at once, and the same N requests one at a time, side by
side in one run, with each answer checked against the lone-run greedy text.

The server runs in its own process with its defaults for several at once (K by the batch's goodput unless -k
is given); the clients are threads of this process. The lone-run texts are made here the way `spec run` makes
them (`Pair.generate`, greedy, the chat template, the pair's K). The two sides alternate `-r` times, after one
uncounted warm-up of each; figures are every answer's tokens over the wall time of the side's requests.

    python benchmarks/parallel_clients.py [--pair NAME | --target T.gguf --draft D.gguf] [-c 4] [-n 96] [-r 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_overhead import served_url  # noqa: E402

from spec_cli import SamplingParams  # noqa: E402
from spec_cli.bench.speedup import builtin_prompts  # noqa: E402
from spec_cli.cli.options import LoadOptions, open_pair  # noqa: E402


def ask(client: openai.OpenAI, model: str, prompt: str, max_tokens: int,
        barrier: threading.Barrier | None = None) -> tuple[str, int, float]:
    """One greedy chat answer: its text, tokens, and the batch size its rounds ran in."""
    if barrier is not None:
        barrier.wait()
    answer = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                            temperature=0, max_tokens=max_tokens)
    return (answer.choices[0].message.content, answer.usage.completion_tokens,
            answer.model_extra["speculation"]["batch_size"])


def one_at_a_time(client: openai.OpenAI, model: str, prompts: list[str], max_tokens: int) -> tuple[float, list]:
    started = time.perf_counter()
    answers = [ask(client, model, prompt, max_tokens) for prompt in prompts]
    return time.perf_counter() - started, answers


def at_once(client: openai.OpenAI, model: str, prompts: list[str], max_tokens: int) -> tuple[float, list]:
    barrier = threading.Barrier(len(prompts))
    with ThreadPoolExecutor(len(prompts)) as clients:
        started = time.perf_counter()
        answers = list(clients.map(lambda p: ask(client, model, p, max_tokens, barrier), prompts))
    return time.perf_counter() - started, answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", help="a registry pair (default: the registry's default)")
    parser.add_argument("--target", type=Path, help="target GGUF (with --draft)")
    parser.add_argument("--draft", type=Path, help="draft GGUF")
    parser.add_argument("-c", "--clients", type=int, default=4)
    parser.add_argument("-n", "--max-tokens", type=int, default=96)
    parser.add_argument("-r", "--repeat", type=int, default=3)
    parser.add_argument("-k", "--draft-max", help="the server's K (default: auto, K by the batch's goodput)")
    args = parser.parse_args()
    files = (["--target", str(args.target), "--draft", str(args.draft)] if args.target else
             (["--pair", args.pair] if args.pair else []))
    pool = builtin_prompts("mixed")
    prompts = [pool[i % len(pool)] for i in range(args.clients)]
    with open_pair(LoadOptions(args.target, args.draft, args.pair, quiet=True)) as loaded:
        lone = [loaded.pair.generate(p, sampling=SamplingParams(), draft_max=loaded.draft_max,
                                     max_tokens=args.max_tokens) for p in prompts]
        for generation in lone:
            for _event in generation:
                pass
        expected = [generation.text for generation in lone]
    command = [sys.executable, "-m", "spec_cli", "serve", *files, "--parallel", str(args.clients), "--port", "0",
               "--quiet", *(["-k", args.draft_max] if args.draft_max else [])]
    serving = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        client = openai.OpenAI(base_url=served_url(serving), api_key="unused", timeout=600, max_retries=0)
        model = client.models.list().data[0].id
        sides = {"one at a time": one_at_a_time, "at once": at_once}
        for side in sides.values():  # warm-up, not counted
            side(client, model, prompts, args.max_tokens)
        rates: dict[str, list[float]] = {name: [] for name in sides}
        same, batches = 0, []
        for _ in range(args.repeat):
            for name, side in sides.items():
                seconds, answers = side(client, model, prompts, args.max_tokens)
                rates[name].append(sum(tokens for _, tokens, _ in answers) / seconds)
                if name == "at once":
                    same += sum(text == lone_text for (text, _, _), lone_text in zip(answers, expected))
                    batches += [batch for _, _, batch in answers]
    finally:
        serving.terminate()
        serving.wait(30)
    alone, together = statistics.median(rates["one at a time"]), statistics.median(rates["at once"])
    print(f"{args.clients} clients, {args.max_tokens} tokens at most, greedy; median of {args.repeat}")
    print(f"{'':28}{'tok/s (all clients)':>20}")
    print(f"{'one at a time':28}{alone:20.1f}")
    print(f"{'at once':28}{together:20.1f}")
    print(f"at once / one at a time: {together / alone:.2f}x; mean batch size at once "
          f"{statistics.mean(batches):.2f}")
    print(f"answers at once equal to the lone spec-run text: {same}/{args.clients * args.repeat}")


if __name__ == "__main__":
    main()
