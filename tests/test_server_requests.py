"""Whatever a client sends `spec serve` gets an answer or an OpenAI-shaped 4xx, never a 500 or a traceback:
malformed fields, extreme numbers, random JSON."""

from __future__ import annotations

import json
import random

import httpx
import pytest
from support.serving import HELLO, NAME, Running, openai_error, running

from spec_cli import Pair


@pytest.mark.parametrize("path, body, status, fragment", [
    ("/v1/chat/completions", "{not json", 400, "not valid JSON"),
    ("/v1/chat/completions", {"messages": HELLO, "temperature": -1}, 400, "temperature must be >= 0"),
    ("/v1/chat/completions", {"messages": HELLO, "top_p": 0}, 400, "top-p must be in (0, 1]"),
    ("/v1/chat/completions", {"messages": HELLO, "n": 3}, 400, "only n = 1"),
    ("/v1/completions", {"prompt": "the cat " * 600}, 400, "the context holds 2048"),
    ("/v1/completions", {"prompt": [1, 2, 99999]}, 400, "outside the vocabulary (0 to 319)"),
    ("/v1/embeddings", {"input": "x"}, 404, "Not Found"),
])
def test_bad_requests_get_openai_shaped_errors_and_the_next_request_is_served(
        served: Running, path: str, body: object, status: int, fragment: str) -> None:
    response = served.post(path, body)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and fragment in error["message"]
    assert served.client().completions.create(model=NAME, prompt="the cat", max_tokens=4).choices[0].text


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
        served: Running, body: str, param: str | None, fragment: str) -> None:
    error = openai_error(served.post("/v1/chat/completions", body), 400)
    assert error["param"] == param and fragment in error["message"] and "SECRET" not in error["message"]
    assert not served.uvicorn.tracebacks and not any("internal error" in line for line in served.lines)


@pytest.mark.parametrize("extreme", [
    {"presence_penalty": -1e308}, {"frequency_penalty": -1e308}, {"repeat_penalty": 1e-300},
    {"repeat_penalty": 1e-300, "top_k": 0}, {"frequency_penalty": 1e308, "presence_penalty": 1e308},
])
def test_extreme_penalties_still_sample_from_a_law(served: Running, extreme: dict) -> None:
    """A penalty that favours the prompt's tokens without bound may well pick its end-of-turn marker at once: an
    answer, and a 200, either way."""
    client = served.client()
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


def test_random_json_gets_an_answer_or_an_openai_shaped_4xx_never_a_500(chat_pair: Pair) -> None:
    """Property: for any JSON body, each endpoint answers 200 (a whole answer, or a stream that ends in [DONE]
    with no error event) or a 4xx with OpenAI's error shape; the log holds no traceback. 150 bodies from a fixed
    seed, each sent to both endpoints, with max_tokens at most 3 so that every answer is short."""
    rng = random.Random(20261202)
    with running(chat_pair, max_tokens=3) as serving, httpx.Client(timeout=30) as client:
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
