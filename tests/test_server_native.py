"""llama.cpp's own routes on `spec serve`, in llama-server's shapes, with raw HTTP as the scripts and front ends
written against llama-server call them: /tokenize, /detokenize, /apply-template, /props and /slots."""

from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import httpx
import pytest
from support.exactness import SAMPLED, SIGNIFICANCE, chi_square_p_value, exact_pair_distribution, finish
from support.serving import HELLO, Running, openai_error, running
from support.tiny_models import FIM_TOKENS, write_model

from spec_cli import Pair, load_pair
from spec_cli.server import native


def test_tokenize_and_detokenize_are_the_targets_own(served: Running, chat_pair: Pair) -> None:
    target = chat_pair.target
    text = "the cat sat on the mat"
    ids = served.post("/tokenize", {"content": text}).json()["tokens"]
    assert ids == target.tokenize(text, add_special=False)
    assert served.post("/tokenize", {"content": text, "add_special": True}).json()["tokens"] == target.tokenize(text)
    spelt = b"".join(target.piece(token, special=True) for token in ids).decode()
    assert spelt.strip() == text  # the tiny vocabulary writes a space before the first word, as SentencePiece's
    pieces = served.post("/tokenize", {"content": text, "with_pieces": True}).json()["tokens"]
    assert [piece["id"] for piece in pieces] == ids and "".join(piece["piece"] for piece in pieces) == spelt
    assert served.post("/detokenize", {"tokens": ids}).json() == {"content": spelt}  # the pieces, as llama-server's


def test_a_piece_that_is_not_whole_utf8_is_its_bytes(served: Running, chat_pair: Pair) -> None:
    """As llama-server's: 'á' in a vocabulary of bytes is two pieces, each a list of one byte."""
    pieces = served.post("/tokenize", {"content": "á", "with_pieces": True}).json()["tokens"]
    assert b"".join(bytes(p["piece"]) if isinstance(p["piece"], list) else p["piece"].encode() for p in pieces) \
        .strip() == "á".encode()
    assert any(isinstance(p["piece"], list) for p in pieces)


def test_apply_template_renders_the_prompt_a_chat_generates_from(served: Running, chat_pair: Pair) -> None:
    prompt = served.post("/apply-template", {"messages": HELLO}).json()["prompt"]
    assert prompt == chat_pair.target.format_chat(HELLO).text
    assert "hello there" in prompt


def test_props_and_slots_describe_the_server(chat_pair: Pair) -> None:
    with running(chat_pair, parallel=2) as serving:
        props = httpx.get(f"{serving.url}/props").json()
        slots = httpx.get(f"{serving.url}/slots").json()
    assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == chat_pair.n_ctx
    assert props["model_path"] == str(chat_pair.target.path)
    assert props["chat_template"] == chat_pair.target.chat_template() and props["modalities"] == {"vision": False}
    assert [slot["id"] for slot in slots] == [0, 1] and not any(slot["is_processing"] for slot in slots)
    assert all(slot["n_ctx"] == chat_pair.n_ctx and slot["phase"]["phase"] == "idle" for slot in slots)


@pytest.mark.parametrize("path, body, param", [
    ("/tokenize", {}, "content"),
    ("/tokenize", {"content": 5}, "content"),
    ("/tokenize", {"content": "x", "with_pieces": "yes"}, "with_pieces"),
    ("/tokenize", {"content": "\ud800"}, "content"),
    ("/detokenize", {"tokens": "1 2"}, "tokens"),
    ("/detokenize", {"tokens": [1, 99999]}, "tokens"),
    ("/apply-template", {"messages": "hi"}, "messages"),
])
def test_bad_input_is_a_shaped_400_naming_the_field(served: Running, path: str, body: dict, param: str) -> None:
    assert openai_error(served.post(path, body), 400)["param"] == param


# --- /completion and /infill -------------------------------------------------------------------------------------


