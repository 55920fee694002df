"""`spec serve` as its clients meet it: the official `openai` client and raw HTTP against a server on a free
loopback port, over tiny models. Every server a test starts is stopped by the test."""

from __future__ import annotations

import json
import random
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator

import httpx
import openai
import pytest
from typer.testing import CliRunner

from spec_cli import GenerationRequest, Pair, SpecError, load_pair
from spec_cli.cli.app import app
from spec_cli.server import app as server
from spec_cli.server.connections import Limits

from support import children
from support.serving import HELLO, NAME, Running, running, slow_down



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
    slow_down(pair, monkeypatch)


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
            health = httpx.get(f"{serving.url}/health").json()
            assert health["generating"] and (health["waiting"], health["active"], health["slots"]) == (0, 1, 1)
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
    assert httpx.get(f"{live.url}/health").json() == {"status": "ok", "model": NAME, "busy": False,
                                                      "generating": False, "waiting": 0, "slots": 1, "active": 0,
                                                      "phases": [{"slot": 0, "phase": "idle"}],
                                                      "tokens_per_second": 0.0, "acceptance": None}


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


@pytest.fixture()
def no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """`spec serve` binds a loopback socket whatever its --host, and its HTTP server refuses to start."""
    monkeypatch.setattr(server, "listen", lambda _host, _port: server.socket.create_server(("127.0.0.1", 0)))

    class Refuse:
        def __init__(self, _app: object, _limits: object, _log: object) -> None:
            pass

        def run(self, sockets: object) -> None:
            raise SpecError("server not started in tests")

    monkeypatch.setattr(server, "http_server", Refuse)


def test_allow_remote_warns_before_serving(no_server: None, chat_target_path: Path) -> None:
    """No test binds a non-loopback address: the socket is a loopback one and the HTTP server is replaced."""
    result = CliRunner().invoke(app, ["serve", "--target", str(chat_target_path), "--no-draft", "--host", "0.0.0.0",
                                      "--allow-remote"])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and lines[-1] == "spec: error: server not started in tests"
    assert lines[-2] == ("spec: warning: other machines can reach this server on 0.0.0.0; anyone who can reach it "
                         "can use it (--api-key requires a key)")


@pytest.mark.parametrize("flags, warned", [(["--cors", "*"], True), (["--cors", "*", "--api-key", "k"], False),
                                           (["--cors", "http://localhost:3000"], False)])
def test_any_origin_without_a_key_is_warned_about(no_server: None, chat_target_path: Path, flags: list[str],
                                                  warned: bool) -> None:
    result = CliRunner().invoke(app, ["serve", "--target", str(chat_target_path), "--no-draft", *flags])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and lines[-1] == "spec: error: server not started in tests"
    warning = ("spec: warning: --cors * lets any web page open in a browser here use this server (--api-key "
               "requires a key)")
    assert (warning in lines) == warned


def test_a_port_in_use_is_one_line_before_any_model_loads() -> None:
    with server.socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        result = CliRunner().invoke(app, ["serve", "--target", "missing.gguf", "--no-draft", "--port", str(port)])
    assert result.exit_code == 1
    assert result.stderr.strip().startswith(f"spec: error: cannot listen on 127.0.0.1:{port}:")


