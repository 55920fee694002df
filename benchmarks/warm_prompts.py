"""A second agent call with the same long system prompt and tools list, on another slot: what its prompt costs
against the first call's, with `spec serve --cache-ram` on and off, side by side in one run.

The server runs in its own process (`--parallel 2`). Each side: call A (cold: the whole prompt is prefilled)
on one slot; a streamed undrafted call that shares the prefix holds that slot; call B (the same system prompt and tools,
another question) lands on the other slot. Each call asks for one token, so its time is its prompt's. Figures
are the median over `-r` repetitions of B's seconds over A's, and B's cached prompt tokens.

    python benchmarks/warm_prompts.py [--pair NAME | --target T.gguf --draft D.gguf] [--tokens 4000] [-r 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_overhead import served_url  # noqa: E402

TOOLS = [{"type": "function", "function": {
    "name": f"tool_{i}", "description": f"Tool number {i}: reads, edits or searches the project's files.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "query": {"type": "string"}},
                   "required": ["path"]}}} for i in range(12)]


def system_prompt(tokens: int, session: int) -> str:
    """An agent's instructions, about `tokens` tokens with the tools list, opened by a session number so that no
    earlier repetition holds any of it."""
    rules = [f"Rule {i}: read the file before you edit it, keep changes small and say what you changed."
             for i in range(max(tokens - 1400, 0) // 18 + 1)]
    return f"Session {session}. You are a coding agent working in a repository.\n" + "\n".join(rules)


def call(client: openai.OpenAI, model: str, system: str, question: str) -> tuple[float, int, int]:
    """One call asking for one token: (seconds, prompt tokens, cached prompt tokens)."""
    started = time.perf_counter()
    answer = client.chat.completions.create(model=model, tools=TOOLS, max_tokens=1, temperature=0, messages=[
        {"role": "system", "content": system}, {"role": "user", "content": question}])
    seconds = time.perf_counter() - started
    return seconds, answer.usage.prompt_tokens, answer.usage.prompt_tokens_details.cached_tokens


def side(pair_args: list[str], cache_ram: str, words: int, repeats: int, ctx: int) -> dict:
    serving = subprocess.Popen([sys.executable, "-m", "spec_cli", "serve", *pair_args, "--port", "0", "--parallel",
                                "2", "--ctx", str(ctx), "--cache-ram", cache_ram, "-q"],
                               stderr=subprocess.PIPE, text=True)
    try:
        client = openai.OpenAI(base_url=served_url(serving), api_key="unused", timeout=600, max_retries=0)
        model = client.models.list().data[0].id
        ratios, cached, prompt = [], [], 0
        for repeat in range(repeats):
            system = system_prompt(words, repeat)
            first, prompt, _ = call(client, model, system, "List the files.")
            holding = client.chat.completions.create(  # undrafted: its steps cost the second call little
                model=model, tools=TOOLS, max_tokens=400, temperature=0, stream=True, extra_body={"draft_mode": "none"},
                messages=[{"role": "system", "content": system}, {"role": "user", "content": "Explain."}])
            next(iter(holding))
            second, _, reused = call(client, model, system, "Open the README.")
            holding.close()
            ratios.append(second / first)
            cached.append(reused)
        return {"cache_ram": cache_ram, "prompt_tokens": prompt, "second_over_first": statistics.median(ratios),
                "second_cached_tokens": statistics.median(cached)}
    finally:
        serving.terminate()
        serving.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair")
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--tokens", type=int, default=4000, help="about how long the shared prompt is")
    parser.add_argument("-r", "--repeats", type=int, default=3)
    args = parser.parse_args()
    pair_args = ([args.pair] if args.pair else []) + (["--target", args.target] if args.target else []) + \
        (["--draft", args.draft] if args.draft else [])
    ctx = 2 * args.tokens + 1024
    results = [side(pair_args, cache_ram, args.tokens, args.repeats, ctx) for cache_ram in ("1GiB", "0")]
    for result in results:
        print(f"--cache-ram {result['cache_ram']:>4}: a {result['prompt_tokens']}-token prompt; the second call "
              f"on another slot took {result['second_over_first']:.1%} of the first's time "
              f"({result['second_cached_tokens']:.0f} prompt tokens cached)")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
