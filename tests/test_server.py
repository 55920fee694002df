"""`spec serve` as its clients meet it: the official `openai` client and raw HTTP against a server on a free
loopback port, over tiny models. Every server a test starts is stopped by the test."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest
from typer.testing import CliRunner

from spec_cli import GenerationRequest, Pair, SpecError, load_pair
from spec_cli.cli.app import app
from spec_cli.llama.context import Context
from spec_cli.server import app as server
from spec_cli.server.service import DEFAULT_QUEUE, Service

NAME = "tiny"
HELLO = [{"role": "user", "content": "hello there"}]


class Running:
    """A server in a thread of this process, over `pair`; `lines` collects what it logs."""

    def __init__(self, pair: Pair, queue_size: int = DEFAULT_QUEUE, api_key: str | None = None,
                 defaults: GenerationRequest = GenerationRequest(draft_max=3, draft_mode="model")) -> None:
        self.lines: list[str] = []
        self.service = Service(pair, NAME, defaults, queue_size=queue_size, log=self.lines.append)
        sock = server.listen("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self._http = server.http_server(server.create_app(self.service, api_key))
        self._thread = threading.Thread(target=self._http.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._http.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)

    def client(self, **options: object) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=options.pop("api_key", "unused"), max_retries=0,
                             timeout=30, **options)

    def post(self, path: str, body: object, **options: object) -> httpx.Response:
        content = body if isinstance(body, (str, bytes)) else json.dumps(body)
        return httpx.post(f"{self.url}{path}", content=content, timeout=30, **options)

    def stop(self) -> None:
        self._http.should_exit = True
        self._thread.join(10)
        self.service.close()
        assert not self._thread.is_alive()


@contextmanager
def running(pair: Pair, **options: object) -> Iterator[Running]:
    serving = Running(pair, **options)
    try:
        yield serving
    finally:
        serving.stop()


@pytest.fixture(scope="module")
def pair(chat_target_path: Path, other_draft_path: Path) -> Iterator[Pair]:
    with load_pair(chat_target_path, other_draft_path) as loaded:
        yield loaded


@pytest.fixture()
def live(pair: Pair) -> Iterator[Running]:
    with running(pair) as serving:
        yield serving


@pytest.fixture()
def slow(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every target pass takes 20 ms longer: generations last long enough to be interrupted."""
    decode = Context.decode

    def slowed(self: Context, *args: object, **kwargs: object):
        time.sleep(0.02)
        return decode(self, *args, **kwargs)

    monkeypatch.setattr(pair.target_context, "decode", slowed.__get__(pair.target_context))


