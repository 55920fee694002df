"""Whether large constraints stall anyone else: one client streams an answer from `spec serve` while others
send a 20 000-value enum, a 900-property schema and a 60 000-value enum, and /health is asked every 50 ms.

The server runs in its own process (the demo pair by default, its defaults for several clients). The stream
does not draft, so each chunk is a token and a step of the server. Its gaps between chunks and /health's
answer times are reported for three runs side by side: quiet; with the same three requests under small
schemas (what any three newcomers cost the stream: their prompts ride along in its steps); and with the large
schemas, whose compiling is what this measures. The goal: while they compile (from their sending until the
first joins the batch), the stream's longest gap and /health's slowest answer both under 100 ms.

    python benchmarks/compile_isolation.py [--pair NAME | --target T.gguf --draft D.gguf] [-n 200]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_overhead import served_url  # noqa: E402

PROMPT = "Write a long story about a lighthouse keeper and the storm that changed her life."
SMALL = {name: {"enum": ["left", "right"]} for name in ("small enum 1", "small enum 2", "small enum 3")}
SCHEMAS = {
    "20 000-value enum": {"enum": [f"value-{i}-{i * 7919 % 10007}" for i in range(20_000)]},
    "900 optional properties": {"type": "object", "properties": {f"field_{i}": {"type": "string"}
                                                                 for i in range(900)}},
    "60 000-value enum": {"enum": [f"v{i}-{i * 31 % 977}" for i in range(60_000)]},
}


def stream_gaps(url: str, max_tokens: int, started: threading.Event) -> list[tuple[float, float]]:
    """When each of the stream's chunks came (after its second) and the seconds since the one before. It does
    not draft: a chunk is one token, one step of the server, so a stall shows as it is rather than inside a
    round's burst."""
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "stream": True, "draft_max": 0}
    arrivals = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as answer:
        for line in answer.iter_lines():
            if line.startswith("data: {"):
                arrivals.append(time.perf_counter())
                started.set()
    return [(b, b - a) for a, b in zip(arrivals[1:], arrivals[2:])]


def health_times(url: str, stop: threading.Event) -> list[float]:
    """How long each /health took to answer."""
    times = []
    with httpx.Client(timeout=30) as client:
        while not stop.is_set():
            started = time.perf_counter()
            client.get(f"{url}/health")
            times.append(time.perf_counter() - started)
            time.sleep(0.05)
    return times


def schema_answer(url: str, schema: dict) -> tuple[int, float, float]:
    """A streamed answer under `schema`: its status, its seconds, and when its first event came (the server
    sends it as the generation joins the batch, once the schema is compiled)."""
    body = {"messages": [{"role": "user", "content": "Pick one."}], "max_tokens": 8, "temperature": 0,
            "stream": True,
            "response_format": {"type": "json_schema", "json_schema": {"name": "big", "schema": schema}}}
    started = time.perf_counter()
    joined = float("inf")
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as answer:
        for line in answer.iter_lines():
            if line.startswith("data: "):
                joined = min(joined, time.perf_counter())
    return answer.status_code, time.perf_counter() - started, joined


def trial(url: str, max_tokens: int, schemas: dict) -> dict:
    started, stop = threading.Event(), threading.Event()
    results: dict = {"schemas": {}}
    streamer = threading.Thread(target=lambda: results.__setitem__("gaps", stream_gaps(url, max_tokens, started)))
    poller = threading.Thread(target=lambda: results.__setitem__("health", health_times(url, stop)))
    streamer.start()
    started.wait(60)
    poller.start()
    def send(name: str, schema: dict) -> None:
        results["schemas"][name] = schema_answer(url, schema)

    senders = [threading.Thread(target=send, args=item) for item in schemas.items()]
    results["sent"] = time.perf_counter()
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join()
    streamer.join()
    stop.set()
    poller.join()
    return results


def report(name: str, results: dict) -> None:
    """The stream's gaps and /health's times; with schemas sent, also the stream's longest gap while they were
    compiling (from their sending until the first of them joined the batch)."""
    gaps, health = sorted(gap for _, gap in results["gaps"]), sorted(results["health"])
    print(f"{name:22} stream gap median {statistics.median(gaps) * 1e3:5.0f} ms, max {gaps[-1] * 1e3:5.0f} ms; "
          f"/health median {statistics.median(health) * 1e3:4.0f} ms, max {health[-1] * 1e3:5.0f} ms "
          f"({len(health)} asked)")
    if results["schemas"]:
        joined = min(at for _, _, at in results["schemas"].values())
        compiling = [gap for at, gap in results["gaps"] if results["sent"] < at < joined]
        print(f"{'':22}   while compiling ({joined - results['sent']:.2f} s): stream gap max "
              f"{max(compiling, default=0) * 1e3:.0f} ms over {len(compiling)} chunks")
    for schema, (status, seconds, _) in results["schemas"].items():
        print(f"{'':22}   {schema}: {status} in {seconds:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", help="a registry pair (default: the registry's default)")
    parser.add_argument("--target", type=Path, help="target GGUF (with --draft)")
    parser.add_argument("--draft", type=Path, help="draft GGUF")
    parser.add_argument("-n", "--max-tokens", type=int, default=200)
    args = parser.parse_args()
    files = (["--target", str(args.target), "--draft", str(args.draft)] if args.target else
             (["--pair", args.pair] if args.pair else []))
    command = [sys.executable, "-m", "spec_cli", "serve", *files, "--port", "0"]
    serving = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        url = served_url(serving).removesuffix("/v1")  # it prints the base URL clients take
        trial(url, 20, {})  # warm: the prompt, the drafter, the vocabulary's tables
        report("quiet", trial(url, args.max_tokens, {}))
        report("small schemas", trial(url, args.max_tokens, SMALL))
        report("large schemas", trial(url, args.max_tokens, SCHEMAS))
    finally:
        serving.terminate()
        serving.wait(30)


if __name__ == "__main__":
    main()
