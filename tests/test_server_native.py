"""llama.cpp's own routes on `spec serve`, in llama-server's shapes, with raw HTTP as the scripts and front ends
written against llama-server call them: /tokenize, /detokenize, /apply-template, /props and /slots."""

from __future__ import annotations

import httpx
import pytest
from support.serving import HELLO, Running, openai_error, running

from spec_cli import Pair


def test_tokenize_and_detokenize_are_the_targets_own(live: Running, chat_pair: Pair) -> None:
    target = chat_pair.target
    text = "the cat sat on the mat"
    ids = live.post("/tokenize", {"content": text}).json()["tokens"]
    assert ids == target.tokenize(text, add_special=False)
    assert live.post("/tokenize", {"content": text, "add_special": True}).json()["tokens"] == target.tokenize(text)
    spelt = b"".join(target.piece(token, special=True) for token in ids).decode()
    assert spelt.strip() == text  # the tiny vocabulary writes a space before the first word, as SentencePiece's
    pieces = live.post("/tokenize", {"content": text, "with_pieces": True}).json()["tokens"]
    assert [piece["id"] for piece in pieces] == ids and "".join(piece["piece"] for piece in pieces) == spelt
    assert live.post("/detokenize", {"tokens": ids}).json() == {"content": spelt}  # the pieces, as llama-server's


def test_a_piece_that_is_not_whole_utf8_is_its_bytes(live: Running, chat_pair: Pair) -> None:
    """As llama-server's: 'á' in a vocabulary of bytes is two pieces, each a list of one byte."""
    pieces = live.post("/tokenize", {"content": "á", "with_pieces": True}).json()["tokens"]
    assert b"".join(bytes(p["piece"]) if isinstance(p["piece"], list) else p["piece"].encode() for p in pieces) \
        .strip() == "á".encode()
    assert any(isinstance(p["piece"], list) for p in pieces)


def test_apply_template_renders_the_prompt_a_chat_generates_from(live: Running, chat_pair: Pair) -> None:
    prompt = live.post("/apply-template", {"messages": HELLO}).json()["prompt"]
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
def test_bad_input_is_a_shaped_400_naming_the_field(live: Running, path: str, body: dict, param: str) -> None:
    assert openai_error(live.post(path, body), 400)["param"] == param
