"""`spec serve` as its clients meet it: answers, streams and the command itself, with the official `openai` client
and raw HTTP against a server on a free loopback port, over tiny models. Every server a test starts is stopped by
the test."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import httpx
import openai
import pytest
from support import children
from support.serving import HELLO, NAME, Running, openai_error, running
from typer.testing import CliRunner

from spec_cli import GenerationRequest, Pair, load_pair
from spec_cli.cli.app import app
from spec_cli.cli.common import stop_signals_raise
from spec_cli.drafting import cost_book
from spec_cli.server import app as server


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


def test_a_chat_that_resends_its_history_costs_its_new_tokens(live: Running, chat_pair: Pair) -> None:
    client = live.client()
    first = client.chat.completions.create(model=NAME, messages=HELLO, temperature=0, max_tokens=12)
    history = [*HELLO, {"role": "assistant", "content": first.choices[0].message.content},
               {"role": "user", "content": "and again"}]
    second = client.chat.completions.create(model=NAME, messages=history, temperature=0, max_tokens=12)
    # Everything the first answer left in the caches (its prompt and answer but the last token) is reused.
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached == first.usage.prompt_tokens + first.usage.completion_tokens - 1
    new_text = "</s>[user] and again</s>[assistant] "  # what the template adds after the first answer
    assert second.usage.prompt_tokens - cached == len(chat_pair.target.tokenize(new_text, add_special=False)) + 1


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


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_spec_serve_answers_logs_each_answer_and_stops_on_ctrl_c_or_sigterm(chat_target_path: Path,
                                                                            other_draft_path: Path,
                                                                            stop: signal.Signals) -> None:
    """Stopped by Ctrl-C or SIGTERM (`kill`, `docker stop`), the server ends its answers and keeps what it measured in
    the cost book; so it does when its terminal closes (SIGHUP). At SIGTERM it used to die where it stood (uvicorn
    re-raises the signal it shut down on), and at SIGHUP."""
    process = children.popen([sys.executable, "-m", "spec_cli", "serve", "--target", str(chat_target_path),
                              "--draft", str(other_draft_path), "--port", "0", "-k", "2"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = process.stderr.readline()
    url = first.split(" on ")[1].split()[0]
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=30)
    answer = client.chat.completions.create(model=chat_target_path.stem, messages=HELLO, max_tokens=5)
    logged = process.stderr.readline()
    process.send_signal(stop)
    _out, rest = process.communicate(timeout=15)
    assert first.startswith(f"spec: serving {chat_target_path.stem} on http://127.0.0.1:")
    assert "drafting hybrid K=2" in first
    assert answer.usage.completion_tokens == 5 and answer.choices[0].finish_reason == "length"
    assert logged.startswith("spec: chat: ") and "5 tokens" in logged and "finish: length" in logged
    assert process.returncode == 0 and rest.strip().endswith("server stopped")
    assert cost_book.read_all()


def test_a_hang_up_while_serving_stops_the_server_and_raises_nothing() -> None:
    """SIGHUP while the server serves sets its exit flags (no grace) instead of raising a KeyboardInterrupt where the
    main thread stands (raised inside a request's code, uvicorn took it for that request's error and served on); after
    serving, a hang-up raises again as for every command; one the process was started ignoring stays ignored."""
    started_with = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        with stop_signals_raise():
            http = SimpleNamespace(should_exit=False, force_exit=False)
            with server.hang_up_stops(http):  # type: ignore[arg-type]
                signal.raise_signal(signal.SIGHUP)
                assert http.should_exit and http.force_exit
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGHUP)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        ignoring = SimpleNamespace(should_exit=False, force_exit=False)
        with server.hang_up_stops(ignoring):  # type: ignore[arg-type]
            signal.raise_signal(signal.SIGHUP)
        assert not ignoring.should_exit and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, started_with)


def test_one_model_is_described_by_its_id(live: Running) -> None:
    assert live.client().models.retrieve(NAME).id == NAME
    error = openai_error(httpx.get(f"{live.url}/v1/models/gpt-4o"), 404)
    assert error["code"] == "model_not_found" and error["type"] == "not_found_error"


def test_any_model_name_is_answered_under_the_name_it_was_asked_by(live: Running) -> None:
    """As llama-server serving one model: clients send the name their user typed once, or a default such as
    gpt-4o; the one pair answers, and `/v1/models` lists it under its own id."""
    client = live.client()
    answer = client.chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=3, temperature=0)
    assert answer.model == "gpt-4o" and answer.choices[0].message.content
    completion = client.completions.create(model="my-local-model", prompt="the cat", max_tokens=3, temperature=0)
    assert completion.model == "my-local-model" and completion.choices[0].text
    assert [model.id for model in client.models.list()] == [NAME]


def test_a_seeded_request_repeats_its_text_whatever_drafts_it(chat_pair: Pair) -> None:
    """The same seeded, sampled request gives one text: twice (the second drafted from the memory of the first),
    with another K or way of drafting, with none, and in one verify pass beside other requests. With no rule
    named, a seed verifies by the rule no draft, batch or memory can change."""
    with running(chat_pair, parallel=3) as serving:
        client = serving.client()

        def text(**drafting: object) -> str:
            return client.chat.completions.create(model=NAME, messages=HELLO, max_tokens=16, temperature=0.9, seed=11,
                                                  extra_body=drafting).choices[0].message.content

        texts = [text(), text(), text(draft_max=1), text(draft_mode="model", draft_max=5), text(draft_mode="none")]
        with ThreadPoolExecutor(max_workers=2) as pool:
            others = [pool.submit(client.chat.completions.create, model=NAME, messages=HELLO, max_tokens=24,
                                  temperature=0.9) for _ in range(2)]
            texts.append(text())
            [other.result() for other in others]
    assert len(set(texts)) == 1, texts


SEEDED = {  # each route's sampled, seeded request, and where its answer's text is
    "/v1/chat/completions": ({"messages": HELLO, "max_tokens": 12}, lambda a: a["choices"][0]["message"]["content"]),
    "/v1/completions": ({"prompt": "the cat", "max_tokens": 12}, lambda a: a["choices"][0]["text"]),
    "/completion": ({"prompt": "the cat", "n_predict": 12}, lambda a: a["content"]),
    "/v1/messages": ({"messages": HELLO, "max_tokens": 12}, lambda a: a["content"][0]["text"]),
    "/v1/responses": ({"input": "hello there", "max_output_tokens": 12},
                      lambda a: a["output"][0]["content"][0]["text"]),
}


def test_a_seeded_request_gives_one_text_on_every_route_quiet_or_beside_drafting_clients(chat_pair: Pair) -> None:
    """The issue's check on each route: the same seeded request twice to a quiet server (the second drafted from
    the memory of the first), then six times while two clients draft beside it in the same verify passes."""
    with running(chat_pair, parallel=3) as serving:
        def others() -> None:
            for _ in range(3):
                serving.post("/v1/chat/completions", {"messages": HELLO, "max_tokens": 24, "temperature": 0.9})

        for path, (body, text_of) in SEEDED.items():
            def text() -> str:
                answer = serving.post(path, {**body, "temperature": 0.9, "seed": 11})
                assert answer.status_code == 200, answer.text
                return text_of(answer.json())

            texts = [text(), text()]
            with ThreadPoolExecutor(max_workers=2) as pool:
                beside = [pool.submit(others) for _ in range(2)]
                texts += [text() for _ in range(6)]
                [other.result() for other in beside]
            assert len(set(texts)) == 1, (path, texts)
