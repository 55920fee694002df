"""`spec serve --parallel N` through the official openai client: interleaved clients each get their lone-run
greedy text, one that leaves mid-batch leaves the others untouched, each slot keeps its own conversation, and
/health tells how busy the server is."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import anthropic
import httpx
import pytest
from support.exactness import finish, greedy_agreement
from support.serving import NAME, Running, running
from support.tiny_models import CHAT_TEMPLATE, write_dflash, write_eagle3, write_model, write_qwen35_mtp
from typer.testing import CliRunner

from spec_cli import GenerationRequest, Pair, load_pair
from spec_cli.cli.app import app
from spec_cli.decoding.sampling import SamplingParams
from spec_cli.models import registry

PROMPTS = [f"the {word}" for word in ("cat", "dog", "sun", "sea")]
DEFAULTS = GenerationRequest(draft_max="auto", draft_mode="model")


@pytest.fixture()
def four(chat_pair: Pair) -> Iterator[Running]:
    with running(chat_pair, parallel=4, defaults=DEFAULTS) as serving:
        yield serving


def lone(pair: Pair, prompt: str, max_tokens: int, k: int | str = "auto", mode: str = "model") -> str:
    return finish(pair.generate(prompt, raw=True, sampling=SamplingParams(), draft_max=k, draft_mode=mode,
                                max_tokens=max_tokens)).text


def test_interleaved_clients_each_get_their_lone_greedy_text(four: Running, chat_pair: Pair) -> None:
    client = four.client()
    barrier = threading.Barrier(len(PROMPTS))

    def ask(prompt: str, k: int | str) -> tuple[str, float]:
        barrier.wait()
        answer = client.completions.create(model=NAME, prompt=prompt, temperature=0, max_tokens=40,
                                           extra_body={"draft_max": k})
        return answer.choices[0].text, answer.model_extra["speculation"]["batch_size"]

    ks: list[int | str] = ["auto", 2, "auto", 0]  # K by goodput, a fixed K and no drafting share the batch
    with ThreadPoolExecutor(len(PROMPTS)) as clients:
        answers = list(clients.map(ask, PROMPTS, ks))
    assert [text for text, _ in answers] == [lone(chat_pair, p, 40, k) for p, k in zip(PROMPTS, ks)]
    assert max(batch for _, batch in answers) > 1.5  # they were verified together
    health = httpx.get(f"{four.url}/health").json()
    assert (health["slots"], health["active"], health["waiting"]) == (4, 0, 0) and health["tokens_per_second"] > 0


def test_a_client_that_leaves_mid_batch_leaves_the_others_untouched(chat_pair: Pair,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    with running(chat_pair, parallel=3, defaults=DEFAULTS) as serving:
        slow_down_sequences(serving, monkeypatch)
        client = serving.client()
        body = {"prompt": "the box", "max_tokens": 400, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{serving.url}/v1/completions", json=body, timeout=30) as response:
            lines = response.iter_lines()
            next(lines)
            with ThreadPoolExecutor(2) as clients:
                futures = [clients.submit(lambda p: client.completions.create(
                    model=NAME, prompt=p, temperature=0, max_tokens=30).choices[0].text, p) for p in PROMPTS[:2]]
                wait_until(lambda: httpx.get(f"{serving.url}/health").json()["active"] == 3)
                response.close()  # the first client leaves while the three generate together
                texts = [future.result() for future in futures]
        assert texts == [lone(chat_pair, p, 30) for p in PROMPTS[:2]]
        wait_until(lambda: any("the client went away" in line for line in serving.lines))
        assert not serving.uvicorn.tracebacks


def slow_down_sequences(serving: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every pass of the server's scheduler takes 20 ms longer: a batch lasts long enough to be left."""
    scheduler = serving.service._scheduler
    step = scheduler.step

    def slowed() -> object:
        time.sleep(0.02)
        return step()

    monkeypatch.setattr(scheduler, "step", slowed)


def wait_until(condition, within_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.01)


def test_each_slot_keeps_its_own_conversation_when_clients_interleave(chat_pair: Pair) -> None:
    with running(chat_pair, parallel=2, defaults=DEFAULTS) as serving:
        client = serving.client()
        first = [{"role": "user", "content": "hello there"}]
        other = [{"role": "user", "content": "a different question"}]
        answer = client.chat.completions.create(model=NAME, messages=first, temperature=0, max_tokens=12)
        client.chat.completions.create(model=NAME, messages=other, temperature=0, max_tokens=12)
        history = [*first, {"role": "assistant", "content": answer.choices[0].message.content},
                   {"role": "user", "content": "and again"}]
        second = client.chat.completions.create(model=NAME, messages=history, temperature=0, max_tokens=12)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached == answer.usage.prompt_tokens + answer.usage.completion_tokens - 1