def test_spec_serve_answers_logs_each_answer_and_stops_on_ctrl_c(chat_target_path: Path,
                                                                 other_draft_path: Path) -> None:
    process = children.popen([sys.executable, "-m", "spec_cli", "serve", "--target", str(chat_target_path),
                              "--draft", str(other_draft_path), "--port", "0", "-k", "2"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = process.stderr.readline()
    url = first.split(" on ")[1].split()[0]
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=30)
    answer = client.chat.completions.create(model=chat_target_path.stem, messages=HELLO, max_tokens=5)
    logged = process.stderr.readline()
    process.send_signal(signal.SIGINT)
    _out, rest = process.communicate(timeout=15)
    assert first.startswith(f"spec: serving {chat_target_path.stem} on http://127.0.0.1:")
    assert "drafting hybrid K=2" in first
    assert answer.usage.completion_tokens == 5 and answer.choices[0].finish_reason == "length"
    assert logged.startswith("spec: chat: ") and "5 tokens" in logged and "finish: length" in logged
    assert process.returncode == 0 and rest.strip().endswith("server stopped")


def openai_error(response: httpx.Response, status: int) -> dict:
    """The error of an answer that must be `status` with OpenAI's error shape."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


SECRET = "the system prompt is SECRET-42"


@pytest.mark.parametrize("body, param, fragment", [
    ('{"messages": [{"role": "system", "content": "%s"}, {"role": "user", "content": "\\ud800"}], "max_tokens": 4}'
     % SECRET, "messages[1].content", "lone surrogate"),
    ('{"messages": [{"role": "user", "content": "hi"}], "temperature": 1%s}' % ("0" * 400), "temperature",
     "finite number"),
    ('{"messages": [{"role": "user", "content": "hi"}], "top_p": -1%s}' % ("0" * 400), "top_p", "finite number"),
    ('{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1%s}' % ("0" * 400), "max_tokens",
     "out of range"),
    ('{"messages": [{"role": "user", "content": "hi"}], "seed": -2}', "seed", "-1 for a random seed"),
    ("[" * 100_000, None, "nests its JSON too deeply"),
    ('{"messages": ' + "[" * 50_000, None, "nests its JSON too deeply"),
    ('{"messages": [{"role": "user", "content": "%s"}], "temperature": "%s"}' % (SECRET, "x" * 50 + SECRET),
     "temperature", "must be a number"),
])
def test_malformed_requests_get_a_400_that_echoes_nothing_and_logs_no_traceback(
        live: Running, body: str, param: str | None, fragment: str) -> None:
    error = openai_error(live.post("/v1/chat/completions", body), 400)
    assert error["param"] == param and fragment in error["message"] and "SECRET" not in error["message"]
    assert not live.uvicorn.tracebacks and not any("internal error" in line for line in live.lines)


@pytest.mark.parametrize("extreme", [
    {"presence_penalty": -1e308}, {"frequency_penalty": -1e308}, {"repeat_penalty": 1e-300},
    {"repeat_penalty": 1e-300, "top_k": 0}, {"frequency_penalty": 1e308, "presence_penalty": 1e308},
])
def test_extreme_penalties_still_sample_from_a_law(live: Running, extreme: dict) -> None:
    """A penalty that favours the prompt's tokens without bound may well pick its end-of-turn marker at once: an
    answer, and a 200, either way."""
    client = live.client()
    whole = client.chat.completions.create(model=NAME, messages=HELLO, temperature=1, max_tokens=6, seed=3,
                                           extra_body=extreme)
    chunks = list(client.chat.completions.create(model=NAME, messages=HELLO, temperature=1, max_tokens=6, seed=3,
                                                 stream=True, extra_body=extreme))
    assert whole.choices[0].finish_reason in ("stop", "length")
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content


def test_a_temperature_too_small_for_float32_is_greedy(live: Running) -> None:
    client = live.client()
    greedy = client.chat.completions.create(model=NAME, messages=HELLO, temperature=0, max_tokens=30)
    tiny = client.chat.completions.create(model=NAME, messages=HELLO, temperature=1e-300, top_p=1, max_tokens=30,
                                          extra_body={"top_k": 0, "min_p": 0})
    assert tiny.choices[0].message.content == greedy.choices[0].message.content


def test_a_seed_of_minus_one_draws_a_random_seed(live: Running) -> None:
    client = live.client()
    texts = {client.completions.create(model=NAME, prompt="the cat", temperature=1.5, max_tokens=12, seed=-1,
                                       extra_body={"top_k": 0, "min_p": 0}).choices[0].text for _ in range(4)}
    streamed = list(client.completions.create(model=NAME, prompt="the cat", max_tokens=4, seed=-1, stream=True))
    assert len(texts) > 1 and streamed[-1].choices[0].finish_reason == "length"


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


def test_a_waiting_client_that_leaves_is_never_served(pair: Pair, slow: None) -> None:
    with running(pair) as serving, httpx.Client(timeout=30) as first:
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


def wait_for(condition: Callable[[], bool], within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.01)


def test_the_bearer_scheme_is_case_insensitive(pair: Pair) -> None:
    with running(pair, api_key="s3cret") as serving:
        for given in ("bearer s3cret", "BEARER s3cret", "Bearer  s3cret"):
            assert httpx.get(f"{serving.url}/v1/models", headers={"Authorization": given}).status_code == 200
        for given in ("s3cret", "Basic s3cret", "Bearer s3cre", "Bearer"):
            error = openai_error(httpx.get(f"{serving.url}/v1/models", headers={"Authorization": given}), 401)
            assert error["code"] == "invalid_api_key"


@pytest.mark.parametrize("how", [["--api-key", ""], ["--api-key", "  "], "SPEC_API_KEY"])
def test_an_empty_api_key_is_refused_at_start(no_server: None, chat_target_path: Path, how: list[str] | str) -> None:
    flags, env = (how, {}) if isinstance(how, list) else ([], {how: ""})
    result = CliRunner().invoke(app, ["serve", "--target", str(chat_target_path), "--no-draft", *flags], env=env)
    assert result.exit_code == 1 and result.stderr.strip().splitlines() == [
        "spec: error: the API key is empty (--api-key or SPEC_API_KEY): give a key, or set neither to serve "
        "without one"]


def test_a_body_past_the_limit_is_413_before_it_is_read(pair: Pair) -> None:
    with running(pair, limits=Limits(body_bytes=1000)) as serving:
        declared = serving.post("/v1/completions", {"prompt": "x" * 2000})
        chunked = httpx.post(f"{serving.url}/v1/completions", content=iter([b'{"prompt": "', b"x" * 5000, b'"}']))
        for answer in (declared, chunked):
            assert openai_error(answer, 413)["code"] == "request_too_large"
        assert serving.post("/v1/completions", {"prompt": "the cat", "max_tokens": 2}).status_code == 200


def test_one_model_is_described_by_its_id(live: Running) -> None:
    assert live.client().models.retrieve(NAME).id == NAME
    error = openai_error(httpx.get(f"{live.url}/v1/models/gpt-4o"), 404)
    assert error["code"] == "model_not_found" and error["type"] == "not_found_error"


def test_browsers_are_answered_only_from_the_origins_given(pair: Pair) -> None:
    preflight = {"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    with running(pair, cors=("http://localhost:3000",), api_key="k") as serving:
        allowed = httpx.options(f"{serving.url}/v1/chat/completions", headers=preflight)
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == "http://localhost:3000"
        refused = httpx.options(f"{serving.url}/v1/chat/completions", headers={**preflight, "Origin": "http://evil"})
        assert openai_error(refused, 400)["message"] == "Disallowed CORS origin"
        unauthorised = httpx.get(f"{serving.url}/v1/models", headers={"Origin": "http://localhost:3000"})
        assert unauthorised.status_code == 401  # readable by the page: it carries the CORS header
        assert unauthorised.headers["access-control-allow-origin"] == "http://localhost:3000"
    with running(pair) as serving:
        answer = httpx.options(f"{serving.url}/v1/chat/completions", headers=preflight)
        assert openai_error(answer, 405) and "access-control-allow-origin" not in answer.headers


FIELDS = ("messages", "prompt", "model", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
          "frequency_penalty", "repeat_penalty", "repeat_last_n", "seed", "max_tokens", "max_completion_tokens",
          "stop", "stream", "stream_options", "n", "draft_max", "draft_mode", "verify", "response_format",
          "logprobs", "tools")
NUMBERS = (0, 1, -1, 3, 0.5, -0.0, 1e-300, 1e308, -1e308, 2**64, -(2**64), 10**400, float("nan"), float("inf"))


def random_value(rng: random.Random, depth: int = 0) -> object:
    """Any JSON value, biased to what breaks parsers: edge numbers, odd strings, shallow nests."""
    kind = rng.randrange(9 if depth < 3 else 5)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice((True, False))
    if kind in (2, 3):
        return rng.choice(NUMBERS)
    if kind == 4:
        return rng.choice(("", "x", "hello", "\ud800", "<|im_end|>", "</s>", "auto", "block", "ngram", NAME,
                           "é" * 3, "\x00"))
    if kind in (5, 6):
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 7:
        return {"role": rng.choice(("user", "system", "assistant", "wizard")),
                "content": random_value(rng, depth + 1)}
    return {rng.choice(FIELDS): random_value(rng, depth + 1) for _ in range(rng.randrange(3))}


NUMERIC = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repeat_penalty",
           "repeat_last_n", "seed", "max_tokens", "draft_max")


def random_number(rng: random.Random) -> object:
    """An edge case, a magnitude from 10⁻³²⁰ to 10³⁰⁸ (positive, or of either sign), or a small whole number."""
    kind = rng.randrange(4)
    if kind == 0:
        return rng.choice(NUMBERS)
    if kind == 1:
        return 10.0 ** rng.uniform(-320, 308)
    if kind == 2:
        return rng.choice((1, -1)) * 10.0 ** rng.uniform(-320, 308)
    return rng.randrange(100)


def random_body(rng: random.Random) -> object:
    """Any JSON at times; mostly a usable prompt with a few numeric fields, so that numbers reach the sampler."""
    if rng.random() < 0.3:
        return {name: random_value(rng) for name in rng.sample(FIELDS, rng.randrange(1, 6))} \
            if rng.random() < 0.9 else random_value(rng)
    body: dict[str, object] = {"messages": HELLO, "prompt": "the cat", "stream": rng.random() < 0.3}
    body |= {name: random_number(rng) for name in rng.sample(NUMERIC, rng.randrange(1, 5))}
    return body


def test_random_json_gets_an_answer_or_an_openai_shaped_4xx_never_a_500(pair: Pair) -> None:
    """Property: for any JSON body, each endpoint answers 200 (a whole answer, or a stream that ends in [DONE]
    with no error event) or a 4xx with OpenAI's error shape; the log holds no traceback. 150 bodies from a fixed
    seed, each sent to both endpoints, with max_tokens at most 3 so that every answer is short."""
    rng = random.Random(20261202)
    with running(pair, max_tokens=3) as serving, httpx.Client(timeout=30) as client:
        for _ in range(150):
            body = json.dumps(random_body(rng))
            for path in ("/v1/chat/completions", "/v1/completions"):
                answer = client.post(f"{serving.url}{path}", content=body)
                assert answer.status_code == 200 or 400 <= answer.status_code < 500, (body, answer.text)
                if answer.status_code != 200:
                    openai_error(answer, answer.status_code)
                elif answer.headers["content-type"].startswith("text/event-stream"):
                    assert answer.text.endswith("data: [DONE]\n\n") and '"error"' not in answer.text, body
                else:
                    assert answer.json()["choices"][0]["finish_reason"] in ("stop", "length"), body
        assert not serving.uvicorn.tracebacks and not [line for line in serving.lines if "internal" in line]