def spec_run(*args: str) -> dict:
    result = CliRunner().invoke(app, ["run", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_chat_answers_the_openai_client_with_spec_runs_greedy_text(live: Running, chat_target_path: Path,
                                                                   other_draft_path: Path) -> None:
    answer = live.client().chat.completions.create(model=NAME, messages=HELLO, temperature=0, max_tokens=40)
    ran = spec_run("--target", str(chat_target_path), "--draft", str(other_draft_path), "-k", "3", "-n", "40",
                   "hello there")
    assert answer.choices[0].message.content == ran["text"] and answer.choices[0].message.role == "assistant"
    assert answer.choices[0].finish_reason == ("stop" if ran["finish_reason"] == "stop" else "length")
    assert answer.usage.completion_tokens == len(ran["token_ids"])
    assert answer.usage.prompt_tokens == ran["stats"]["prompt_tokens"]
    speculation = answer.model_extra["speculation"]
    assert speculation["drafted"] > 0 and speculation["draft_mode"] == "model" and speculation["draft_max"] == 3
    assert answer.model == NAME and answer.id.startswith("chatcmpl-")


def test_completions_take_the_prompt_raw_like_spec_run_raw(live: Running, chat_target_path: Path,
                                                           other_draft_path: Path) -> None:
    answer = live.client().completions.create(model=NAME, prompt="the cat", temperature=0, max_tokens=30,
                                              extra_body={"draft_max": 4, "draft_mode": "ngram"})
    ran = spec_run("--target", str(chat_target_path), "--draft-mode", "ngram", "-k", "4", "-n", "30", "--raw",
                   "the cat")
    assert answer.choices[0].text == ran["text"]
    assert answer.model_extra["speculation"]["draft_mode"] == "ngram"


def test_a_stream_gives_the_same_text_with_live_speculation_and_usage(live: Running) -> None:
    client = live.client()
    whole = client.chat.completions.create(model=NAME, messages=HELLO, temperature=0, max_tokens=40)
    chunks = list(client.chat.completions.create(model=NAME, messages=HELLO, temperature=0, max_tokens=40,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == whole.choices[0].finish_reason
    drafted = [c.model_extra["speculation"]["drafted"] for c in chunks if c.choices and c.choices[0].delta.content]
    assert drafted == sorted(drafted) and drafted[-1] > 0  # live counts that only grow
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_a_stream_sends_a_round_at_a_time(chat_target_path: Path) -> None:
    """A draft identical to the target has every round kept whole (K + 1 = 5 tokens): one chunk a round,
    not one a token, to encode and to parse."""
    with load_pair(chat_target_path, chat_target_path) as same, running(same) as serving:
        defaults = {"model": NAME, "messages": HELLO, "temperature": 0, "max_tokens": 40,
                    "extra_body": {"draft_max": 4}}
        chunks = list(serving.client().chat.completions.create(stream=True, **defaults))
        whole = serving.client().chat.completions.create(**defaults)
    texts = [c.choices[0].delta.content for c in chunks if c.choices[0].delta.content]
    assert "".join(texts) == whole.choices[0].message.content
    assert whole.model_extra["speculation"]["acceptance"] == 1.0
    assert len(texts) <= -(-whole.usage.completion_tokens // 5)


def test_server_sent_events_are_framed_and_end_with_done(live: Running) -> None:
    response = live.post("/v1/completions", {"prompt": "the dog", "max_tokens": 12, "temperature": 0,
                                             "stream": True})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = response.text.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    payloads = [json.loads(event.removeprefix("data: ")) for event in events[:-2]]
    assert all(event.startswith("data: {") for event in events[:-2])
    assert all(p["object"] == "text_completion" for p in payloads)
    assert payloads[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_a_stop_string_ends_the_answer_before_it(live: Running) -> None:
    client = live.client()
    full = client.completions.create(model=NAME, prompt="the cat", temperature=0, max_tokens=40).choices[0].text
    stop = full[10:13]
    assert stop.strip() and full.find(stop) >= 10
    for stream in (False, True):
        answer = client.completions.create(model=NAME, prompt="the cat", temperature=0, max_tokens=40,
                                           stop=[stop, "never appears"], stream=stream)
        if stream:
            chunks = list(answer)
            text, reason = "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason
        else:
            text, reason = answer.choices[0].text, answer.choices[0].finish_reason
        assert (text, reason) == (full[:full.find(stop)], "stop")


def test_a_chat_that_resends_its_history_costs_its_new_tokens(live: Running, pair: Pair) -> None:
    client = live.client()
    first = client.chat.completions.create(model=NAME, messages=HELLO, temperature=0, max_tokens=12)
    history = [*HELLO, {"role": "assistant", "content": first.choices[0].message.content},
               {"role": "user", "content": "and again"}]
    second = client.chat.completions.create(model=NAME, messages=history, temperature=0, max_tokens=12)
    # Everything the first answer left in the caches (its prompt and answer but the last token) is reused.
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached == first.usage.prompt_tokens + first.usage.completion_tokens - 1
    new_text = "</s>[user] and again</s>[assistant] "  # what the template adds after the first answer
    assert second.usage.prompt_tokens - cached == len(pair.target.tokenize(new_text, add_special=False)) + 1


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


def test_a_client_that_leaves_mid_stream_stops_its_generation(live: Running, slow: None) -> None:
    body = {"prompt": "the cat", "max_tokens": 1500, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{live.url}/v1/completions", json=body, timeout=30) as response:
        lines = response.iter_lines()
        assert [next(lines) for _ in range(3)][0].startswith("data: {")
    started = time.monotonic()
    answer = live.client().completions.create(model=NAME, prompt="the dog", temperature=0, max_tokens=8)
    assert answer.choices[0].text and time.monotonic() - started < 10  # 1500 slowed tokens would take 30 s
    gone = [line for line in live.lines if "the client went away" in line]
    assert len(gone) == 1 and int(gone[0].split("after ")[1].split()[0]) < 1500


def test_a_full_queue_answers_503_at_once_and_serves_again_after(pair: Pair, slow: None) -> None:
    with running(pair, queue_size=0) as serving:
        body = {"prompt": "the cat", "max_tokens": 1500, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{serving.url}/v1/completions", json=body, timeout=30) as response:
            lines = response.iter_lines()  # kept: a dropped iterator closes the connection
            assert next(lines).startswith("data: {")
            started = time.monotonic()
            refused = serving.post("/v1/completions", {"prompt": "the dog", "max_tokens": 4})
            assert time.monotonic() - started < 5
            assert httpx.get(f"{serving.url}/health").json() == {"status": "ok", "model": NAME, "generating": True,
                                                                 "waiting": 0}
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "server_busy"
        deadline = time.monotonic() + 10  # the worker notices the departure at its next token
        while httpx.get(f"{serving.url}/health").json()["generating"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert serving.client().completions.create(model=NAME, prompt="the dog", max_tokens=4).choices[0].text


@pytest.mark.parametrize("path, body, status, fragment", [
    ("/v1/chat/completions", "{not json", 400, "not valid JSON"),
    ("/v1/chat/completions", {"messages": HELLO, "model": "gpt-4o"}, 400, "'gpt-4o' is not served here"),
    ("/v1/chat/completions", {"messages": HELLO, "temperature": -1}, 400, "temperature must be >= 0"),
    ("/v1/chat/completions", {"messages": HELLO, "top_p": 0}, 400, "top-p must be in (0, 1]"),
    ("/v1/chat/completions", {"messages": HELLO, "n": 3}, 400, "only n = 1"),
    ("/v1/completions", {"prompt": "the cat " * 600}, 400, "the context holds 2048"),
    ("/v1/completions", {"prompt": [1, 2, 99999]}, 400, "outside the vocabulary (0 to 319)"),
    ("/v1/embeddings", {"input": "x"}, 404, "Not Found"),
])
def test_bad_requests_get_openai_shaped_errors_and_the_next_request_is_served(
        live: Running, path: str, body: object, status: int, fragment: str) -> None:
    response = live.post(path, body)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and fragment in error["message"]
    assert live.client().completions.create(model=NAME, prompt="the cat", max_tokens=4).choices[0].text


def test_a_prompt_too_long_for_the_context_is_named_so(live: Running) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        live.client().chat.completions.create(model=NAME, messages=[{"role": "user", "content": "the cat " * 600}])
    assert caught.value.code == "context_length_exceeded"


def test_a_model_without_a_chat_template_says_how_to_give_one(target_path: Path) -> None:
    with load_pair(target_path, draft=None) as bare, \
            running(bare, defaults=GenerationRequest(draft_max=0, draft_mode="none")) as serving:
        response = serving.post("/v1/chat/completions", {"messages": HELLO})
        assert response.status_code == 400 and "--chat-format" in response.json()["error"]["message"]
        assert serving.post("/v1/completions", {"prompt": "the cat", "max_tokens": 3}).status_code == 200


def test_the_server_sends_without_waiting_for_acks(live: Running) -> None:
    """Nagle's algorithm off on accepted connections: with it on, each response body and each stream chunk
    on a kept-alive connection waits up to 40 ms for the client's delayed ACK."""
    with httpx.Client() as client:
        assert client.get(f"{live.url}/health").status_code == 200
        sockets = [c.transport.get_extra_info("socket") for c in live._http.server_state.connections]
        assert sockets and all(s.getsockopt(server.socket.IPPROTO_TCP, server.socket.TCP_NODELAY) for s in sockets)


def test_models_and_health_describe_the_server(live: Running, chat_target_path: Path) -> None:
    models = live.client().models.list().data
    assert [m.id for m in models] == [NAME] and models[0].model_extra["target"] == chat_target_path.name
    assert httpx.get(f"{live.url}/health").json() == {"status": "ok", "model": NAME, "generating": False,
                                                      "waiting": 0}


def test_an_api_key_is_required_on_every_request_but_health(pair: Pair) -> None:
    with running(pair, api_key="s3cret") as serving:
        assert serving.post("/v1/completions", {"prompt": "the cat"}).status_code == 401
        wrong = serving.post("/v1/completions", {"prompt": "the cat"}, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(f"{serving.url}/v1/models").status_code == 401
        assert httpx.get(f"{serving.url}/health").status_code == 200
        with pytest.raises(openai.AuthenticationError):
            serving.client(api_key="nope").models.list()
        answer = serving.client(api_key="s3cret").completions.create(model=NAME, prompt="the cat", max_tokens=3)
        assert answer.choices[0].text


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.7", "::"])
def test_a_server_reachable_from_other_machines_needs_allow_remote(host: str) -> None:
    result = CliRunner().invoke(app, ["serve", "--host", host])
    assert result.exit_code == 1
    assert result.stderr.strip() == (f"spec: error: --host {host} lets other machines use this server; add "
                                     "--allow-remote if that is what you want (and --api-key to require a key)")


def test_allow_remote_warns_before_serving(monkeypatch: pytest.MonkeyPatch, chat_target_path: Path) -> None:
    """No test binds a non-loopback address: the socket is a loopback one and the HTTP server is replaced."""
    monkeypatch.setattr(server, "listen", lambda _host, _port: server.socket.create_server(("127.0.0.1", 0)))

    class Refuse:
        def __init__(self, _app: object) -> None:
            pass

        def run(self, sockets: object) -> None:
            raise SpecError("server not started in tests")

    monkeypatch.setattr(server, "http_server", Refuse)
    result = CliRunner().invoke(app, ["serve", "--target", str(chat_target_path), "--no-draft", "--host", "0.0.0.0",
                                      "--allow-remote"])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and lines[-1] == "spec: error: server not started in tests"
    assert lines[-2] == ("spec: warning: other machines can reach this server on 0.0.0.0; anyone who can reach it "
                         "can use it (--api-key requires a key)")


def test_a_port_in_use_is_one_line_before_any_model_loads() -> None:
    with server.socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        result = CliRunner().invoke(app, ["serve", "--target", "missing.gguf", "--no-draft", "--port", str(port)])
    assert result.exit_code == 1
    assert result.stderr.strip().startswith(f"spec: error: cannot listen on 127.0.0.1:{port}:")


def test_spec_serve_answers_logs_each_answer_and_stops_on_ctrl_c(chat_target_path: Path,
                                                                 other_draft_path: Path) -> None:
    process = subprocess.Popen([sys.executable, "-m", "spec_cli", "serve", "--target", str(chat_target_path),
                                "--draft", str(other_draft_path), "--port", "0", "-k", "2"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = process.stderr.readline()
        url = first.split(" on ")[1].split()[0]
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=30)
        answer = client.chat.completions.create(model=chat_target_path.stem, messages=HELLO, max_tokens=5)
        logged = process.stderr.readline()
        process.send_signal(signal.SIGINT)
        _out, rest = process.communicate(timeout=15)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert first.startswith(f"spec: serving {chat_target_path.stem} on http://127.0.0.1:")
    assert "drafting model K=2" in first
    assert answer.usage.completion_tokens == 5 and answer.choices[0].finish_reason == "length"
    assert logged.startswith("spec: chat: ") and "5 tokens" in logged and "finish: length" in logged
    assert process.returncode == 0 and rest.strip().endswith("server stopped")
