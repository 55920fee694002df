"""What `spec serve` costs over `spec run`: the same prompts, greedy, streamed through the server to one
`openai` client and generated the way `spec run` does, interleaved, side by side in one run.

The server runs in its own process (`spec serve`), the client in this one. The `spec run` side is this
process too: the same pair, loaded the way `spec run` loads it, generating through `Pair.generate`, as `spec
run` does. Both are warmed with one generation first: a fresh `spec run` process spends its first generation
on weights not yet in memory, which would flatter the server. The figures are tokens over end-to-end
seconds (the client's, from sending the request to `[DONE]`; spec run's, from tokenizing the prompt to the last
token) and the decode rate each side reports. The prompts take turns, so both sides' caches only ever share
the chat template's opening with the next prompt; both sides must write the same text.

    python benchmarks/serve_overhead.py [--pair NAME | --target T.gguf --draft D.gguf] [-n 128] [-r 3] [-k K]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai

from spec_cli import Pair, SamplingParams
from spec_cli.bench.speedup import builtin_prompts
from spec_cli.cli.options import LoadOptions, open_pair
from spec_cli.request import draft_max_from_text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", help="a registry pair (default: the registry's default)")
    parser.add_argument("--target", type=Path, help="target GGUF (with --draft)")
    parser.add_argument("--draft", type=Path, help="draft GGUF")
    parser.add_argument("-n", "--max-tokens", type=int, default=128)
    parser.add_argument("-r", "--repeat", type=int, default=3, help="runs of each prompt on each side")
    parser.add_argument("-k", "--draft-max", help="K for both sides (default: the pair's)")
    args = parser.parse_args()
    files = (["--target", str(args.target), "--draft", str(args.draft)] if args.target else
             (["--pair", args.pair] if args.pair else []))
    k = draft_max_from_text(args.draft_max) if args.draft_max else None
    prompts = builtin_prompts("chat")
    options = LoadOptions(args.target, args.draft, args.pair, quiet=True, max_draft=k if isinstance(k, int) else 0)
    with open_pair(options) as loaded:
        k = loaded.draft_max if k is None else k
        serving = subprocess.Popen([sys.executable, "-m", "spec_cli", "serve", *files, "-k", str(k), "--port", "0",
                                    "--quiet"], stderr=subprocess.PIPE, text=True)
        try:
            client = openai.OpenAI(base_url=served_url(serving), api_key="unused", timeout=600)
            model = client.models.list().data[0].id
            for side in (served, ran):  # warm-up, not counted
                side(client, model, loaded.pair, k, prompts[-1], args.max_tokens)
            rows = [measure(client, model, loaded.pair, k, prompt, args.max_tokens)
                    for _ in range(args.repeat) for prompt in prompts]
        finally:
            serving.terminate()
            serving.wait(30)
    report(rows, args.max_tokens, k)


def served_url(serving: subprocess.Popen) -> str:
    """The URL `spec serve` prints once it listens (notes, such as deriving the demo target, may come first);
    its stderr is drained from then on, so the pipe never fills."""
    seen = []
    for line in serving.stderr:
        if line.startswith("spec: serving "):
            threading.Thread(target=serving.stderr.read, daemon=True).start()
            return line.split(" on ")[1].split()[0]
        seen.append(line)
    sys.exit(f"spec serve did not start:\n{''.join(seen)}")


def served(client: openai.OpenAI, model: str, _pair: Pair, _k: int | str, prompt: str, max_tokens: int) -> dict:
    """One streamed generation through the server: text, tokens, end-to-end seconds, decode tok/s, cache use."""
    started = time.perf_counter()
    chunks = list(client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                                 temperature=0, max_tokens=max_tokens, stream=True,
                                                 stream_options={"include_usage": True}))
    seconds = time.perf_counter() - started
    speculation = [c.model_extra["speculation"] for c in chunks if c.choices and c.choices[0].finish_reason][0]
    usage = chunks[-1].usage
    return {"text": "".join(c.choices[0].delta.content or "" for c in chunks if c.choices),
            "tokens": usage.completion_tokens, "seconds": seconds, "decode": speculation["tokens_per_second"],
            "cached": usage.prompt_tokens_details.cached_tokens}


def ran(_client: openai.OpenAI, _model: str, pair: Pair, k: int | str, prompt: str, max_tokens: int) -> dict:
    """One generation as `spec run` makes it (greedy, the chat template, the pair's K), in this process."""
    started = time.perf_counter()
    generation = pair.generate(prompt, sampling=SamplingParams(), draft_max=k, max_tokens=max_tokens)
    for _event in generation:
        pass
    stats = generation.stats
    return {"text": generation.text, "tokens": stats.generated_tokens, "seconds": time.perf_counter() - started,
            "decode": stats.tokens_per_second, "cached": stats.prompt_cached}


def measure(client: openai.OpenAI, model: str, pair: Pair, k: int | str, prompt: str, max_tokens: int) -> dict:
    return {"serve": served(client, model, pair, k, prompt, max_tokens),
            "run": ran(client, model, pair, k, prompt, max_tokens)}


def report(rows: list[dict], max_tokens: int, k: int | str) -> None:
    def median(side: str, key: str, per: str | None = None) -> float:
        return statistics.median(r[side][key] / r[side][per] if per else r[side][key] for r in rows)

    serve, run = median("serve", "tokens", "seconds"), median("run", "tokens", "seconds")
    serve_decode, run_decode = median("serve", "decode"), median("run", "decode")
    same = sum(r["serve"]["text"] == r["run"]["text"] for r in rows)
    print(f"{len(rows)} generations a side, K={k}, {max_tokens} tokens at most, greedy; medians")
    print(f"{'':24}{'spec run':>12}{'spec serve':>12}{'serve / run':>14}")
    print(f"{'end to end, tok/s':24}{run:12.1f}{serve:12.1f}{serve / run:14.3f}")
    print(f"{'decoding, tok/s':24}{run_decode:12.1f}{serve_decode:12.1f}{serve_decode / run_decode:14.3f}")
    print(f"server overhead, end to end: {100 * (1 - serve / run):.1f}%; decoding: "
          f"{100 * (1 - serve_decode / run_decode):.1f}%")
    print(f"same text on both sides: {same}/{len(rows)}; prompt tokens reused from the cache, median: "
          f"spec run {median('run', 'cached'):.0f}, spec serve {median('serve', 'cached'):.0f}")


if __name__ == "__main__":
    main()