def test_completion_answers_in_llama_cpps_shape_with_the_target_alones_greedy_text(served: Running,
                                                                                   chat_pair: Pair) -> None:
    """Drafted as the server drafts, the text the target alone writes; llama-server's fields and the speculation."""
    answer = served.post("/completion", {"prompt": "the cat", "n_predict": 12, "temperature": 0,
                                         "return_tokens": True, "cache_prompt": True}).json()
    alone = finish(chat_pair.generate("the cat", raw=True, max_tokens=12, draft_mode="none"))
    assert answer["tokens"] == alone.token_ids and answer["content"] == alone.text
    assert answer["stop"] is True and answer["stop_type"] in ("eos", "limit") and answer["tokens_predicted"] == 12
    assert answer["tokens_evaluated"] == len(chat_pair.prompt_tokens("the cat", raw=True))
    assert answer["timings"]["predicted_n"] == 12 and "drafted" in answer["speculation"]


HTTP_SAMPLES = 1000  # requests of the χ² test over HTTP; the engine's own tests take 2,000 at the same α


def test_sampled_completions_over_http_follow_the_target_law(chat_pair: Pair) -> None:
    """χ² at α = 0.001: the first two tokens /completion samples, four requests at a time into one verify pass,
    drafted by unrelated weights (so often rejected) under the default unseeded rule (block verification, named
    here because a seed alone would pick gumbel), follow the target alone's p(x1, x2 | prompt)."""
    prompt = chat_pair.prompt_tokens("the cat", raw=True)
    expected = exact_pair_distribution(chat_pair, prompt, SAMPLED)
    with running(chat_pair, parallel=4) as serving, httpx.Client(base_url=serving.url, timeout=30) as client:
        def sample(seed: int) -> tuple[tuple[int, ...], int]:
            answer = client.post("/completion", json={
                "prompt": prompt, "n_predict": 2, "temperature": SAMPLED.temperature, "top_k": SAMPLED.top_k,
                "seed": seed, "verify": "block", "return_tokens": True}).json()
            timings = answer["timings"]
            return tuple(answer["tokens"]), timings["draft_n"] - timings["draft_n_accepted"]

        with ThreadPoolExecutor(4) as clients:
            answers = list(clients.map(sample, range(HTTP_SAMPLES)))
    assert sum(rejected for _, rejected in answers) > HTTP_SAMPLES / 10  # the rule is at work
    observed = Counter(tokens for tokens, _ in answers)
    assert chi_square_p_value(observed, expected, HTTP_SAMPLES) > SIGNIFICANCE


def test_a_streamed_completion_sends_pieces_then_the_whole_answer_and_no_done(served: Running) -> None:
    with httpx.stream("POST", f"{served.url}/completion", timeout=30,
                      json={"prompt": "the cat", "n_predict": 10, "temperature": 0, "stream": True}) as response:
        events = [json.loads(line[len("data: "):]) for line in response.iter_lines() if line.startswith("data: ")]
    whole = served.post("/completion", {"prompt": "the cat", "n_predict": 10, "temperature": 0}).json()
    assert all(not event["stop"] for event in events[:-1]) and events[-1]["stop"] is True
    assert "".join(event["content"] for event in events) == whole["content"]
    assert events[-1]["tokens_predicted"] == 10


def test_a_stop_word_ends_a_completion_and_says_so(served: Running) -> None:
    free = served.post("/completion", {"prompt": "the cat", "n_predict": 24, "temperature": 0}).json()["content"]
    word = free.strip().split()[1]
    answer = served.post("/completion", {"prompt": "the cat", "n_predict": 24, "temperature": 0, "stop": [word]}).json()
    assert answer["stop_type"] == "word" and word not in answer["content"]


@pytest.fixture(scope="module")
def fim_pair(models_dir: Path) -> Iterator[Pair]:
    """A code model's fill-in-the-middle tokens in the tiny vocabulary, drafted by a noisy copy of itself."""
    target = write_model(models_dir / "fim-target.gguf", seed=1, fim=True)
    draft = write_model(models_dir / "fim-draft.gguf", seed=1, fim=True, noise=0.1)
    with load_pair(target, draft) as pair:
        yield pair


