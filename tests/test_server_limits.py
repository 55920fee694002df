"""`spec serve` under load: clients at once, a full queue, clients that leave, bodies and prompts past the limits."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from support.serving import NAME, Running, openai_error, running, wait_for

from spec_cli import Pair
from spec_cli.server.connections import Limits


def test_eight_clients_at_once_each_get_their_own_whole_answer(live: Running) -> None:
    prompts = [f"the {word}" for word in ("cat", "dog", "sun", "sea", "map", "cup", "hat", "box")]
    client = live.client()

    def ask(prompt: str, stream: bool) -> str:
        answer = client.completions.create(model=NAME, prompt=prompt, temperature=0, max_tokens=24, stream=stream)
        return "".join(c.choices[0].text for c in answer) if stream else answer.choices[0].text

    alone = [ask(prompt, False) for prompt in prompts]
    with ThreadPoolExecutor(8) as clients:
        together = list(clients.map(ask, prompts, [i % 2 == 0 for i in range(8)]))
    assert together == alone and len(set(alone)) > 1


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "the cat", "max_tokens": 1500}),
    ("/completion", {"prompt": "the cat", "n_predict": 1500}),
    ("/v1/messages", {"messages": [{"role": "user", "content": "the cat"}], "max_tokens": 1500}),
    ("/v1/responses", {"input": "the cat", "max_output_tokens": 1500}),
])
def test_a_client_that_leaves_mid_stream_stops_its_generation(live: Running, slow: None, path: str,
                                                              body: dict) -> None:
    """On every route that streams: the server sees the client go and stops the generation it was running."""
    with httpx.stream("POST", f"{live.url}{path}", json={**body, "temperature": 0, "stream": True},
                      timeout=30) as response:
        lines = response.iter_lines()
        assert any(line.startswith("data: {") for line in [next(lines) for _ in range(3)])
    started = time.monotonic()
    answer = live.client().completions.create(model=NAME, prompt="the dog", temperature=0, max_tokens=8)
    assert answer.choices[0].text and time.monotonic() - started < 10  # 1500 slowed tokens would take 30 s
    gone = [line for line in live.lines if "the client went away" in line]
    assert len(gone) == 1 and int(gone[0].split("after ")[1].split()[0]) < 1500


def test_a_full_queue_answers_503_at_once_and_serves_again_after(chat_pair: Pair, slow: None) -> None:
    with running(chat_pair, queue_size=0) as serving:
        body = {"prompt": "the cat", "max_tokens": 1500, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{serving.url}/v1/completions", json=body, timeout=30) as response:
            lines = response.iter_lines()  # kept: a dropped iterator closes the connection
            assert next(lines).startswith("data: {")
            started = time.monotonic()
            refused = serving.post("/v1/completions", {"prompt": "the dog", "max_tokens": 4})
            assert time.monotonic() - started < 5
            health = httpx.get(f"{serving.url}/health").json()
            assert health["generating"] and (health["waiting"], health["active"], health["slots"]) == (0, 1, 1)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "server_busy"
        deadline = time.monotonic() + 10  # the worker notices the departure at its next token
        while httpx.get(f"{serving.url}/health").json()["generating"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert serving.client().completions.create(model=NAME, prompt="the dog", max_tokens=4).choices[0].text


def test_a_prompt_too_long_for_the_context_is_named_so(live: Running) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        live.client().chat.completions.create(model=NAME, messages=[{"role": "user", "content": "the cat " * 600}])
    assert caught.value.code == "context_length_exceeded"


def test_a_client_that_leaves_a_whole_answer_frees_the_worker_at_once(live: Running, slow: None) -> None:
    """Not streamed, nothing is written until the end: the server hears the connection close and stops."""
    body = json.dumps({"prompt": "the cat", "max_tokens": 1500, "temperature": 0}).encode()
    with socket.create_connection(("127.0.0.1", live.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        wait_for(lambda: live.service.jobs == 1)
        time.sleep(0.5)
    wait_for(lambda: any("the client went away" in line for line in live.lines), within_s=1.0)  # the worker's
    gone = [line for line in live.lines if "the client went away" in line]
    assert len(gone) == 1 and int(gone[0].split("after ")[1].split()[0]) < 100
    assert not live.uvicorn.tracebacks


def test_a_waiting_client_that_leaves_is_never_served(chat_pair: Pair, slow: None) -> None:
    with running(chat_pair) as serving, httpx.Client(timeout=30) as first:
        body = {"prompt": "the cat", "max_tokens": 1500, "temperature": 0, "stream": True}
        with first.stream("POST", f"{serving.url}/v1/completions", json=body) as response:
            lines = response.iter_lines()  # kept: a dropped iterator closes the connection
            next(lines)
            with socket.create_connection(("127.0.0.1", serving.port)) as sock:
                waiting = json.dumps({"prompt": "the dog", "max_tokens": 5}).encode()
                sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(waiting), waiting))
                wait_for(lambda: serving.service.jobs == 2)
            wait_for(lambda: serving.service.jobs == 1)  # it left the line while the first still generates
            assert httpx.get(f"{serving.url}/health").json()["generating"]


def test_a_body_past_the_limit_is_413_before_it_is_read(chat_pair: Pair) -> None:
    with running(chat_pair, limits=Limits(body_bytes=1000)) as serving:
        declared = serving.post("/v1/completions", {"prompt": "x" * 2000})
        chunked = httpx.post(f"{serving.url}/v1/completions", content=iter([b'{"prompt": "', b"x" * 5000, b'"}']))
        for answer in (declared, chunked):
            assert openai_error(answer, 413)["code"] == "request_too_large"
        assert serving.post("/v1/completions", {"prompt": "the cat", "max_tokens": 2}).status_code == 200