def test_a_full_server_answers_503_once_every_slot_and_the_queue_are_taken(chat_pair: Pair,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    with running(chat_pair, parallel=2, queue_size=1, defaults=DEFAULTS) as serving:
        slow_down_sequences(serving, monkeypatch)
        body = {"prompt": "the cat", "max_tokens": 1000, "temperature": 0, "stream": True}
        with httpx.Client(timeout=30) as http, \
                http.stream("POST", f"{serving.url}/v1/completions", json=body) as a, \
                http.stream("POST", f"{serving.url}/v1/completions", json=body) as b:
            kept = [a.iter_lines(), b.iter_lines()]  # kept: a dropped iterator closes the connection
            assert all(next(lines).startswith("data: {") for lines in kept)
            threading.Thread(target=lambda: serving.post("/v1/completions", {"prompt": "x", "max_tokens": 2}),
                             daemon=True).start()
            wait_until(lambda: httpx.get(f"{serving.url}/health").json()["waiting"] == 1)
            refused = serving.post("/v1/completions", {"prompt": "the dog", "max_tokens": 4})
        assert refused.status_code == 503 and "2 generating and 1 waiting" in refused.json()["error"]["message"]


@pytest.mark.parametrize("mode", ["mtp", "eagle3", "dflash"])
def test_four_clients_of_a_pair_with_a_fed_drafter_each_get_their_lone_greedy_text(models_dir: Path,
                                                                                    mode: str) -> None:
    """Each slot has a head (or DFlash drafter) of its own, fed with its own sequence's hidden states or
    features from the passes all four share: each drafts what it drafts alone, so each keeps as many."""
    if mode == "mtp":
        files = (write_qwen35_mtp(models_dir / "mtp-parallel.gguf"), None)
    else:
        target = write_model(models_dir / "fed-parallel.gguf", seed=1, layer_scale=0.3, chat_template=CHAT_TEMPLATE)
        files = (target, write_eagle3(models_dir / "eagle3-parallel.gguf") if mode == "eagle3"
                 else write_dflash(models_dir / "dflash-parallel.gguf", target, block_size=8))
    with load_pair(*files) as pair:
        alone = [finish(pair.generate(prompt, raw=True, sampling=SamplingParams(), draft_max=3, draft_mode=mode,
                                      max_tokens=24)) for prompt in PROMPTS]
        with running(pair, parallel=4, defaults=GenerationRequest(draft_max=3, draft_mode=mode)) as serving:
            client = serving.client()
            barrier = threading.Barrier(len(PROMPTS))

            def ask(prompt: str) -> object:
                barrier.wait()
                return client.completions.create(model=NAME, prompt=prompt, temperature=0, max_tokens=24)

            with ThreadPoolExecutor(len(PROMPTS)) as clients:
                answers = list(clients.map(ask, PROMPTS))
    assert [answer.choices[0].text for answer in answers] == [generation.text for generation in alone]
    assert max(answer.model_extra["speculation"]["batch_size"] for answer in answers) > 1.5
    kept = [(answer.model_extra["speculation"]["drafted"], answer.model_extra["speculation"]["accepted"])
            for answer in answers]
    assert kept == [(generation.stats.drafted, generation.stats.accepted) for generation in alone]
    assert 0 < sum(accepted for _, accepted in kept) < sum(drafted for drafted, _ in kept)


def test_bench_concurrency_puts_the_default_beside_every_pinned_mode_at_each_level(
        chat_target_path: Path, other_draft_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "concurrency.json"
    result = CliRunner().invoke(app, ["bench", "--target", str(chat_target_path), "--draft", str(other_draft_path),
                                      "--concurrency", "1,3", "-n", "12", "-r", "2", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "Several requests at once" in result.stdout and all(name in result.stdout for name in ("hybrid", "memory", "none"))
    levels = json.loads(out.read_text())["concurrency"]
    assert [level["concurrency"] for level in levels] == [1, 3]
    for level in levels:
        sides = {side["draft_mode"]: side for side in level["sides"]}
        assert list(sides) == ["hybrid", "model", "ngram", "memory", "none"]
        assert sides["none"]["mean_k"] == 0 and sides["none"]["speedup"] == pytest.approx(1.0)
        assert max(side["of_best"] for side in sides.values()) == 1.0
        # every prompt once a batch (more clients than prompts: taken in turn), two batches a side
        requests = 2 * max(level["concurrency"], json.loads(out.read_text())["settings"]["prompts"])
        assert all(side["requests"] == requests for side in sides.values())
        held_out = sides["hybrid"]["of_best_other_held_out"]
        assert held_out > 0 and f"hybrid at {level['concurrency']}: {held_out:.2f}× the fastest of the others" in \
            result.stdout
    assert levels[1]["sides"][-1]["batch_size"] > 1.5
    pinned = CliRunner().invoke(app, ["bench", "--target", str(chat_target_path), "--draft", str(other_draft_path),
                                      "--concurrency", "2", "--modes", "ngram", "-n", "8", "--json", str(out)])
    assert pinned.exit_code == 0, pinned.output
    assert [side["draft_mode"] for side in json.loads(out.read_text())["concurrency"][0]["sides"]] == ["ngram", "none"]
    bad = CliRunner().invoke(app, ["bench", "--target", str(chat_target_path), "--concurrency", "0"])
    assert bad.exit_code == 1 and "--concurrency takes whole numbers from 1 to 64" in bad.output


@pytest.mark.demo
def test_four_clients_on_the_demo_pair_each_get_their_lone_greedy_text() -> None:
    """The issue's check: four openai clients at once against --parallel 4, each answer token for token what
    `spec run` (Pair.generate with the pair's K) writes alone, the four verified together, up to the target's
    float ties: an answer whose text differs is taken back to tokens and must part from the lone one on a tie
    (a row of a four-sequence pass rounds like a row of a verify pass). Then the same on the Messages and
    Responses APIs and llama.cpp's /completion, drafted as the server drafts."""
    models = registry.load_registry()
    entry = models.get(models.default)
    target, draft = registry.resolve(entry)
    questions = ["Name three uses of a paperclip.", "What is a prime number?", "Say hello in French.",
                 "Why is the sea salty?"]
    with load_pair(target, draft) as demo:
        alone = [finish(demo.generate(q, sampling=SamplingParams(), draft_max=entry.draft_max, max_tokens=24))
                 for q in questions]
        with running(demo, parallel=4, defaults=GenerationRequest(draft_max="auto")) as serving:
            client = serving.client()
            barrier = threading.Barrier(len(questions))

            def ask(question: str) -> tuple[str, float]:
                barrier.wait()
                answer = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": question}],
                                                        temperature=0, max_tokens=24)
                return answer.choices[0].message.content, answer.model_extra["speculation"]["batch_size"]

            with ThreadPoolExecutor(len(questions)) as clients:
                answers = list(clients.map(ask, questions))
            routes = other_routes(serving, questions[1], RAW)
        for (text, _), lone, question in zip(answers, alone, questions):
            if text != lone.text:
                greedy_agreement(demo.target, demo.prompt_tokens(question, False),
                                 demo.target.tokenize(text, add_special=False), lone.token_ids)
        raw = finish(demo.generate(RAW, raw=True, sampling=SamplingParams(), max_tokens=24, draft_mode="none"))
        for route, text in routes.items():
            question, lone = (RAW, raw) if route == "/completion" else (questions[1], alone[1])
            if text != lone.text:
                    greedy_agreement(demo.target, demo.prompt_tokens(question, question == RAW),
                                 demo.target.tokenize(text, add_special=False), lone.token_ids)
    assert max(batch for _, batch in answers) > 2


RAW = "def fibonacci(n):\n    "


def other_routes(serving: Running, question: str, raw: str) -> dict[str, str]:
    """Greedy answers of 24 tokens from the Messages and Responses APIs (through the official clients) and
    llama.cpp's /completion: each route's text, for the tie-aware comparison with the target alone."""
    messages = anthropic.Anthropic(base_url=serving.url, api_key="unused", max_retries=0).messages.create(
        model=NAME, max_tokens=24, messages=[{"role": "user", "content": question}], extra_body={"temperature": 0})
    response = serving.client().responses.create(model=NAME, input=question, max_output_tokens=24, temperature=0)
    completion = serving.post("/completion", {"prompt": raw, "n_predict": 24, "temperature": 0}).json()
    return {"/v1/messages": messages.content[0].text, "/v1/responses": response.output_text,
            "/completion": completion["content"]}