def test_infill_places_prefix_suffix_and_extra_as_llama_server_and_drafts_the_target_alones_text(
        fim_pair: Pair) -> None:
    body = {"input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n\nprint(add(1, 2))\n",
            "input_extra": [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}],
            "prompt": "a", "n_predict": 16, "temperature": 0, "return_tokens": True}
    target, fim = fim_pair.target, FIM_TOKENS
    prompt = native.infill_prompt(target, body, fim_pair.target_context.n_batch, fim_pair.n_ctx, 16)
    spelt = [target.tokenize_bytes(text.encode(), False, False) for text in
             ("\n\n--- snippet ---\n\n", "def sub(a, b):\n    return a - b\n", body["input_prefix"], "a",
              body["input_suffix"])]
    assert prompt == [*spelt[0], *spelt[1], target.vocab_info().bos, fim["pre"][0], *spelt[2], *spelt[3],
                      fim["suf"][0], *spelt[4], fim["mid"][0]]
    alone = finish(fim_pair.generate(prompt, max_tokens=16, draft_mode="none"))
    with running(fim_pair) as serving:
        answer = serving.post("/infill", body).json()
    assert answer["tokens"] == alone.token_ids and answer["content"] == alone.text
    assert answer["speculation"]["drafted"] > 0


def test_infill_on_a_model_without_fim_tokens_is_a_400_that_says_so(served: Running) -> None:
    error = openai_error(served.post("/infill", {"input_prefix": "def f(", "input_suffix": ")"}), 400)
    assert "no fill-in-the-middle tokens" in error["message"] and error["param"] == "input_prefix"


@pytest.mark.parametrize("path, body, param", [
    ("/completion", {"prompt": "x", "n_predict": 0}, "n_predict"),
    ("/completion", {"prompt": "x", "n_predict": "ten"}, "n_predict"),
    ("/completion", {"prompt": "x", "n_probs": 5}, "n_probs"),
    ("/completion", {}, "prompt"),
    ("/completion", {"prompt": "x", "temperature": "hot"}, "temperature"),
])
def test_bad_completion_input_is_a_shaped_400_naming_the_field(served: Running, path: str, body: dict,
                                                                param: str) -> None:
    assert openai_error(served.post(path, body), 400)["param"] == param


# --- /metrics ----------------------------------------------------------------------------------------------------


def samples(text: str) -> dict[str, float]:
    """Prometheus text's samples by name and labels, its HELP and TYPE lines checked to precede them."""
    found, typed = {}, set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
        elif line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            assert name.split("{")[0] in typed, name
            found[name] = float(value)
    return found


def test_metrics_count_tokens_requests_and_drafts_as_llama_server_names_them(chat_pair: Pair) -> None:
    with running(chat_pair, metrics=True) as serving:
        before = samples(httpx.get(f"{serving.url}/metrics").text)
        answers = [serving.post("/v1/completions", {"prompt": "the cat", "max_tokens": 12, "temperature": 0}).json()
                   for _ in range(2)]
        after = samples(httpx.get(f"{serving.url}/metrics").text)
    generated = sum(answer["usage"]["completion_tokens"] for answer in answers)
    drafted = sum(answer["speculation"]["drafted"] for answer in answers)
    assert before["llamacpp:tokens_predicted_total"] == 0 and after["llamacpp:tokens_predicted_total"] == generated
    assert after["llamacpp:prompt_tokens_total"] == sum(answer["usage"]["prompt_tokens"] for answer in answers)
    assert after["llamacpp:spec_decode_num_draft_tokens_total"] == drafted > 0
    assert after["llamacpp:spec_decode_num_accepted_tokens_total"] == sum(
        answer["speculation"]["accepted"] for answer in answers)
    assert after['llamacpp:spec_decode_num_draft_tokens_per_pos_total{position="1"}'] > 0
    assert after["llamacpp:requests_processing"] == 0 and after["llamacpp:requests_deferred"] == 0


def test_metrics_are_off_unless_asked_for(served: Running) -> None:
    assert httpx.get(f"{served.url}/metrics").status_code == 404
