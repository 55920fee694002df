"""An agent's first request against `spec serve`: a system prompt of 6–8k tokens with tool schemas, then a short user
turn, as coding agents send (opencode's first request is ~7.5k tokens). Time to first token and total time with the
default drafting beside `--draft-mode none`, alone and with a second client's short request at once.

Both servers run side by side (`--parallel 2`, `--no-memory`), each in its own process, and the requests alternate
between them, `-r` times after one uncounted warm-up each. Every agent request starts with a new line of its own, so
no slot's cache holds its prompt, and asks its own question (as does every second client), so that no answer is
drafted from the memory of an earlier one: each is a first encounter. Medians are printed.

    python benchmarks/agent_prompt.py [--pair NAME | --target T.gguf --draft D.gguf] [--ctx 8192] [-n 96] [-r 3]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_overhead import served_url  # noqa: E402

TASKS = ["List the files in the src folder, then open the one that defines the command line.",
         "Find where the configuration file is read and explain what happens when it is missing.",
         "Rename the function parse_args to read_arguments everywhere and run the tests.",
         "Why does the build fail on Windows? Look at the last log first.",
         "Write a unit test for the retry helper in the network module.",
         "Show me the three largest files in the repository and what each one does.",
         "Add a --verbose flag to the command line and print the settings it reads.",
         "Check whether any function in utils is unused and remove it if so.",
         "Summarise what changed in the last commit and whether it needs a changelog entry.",
         "Search for TODO comments and turn the oldest one into an issue note."]
SHORT = ["Say hello in five words.", "Name three colours.", "Count from one to five.", "Give me a fruit.",
         "What is two plus two?", "Name a planet.", "Say goodbye politely.", "Name a month.", "Spell cat.",
         "Name an animal."]


def tools(n: int) -> list[dict]:
    """`n` function tools with the descriptions and JSON schemas an agent sends (~200 tokens each)."""
    verbs = ["read", "write", "list", "search", "run", "edit", "fetch", "move", "delete", "format", "test", "build"]
    things = ["file", "folder", "symbol", "command", "patch", "page", "branch", "issue", "note", "log", "test", "task"]
    made = []
    for i in range(n):
        verb, thing = verbs[i % len(verbs)], things[(i * 5) % len(things)]
        made.append({"type": "function", "function": {
            "name": f"{verb}_{thing}_{i}",
            "description": (f"Use this tool to {verb} a {thing} in the user's workspace. It {verb}s the {thing} "
                            f"named by the arguments and returns what happened as plain text. Call it only when "
                            f"the user asked for it or when the task cannot go on without it; never to {verb} a "
                            f"{thing} outside the workspace. Paths are relative to the workspace root."),
            "parameters": {"type": "object", "properties": {
                "path": {"type": "string", "description": f"the {thing}'s path, relative to the workspace root"},
                "pattern": {"type": "string", "description": "a glob or a regular expression to match"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "description": "how many at most"},
                "dry_run": {"type": "boolean", "description": f"say what would {verb}, change nothing"},
            }, "required": ["path"]}}})
    return made


def system(nonce: int) -> str:
    rules = "\n".join(f"{i + 1}. Keep your answers short, cite the file and line you rely on, and never guess a "
                      f"path: look it up first (rule {i + 1} of the workspace)." for i in range(60))
    return f"Session {nonce}. You are a coding agent working in the user's repository.\n{rules}"


def ask(client: openai.OpenAI, model: str, messages: list[dict], max_tokens: int, with_tools: list[dict] | None,
        barrier: threading.Barrier | None = None) -> tuple[float, float, int]:
    """One greedy streamed chat answer: (seconds to its first token, seconds in all, tokens)."""
    if barrier is not None:
        barrier.wait()
    started = time.perf_counter()
    first, tokens = None, 0
    stream = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=max_tokens,
                                            stream=True, stream_options={"include_usage": True},
                                            **({"tools": with_tools} if with_tools else {}))
    for chunk in stream:
        delta = chunk.choices[0].delta if chunk.choices else None
        if first is None and delta is not None and (delta.content or delta.tool_calls):
            first = time.perf_counter() - started
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    total = time.perf_counter() - started
    return first if first is not None else total, total, tokens


def agent(client: openai.OpenAI, model: str, nonce: int, n_tools: int, max_tokens: int,
          barrier: threading.Barrier | None = None) -> tuple[float, float, int]:
    messages = [{"role": "system", "content": system(nonce)},
                {"role": "user", "content": TASKS[nonce % len(TASKS)]}]
    return ask(client, model, messages, max_tokens, tools(n_tools), barrier)


def with_second(client: openai.OpenAI, model: str, nonce: int, n_tools: int, max_tokens: int) -> tuple[tuple, tuple]:
    """The agent's request and a short one from a second client, sent at once."""
    barrier, short = threading.Barrier(2), []
    second = threading.Thread(target=lambda: short.append(
        ask(client, model, [{"role": "user", "content": SHORT[nonce % len(SHORT)]}], 16, None, barrier)))
    second.start()
    long = agent(client, model, nonce, n_tools, max_tokens, barrier)
    second.join()
    return long, short[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", help="a registry pair (default: the registry's default)")
    parser.add_argument("--target", type=Path, help="target GGUF (with --draft)")
    parser.add_argument("--draft", type=Path, help="draft GGUF")
    parser.add_argument("--ctx", type=int, default=8192)
    parser.add_argument("--tools", type=int, default=26,
                        help="tool schemas in the prompt (26: ~7.6k tokens on the demo pair)")
    parser.add_argument("-n", "--max-tokens", type=int, default=96)
    parser.add_argument("-r", "--repeat", type=int, default=3)
    args = parser.parse_args()
    files = (["--target", str(args.target), "--draft", str(args.draft)] if args.target else
             (["--pair", args.pair] if args.pair else []))
    modes = {"default": [], "none": ["--draft-mode", "none"]}
    servers = {name: subprocess.Popen([sys.executable, "-m", "spec_cli", "serve", *files, *flags, "--ctx",
                                       str(args.ctx), "--parallel", "2", "--no-memory", "--port", "0", "--quiet"],
                                      stderr=subprocess.PIPE, text=True) for name, flags in modes.items()}
    try:
        clients = {name: openai.OpenAI(base_url=served_url(server), api_key="unused", timeout=900, max_retries=0)
                   for name, server in servers.items()}
        models = {name: client.models.list().data[0].id for name, client in clients.items()}
        rows: dict[str, list[dict[str, float]]] = {name: [] for name in modes}
        nonce = 0
        for repeat in range(args.repeat + 1):  # the first round warms up, uncounted
            for name, client in clients.items():
                nonce += 1
                alone = agent(client, models[name], nonce, args.tools, args.max_tokens)
                nonce += 1
                (long, short) = with_second(client, models[name], nonce, args.tools, args.max_tokens)
                if repeat:
                    rows[name].append({"ttft": alone[0], "total": alone[1], "tokens": alone[2],
                                       "ttft2": long[0], "total2": long[1], "short_ttft": short[0],
                                       "short_total": short[1]})
    finally:
        for server in servers.values():
            server.terminate()
            server.wait(30)
    report(rows, args)


def report(rows: dict[str, list[dict[str, float]]], args: argparse.Namespace) -> None:
    def median(name: str, key: str) -> float:
        return statistics.median(row[key] for row in rows[name])

    print(f"agent prompt with {args.tools} tools, {args.max_tokens} tokens at most, greedy; median of {args.repeat}")
    print(f"{'':34}{'default':>10}{'none':>10}{'default/none':>14}")
    for key, label in (("ttft", "alone: first token, s"), ("total", "alone: total, s"),
                       ("ttft2", "with a 2nd client: first token, s"), ("total2", "with a 2nd client: total, s"),
                       ("short_ttft", "the 2nd client: first token, s"), ("short_total", "the 2nd client: total, s")):
        mine, plain = median("default", key), median("none", key)
        print(f"{label:34}{mine:10.2f}{plain:10.2f}{mine / plain:14.2f}")
    print(f"tokens answered (alone): default {median('default', 'tokens'):.0f}, none {median('none', 'tokens'):.0f}")


if __name__ == "__main__":
    main()
