"""Images: a tiny Qwen2-VL projector and text model written here and read by llama.cpp's libmtmd. Greedy identity
with rejections for a text-only draft and a draft with its own mmproj; two images under M-RoPE with a rejection
right after the second; several sequences; a chat that keeps its images; χ² at α = 0.001; every face; and
every bad input's one line."""

from __future__ import annotations

import base64
import functools
import http.server
import json
import threading
from pathlib import Path
from typing import Iterator

import numpy as np
import openai
import pytest
from typer.testing import CliRunner

from spec_cli import GenerationRequest, Pair, SamplingParams, load_pair
from spec_cli.conversation.session import ChatSession, Settings, run_command
from spec_cli.cli.app import app
from spec_cli.decoding.scheduler import Scheduler
from spec_cli.decoding.stats import Stats
from spec_cli.errors import BadInput, SpecError
from spec_cli.llama import vision
from spec_cli.llama.context import Context
from spec_cli.llama.prompt_text import IMAGE_MARKER, PromptText
from spec_cli.llama.vision import Image
from spec_cli.api import images
from spec_cli.api.errors import RequestError
from spec_cli.api.images import ImageUrl
from support.exactness import (SAMPLED, SIGNIFICANCE, against_alone, assert_greedy_identity, chi_square_p_value,
                       exact_pair_distribution, finish, greedy_agreement, sampled_pairs)
from support.serving import running
from support.tiny_models import (CHAT_TEMPLATE, N_EMBD, byte_level_bpe, write_dflash, write_eagle3, write_model,
                         write_qwen35_mtp)
from support.tiny_vision import png, write_mmproj

runner = CliRunner()
GREEDY = SamplingParams()
WIDE, SQUARE = png(24, 16, seed=1), png(16, 16, seed=2)  # 6×4 and 4×4 merged patches: 24 and 16 tokens


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("vision")
    return {
        "target": write_model(folder / "target.gguf", 1, arch="qwen2vl", chat_template=CHAT_TEMPLATE),
        "draft": write_model(folder / "draft.gguf", 1, arch="qwen2vl", noise=0.05),  # agrees mostly, not always
        "useless": write_model(folder / "useless.gguf", 2, arch="qwen2vl"),  # agrees by chance only
        "mmproj": write_mmproj(folder / "mmproj-target.gguf", 3, text_width=N_EMBD),
        "draft_mmproj": write_mmproj(folder / "draft-projector.gguf", 3, text_width=N_EMBD),
        "narrow": write_mmproj(folder / "narrow-projector.gguf", 3, text_width=N_EMBD // 2),
        # LLaVA-1.5 over a llama: an image's tokens advance positions by their count (Gemma 3, SmolVLM do so too).
        "llama": write_model(folder / "llama.gguf", 1),
        "llama_draft": write_model(folder / "llama-draft.gguf", 1, noise=0.05),
        "mlp": write_mmproj(folder / "llava-projector.gguf", 3, text_width=N_EMBD, projector="mlp"),
        "wide": _write(folder / "wide.png", WIDE),
        "square": _write(folder / "square.png", SQUARE),
    }


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.fixture(scope="module")
def alone(files: dict[str, Path]) -> Iterator[Pair]:
    with load_pair(files["target"], mmproj=files["mmproj"], n_ctx=512) as pair:
        yield pair


def image_runs(tokens: list[int]) -> list[tuple[int, int]]:
    """(start, length) of each image's run of ids in `tokens`."""
    runs: list[tuple[int, int]] = []
    for i, token in enumerate(tokens):
        if token < 0 and runs and sum(runs[-1]) == i and tokens[i - 1] == token:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        elif token < 0:
            runs.append((i, 1))
    return runs


def prompt_with_images(pair: Pair, *images: bytes) -> list[int]:
    return pair.prompt_tokens("say what you see", raw=True,
                              images=[Image(data, f"image {i}") for i, data in enumerate(images)])


def test_an_image_is_read_into_its_grid_between_the_templates_markers(alone: Pair) -> None:
    (read, before, after), = alone.vision.see([Image(WIDE, "wide")])
    assert (read.n_tokens, read.n_pos) == (6 * 4, 6)  # M-RoPE: positions advance by the grid's larger side
    assert read.embeddings().shape == (24, N_EMBD)
    spell = lambda ids: b"".join(alone.target.piece(t) for t in ids).decode().strip()  # noqa: E731 (SPM: " <|…")
    assert (spell(before), spell(after)) == ("<|vision_start|>", "<|vision_end|>")
    tokens = prompt_with_images(alone, WIDE, SQUARE)
    assert [length for _, length in image_runs(tokens)] == [24, 16]


def test_the_answer_depends_on_the_image(alone: Pair) -> None:
    answers = [finish(alone.generate(prompt_with_images(alone, image), max_tokens=12, draft_mode="none")).token_ids
               for image in (WIDE, SQUARE, WIDE)]
    assert answers[0] == answers[2] != answers[1]


@pytest.mark.parametrize("projector", ["qwen2vl", "llava"])
@pytest.mark.parametrize("sees", [False, True], ids=["text-only draft", "draft with its own mmproj"])
def test_greedy_output_with_images_is_the_target_alones_with_rejections(files: dict[str, Path], sees: bool,
                                                                         projector: str) -> None:
    target, draft, mmproj = (("target", "draft", "mmproj") if projector == "qwen2vl" else
                             ("llama", "llama_draft", "mlp"))
    with load_pair(files[target], files[draft], mmproj=files[mmproj], draft_mmproj=files[mmproj] if sees else None,
                   n_ctx=512) as pair:
        totals = Stats(draft_max=0)
        prompt = prompt_with_images(pair, WIDE, SQUARE)
        assert_greedy_identity(pair.target, prompt, against_alone(pair, totals, draft_max=4, draft_mode="model"), 40,
                               projector=pair.vision)
        assert 0 < totals.accepted < totals.drafted
        # The text-only draft skipped both images; the other decoded them as the target: on its grid under M-RoPE
        # (6×4 and 4×4), one position a token under LLaVA.
        seen = [6, 4] if projector == "qwen2vl" else [held.run for held in pair.target_context._held]
        assert [held.n_pos for held in pair.draft_context._held] == (seen if sees else [0, 0])


@pytest.mark.parametrize("arch", ["gemma3", "lfm2", "jamba"])
def test_every_kind_of_memory_goes_back_past_an_image(files: dict[str, Path], arch: str) -> None:
    """A sliding window, a hybrid llama.cpp rolls back in place and one it cannot (snapshots, replays) take back
    rejected drafts after images, on both sides (the draft reads the images too)."""
    folder = files["target"].parent
    target = write_model(folder / f"{arch}.gguf", 1, arch=arch)
    draft = write_model(folder / f"{arch}-draft.gguf", 1, arch=arch, noise=0.05)
    with load_pair(target, draft, mmproj=files["mlp"], draft_mmproj=files["mlp"], n_ctx=512) as pair:
        totals = Stats(draft_max=0)
        prompt = prompt_with_images(pair, WIDE, SQUARE)
        assert_greedy_identity(pair.target, prompt, against_alone(pair, totals, draft_max=3, draft_mode="model"), 24,
                               projector=pair.vision)
        assert 0 < totals.accepted < totals.drafted


def test_two_images_under_mrope_then_a_rejection_right_after_the_second(files: dict[str, Path]) -> None:
    with load_pair(files["target"], files["useless"], mmproj=files["mmproj"], n_ctx=512) as pair:
        images = pair.see([Image(WIDE, "wide"), Image(SQUARE, "square")])
        prompt = pair.target.tokenize_prompt(PromptText(f"look: {IMAGE_MARKER}{IMAGE_MARKER}"), images=images)
        assert prompt[-len(images[1]):] == images[1]  # the prompt ends with the second image (and its end marker)
        # Room for 4 tokens: a first round that kept its 3 drafts would be the only one, with no rejection.
        first = finish(pair.generate(prompt, sampling=GREEDY, max_tokens=4, draft_max=3, draft_mode="model"))
        assert first.stats.rejected_rounds >= 1  # so the first round, right after the second image, rejected
        totals = Stats(draft_max=0)
        assert_greedy_identity(pair.target, prompt, against_alone(pair, totals, draft_max=3, draft_mode="model"), 24,
                               projector=pair.vision)
        assert totals.accepted < totals.drafted
        # Text after the images sits where M-RoPE put it: each image advanced positions by its grid's side.
        target = pair.target_context
        assert target._position(len(prompt) - 1) == len(prompt) - 1 - (24 - 6) - (16 - 4)
    with load_pair(files["target"], files["target"], mmproj=files["mmproj"], draft_mmproj=files["mmproj"],
                   n_ctx=512) as same:
        assert same.see([Image(WIDE, "wide"), Image(SQUARE, "square")]) == images  # ids a pair has read the images for
        drafted = finish(same.generate(prompt, sampling=GREEDY, max_tokens=24, draft_max=3, draft_mode="model"))
        assert drafted.stats.accepted == drafted.stats.drafted > 0  # a draft that sees the images sees them exactly


def test_an_mtp_head_drafts_after_images_exactly_with_rejections(files: dict[str, Path]) -> None:
    """The head pairs the text around the images with the target's states (a Qwen3.5 with an MTP layer, reading
    images through the same projector)."""
    target = write_qwen35_mtp(files["target"].parent / "mtp.gguf")
    with load_pair(target, mmproj=files["mmproj"], n_ctx=512) as pair:
        totals = Stats(draft_max=0)
        for pictures in ((WIDE,), (SQUARE, WIDE), (WIDE,)):  # the third: the same text after another image
            prompt = prompt_with_images(pair, *pictures)
            assert_greedy_identity(pair.target, prompt, against_alone(pair, totals, draft_max=3, draft_mode="mtp"),
                                   24, projector=pair.vision)
        assert 0 < totals.accepted < totals.drafted


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_heads_fed_the_targets_features_draft_after_images_exactly_with_rejections(files: dict[str, Path],
                                                                                    kind: str) -> None:
    """An EAGLE-3 head and a DFlash drafter hold the target's features at the text around the images."""
    folder = files["target"].parent
    target = write_model(folder / "fed.gguf", 1, layer_scale=0.3, output_scale=0.3)
    drafter = (write_eagle3(folder / "eagle3.gguf") if kind == "eagle3"
               else write_dflash(folder / "dflash.gguf", target, block_size=8))
    with load_pair(target, drafter, mmproj=files["mlp"], n_ctx=512) as pair:
        totals = Stats(draft_max=0)
        for pictures in ((WIDE,), (SQUARE, WIDE), (WIDE,)):  # the third: the same text after another image
            prompt = prompt_with_images(pair, *pictures)
            assert_greedy_identity(pair.target, prompt, against_alone(pair, totals, draft_max=3, draft_mode=kind),
                                   24, projector=pair.vision)
        assert 0 < totals.accepted < totals.drafted
        hybrid = finish(pair.generate(prompt, max_tokens=8))
        assert hybrid.stats.draft_mode == "hybrid"


def test_a_draft_of_another_vocabulary_steps_aside_for_images(files: dict[str, Path]) -> None:
    draft = write_model(files["target"].parent / "bpe.gguf", 1, arch="qwen2vl", tokenizer=byte_level_bpe())
    with load_pair(files["target"], draft, mmproj=files["mmproj"], n_ctx=512) as pair:
        assert pair.translation is not None
        prompt = prompt_with_images(pair, WIDE)
        with pytest.raises(BadInput, match="a draft with another vocabulary cannot draft for a prompt with images"):
            pair.generate(prompt, draft_mode="model")
        generation = finish(pair.generate(prompt, max_tokens=8))  # the hybrid: the memory alone
        assert generation.stats.draft_mode == "memory"
        assert generation.token_ids == finish(pair.generate(prompt, max_tokens=8, draft_mode="none")).token_ids


def test_a_memory_never_keeps_part_of_an_image(alone: Pair) -> None:
    tokens = prompt_with_images(alone, WIDE)
    (start, length), = image_runs(tokens)
    context = Context(alone.target, n_ctx=128, n_threads=1)
    context.projector = alone.vision
    try:
        expected = context.decode(tokens, 1)[0]
        context.trim(start + length // 2)
        assert context.n_past == start and not context._held
        again = context.decode(tokens[start:], 1)[0]
        np.testing.assert_allclose(again, expected, rtol=1e-4, atol=1e-4)
    finally:
        context.close()


def test_an_image_no_longer_held_is_said_never_skipped(alone: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vision, "KEPT_IMAGES", 1)
    prompt = prompt_with_images(alone, png(8, 8, seed=7))
    prompt_with_images(alone, png(8, 8, seed=8))  # read since, and only one is kept
    with pytest.raises(SpecError, match="an image the target's projector does not hold .*send it again"):
        alone.generate(prompt, max_tokens=2, draft_mode="none")
    context = Context(alone.target, n_ctx=128, n_threads=1)  # a prompt already started when the image went
    context.projector = alone.vision
    try:
        with pytest.raises(SpecError, match="no longer held .*send it again"):
            context.decode(prompt, 1)
        assert context.n_past == 0
    finally:
        context.close()


def test_several_sequences_with_images_each_answer_as_alone(files: dict[str, Path], alone: Pair) -> None:
    prompts = [prompt_with_images(alone, WIDE), prompt_with_images(alone, SQUARE, WIDE)]
    expected = [finish(alone.generate(p, max_tokens=16, draft_mode="none")).token_ids for p in prompts]
    with load_pair(files["target"], files["draft"], mmproj=files["mmproj"], draft_mmproj=files["draft_mmproj"],
                   n_ctx=512) as pair:
        scheduler = Scheduler()
        prompts = [prompt_with_images(pair, WIDE), prompt_with_images(pair, SQUARE, WIDE)]
        generations = [slot.generate(p, GenerationRequest(max_tokens=16, draft_max=3, draft_mode="model"))
                       for slot, p in zip(pair.slots(2), prompts)]
        for generation in generations:
            scheduler.join(generation)
        while len(scheduler):
            scheduler.step()
        for prompt, generation, alone_ids in zip(prompts, generations, expected):  # several rows a pass: ties apart
            assert greedy_agreement(pair.target, prompt, generation.token_ids, alone_ids, projector=pair.vision)[0] > 0
        assert sum(g.stats.accepted for g in generations) > 0


def test_sampled_output_with_an_image_follows_the_target_law(files: dict[str, Path]) -> None:
    with load_pair(files["target"], files["draft"], mmproj=files["mmproj"], draft_mmproj=files["draft_mmproj"],
                   n_ctx=512) as pair:
        prompt = prompt_with_images(pair, SQUARE)
        observed, totals = sampled_pairs(pair, prompt, SAMPLED, 3, "model")
        assert totals.accepted > 0 and totals.drafted > totals.accepted
        assert chi_square_p_value(observed, exact_pair_distribution(pair, prompt), 2000) > SIGNIFICANCE


def test_a_chat_keeps_its_images_and_reuses_them_the_next_turn(files: dict[str, Path], tmp_path: Path) -> None:
    with load_pair(files["target"], files["draft"], mmproj=files["mmproj"], n_ctx=512) as pair:
        settings = dict(sampling=GREEDY, draft_max=3, draft_mode="model", max_tokens=12)
        drafting = ChatSession(pair, Settings(**settings))
        alone = ChatSession(pair, Settings(use_draft=False, **settings))
        for session in (drafting, alone):
            assert "attached" in run_command(session, f"/image {files['wide']}")
        first = [e.token for e in drafting.reply("what is this?")]
        assert first == [e.token for e in alone.reply("what is this?")]
        second = [e.token for e in drafting.reply("and its colour?")]
        assert second == [e.token for e in alone.reply("and its colour?")]
        assert drafting.last.stats.prompt_cached > len(drafting.turns[0].images) * 24  # the image was not read again
        assert [len(t.images) for t in drafting.turns] == [1, 0, 0, 0]
        drafting.save(tmp_path / "chat.json")
        assert json.loads((tmp_path / "chat.json").read_text())["turns"][0]["images"] == [str(files["wide"])]
        with pytest.raises(BadInput, match="not an image"):
            run_command(drafting, f"/image {files['target']}")


@pytest.mark.parametrize("drafting", ["text-only draft", "draft with its own mmproj", "MTP head"])
def test_the_server_takes_image_url_data_parts_and_answers_as_the_target_alone(files: dict[str, Path],
                                                                               drafting: str) -> None:
    url = "data:image/png;base64," + base64.b64encode(WIDE).decode()
    message = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                            {"type": "text", "text": "what is this?"}]}]
    mtp = drafting == "MTP head"
    target = write_qwen35_mtp(files["target"].parent / "mtp-chat.gguf", chat_template=CHAT_TEMPLATE) if mtp \
        else files["target"]
    with load_pair(target, None if mtp else files["draft"], mmproj=files["mmproj"], n_ctx=512,
                   draft_mmproj=files["mmproj"] if drafting == "draft with its own mmproj" else None) as pair:
        expected_prompt = pair.target.tokenize_prompt(
            pair.target.format_chat([{"role": "user", "content": IMAGE_MARKER + "what is this?"}]),
            images=pair.see([Image(WIDE, "x")]))
        expected = finish(pair.generate(expected_prompt, max_tokens=24, draft_mode="none"))
        mode = GenerationRequest(draft_max=3, draft_mode="mtp" if mtp else "model")
        with running(pair, defaults=mode) as serving:
            client = serving.client()
            answer = client.chat.completions.create(model="tiny", messages=message, max_tokens=24, temperature=0)
            assert answer.choices[0].message.content == expected.text
            assert answer.usage.prompt_tokens == len(expected_prompt)
            assert 0 < serving.service.health()["acceptance"] < 1  # drafted, and some drafts rejected
            if drafting != "text-only draft":
                return
            for bad, says in ((url[:40] + "!!!", "base64"), ("https://example.com/cat.png", "--allow-image-urls"),
                              ("data:text/plain;base64," + base64.b64encode(b"hello").decode(), "not an image")):
                parts = [{"type": "image_url", "image_url": {"url": bad}}]
                with pytest.raises(openai.BadRequestError, match=says):
                    client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": parts}])
    with load_pair(files["target"], n_ctx=512) as blind, running(blind) as serving:
        with pytest.raises(openai.BadRequestError, match="mmproj"):
            serving.client().chat.completions.create(model="tiny", messages=message, max_tokens=4)


@pytest.fixture
def web(tmp_path: Path) -> Iterator[str]:
    """A loopback HTTP server of `tmp_path`'s files, stopped by the test."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.RequestHandlerClass.log_message = lambda *_args: None  # type: ignore[method-assign]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join(5)


def test_image_urls_are_fetched_within_their_bounds(web: str, tmp_path: Path) -> None:
    _write(tmp_path / "wide.png", WIDE)
    _write(tmp_path / "notes.txt", b"no picture here")
    where = "messages[0].content[0].image_url"
    assert images.fetch(ImageUrl(f"{web}/wide.png", where)).data == WIDE
    for url, limit, says in ((f"{web}/wide.png", 100, "larger than"), (f"{web}/notes.txt", 1 << 20, "not an image"),
                             (f"{web}/missing.png", 1 << 20, "cannot fetch")):
        with pytest.raises(RequestError, match=says) as raised:
            images.fetch(ImageUrl(url, where), limit_bytes=limit)
        assert raised.value.param == where and raised.value.status == 400


def spec(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["run", "--raw", "-n", "8", *args])
    return result.exit_code, result.output


@pytest.mark.parametrize("drafting", ["text-only draft", "draft with its own mmproj", "MTP head"])
def test_spec_run_reads_images_and_finds_the_mmproj_beside_the_target(files: dict[str, Path], drafting: str) -> None:
    mtp = drafting == "MTP head"
    target = write_qwen35_mtp(files["target"].parent / "mtp.gguf") if mtp else files["target"]
    drafts = (["--draft-mode", "mtp"] if mtp else ["--draft", str(files["draft"]), "--draft-mode", "model"]
              + (["--draft-mmproj", str(files["mmproj"])] if drafting == "draft with its own mmproj" else []))
    code, output = spec("--target", str(target), *drafts, "-k", "3", "-n", "24", "--json",
                        "-i", str(files["wide"]), "-i", str(files["square"]), "say what you see")
    assert code == 0, output
    assert "reading images with mmproj-target.gguf" in output
    answer = json.loads(output[output.index("{"):])
    assert 0 < answer["stats"]["accepted"] < answer["stats"]["drafted"]
    with load_pair(target, mmproj=files["mmproj"], n_ctx=512) as alone:
        prompt = prompt_with_images(alone, WIDE, SQUARE)
        expected = finish(alone.generate(prompt, max_tokens=24, draft_mode="none"))
        greedy_agreement(alone.target, prompt, answer["token_ids"], expected.token_ids, projector=alone.vision)


def test_spec_batch_reads_a_lines_images(files: dict[str, Path], alone: Pair, tmp_path: Path) -> None:
    lines = tmp_path / "in.jsonl"
    lines.write_text(json.dumps({"prompt": "say what you see", "images": [str(files["wide"])]}) + "\n"
                     + json.dumps({"prompt": "and this", "images": [str(files["target"])]}) + "\n")
    out = tmp_path / "out.jsonl"
    result = runner.invoke(app, ["batch", str(lines), "-o", str(out), "--target", str(files["target"]), "--raw",
                                 "-n", "8", "--draft", str(files["draft"]), "--token-ids"])
    assert result.exit_code == 1, result.output  # one line failed
    done, failed = [json.loads(line) for line in out.read_text().splitlines()]
    prompt = prompt_with_images(alone, WIDE)
    expected = finish(alone.generate(prompt, max_tokens=8, draft_mode="none"))
    greedy_agreement(alone.target, prompt, done["token_ids"], expected.token_ids, projector=alone.vision)
    assert "line 2" in failed["error"] and "not an image" in failed["error"]


@pytest.mark.parametrize("case, says", [
    ("no mmproj", "reads no images without its mmproj"),
    ("another model's mmproj", "is not an mmproj for target.gguf"),
    ("not an image", "is not an image llama.cpp reads"),
    ("truncated", "or it is truncated"),
    ("too many pixels", "pixels; images are limited to 100"),
    ("more than the context holds", "context holds 64"),
    ("a draft mmproj without a draft", "give the draft model too"),
])
def test_every_bad_input_is_one_line_and_exit_2(files: dict[str, Path], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch, case: str, says: str) -> None:
    alone_folder = tmp_path / "alone"
    alone_folder.mkdir()
    (alone_folder / "target.gguf").symlink_to(files["target"])
    target = ["--target", str(alone_folder / "target.gguf")]
    with_mmproj = [*target, "--mmproj", str(files["mmproj"])]
    args = {
        "no mmproj": [*target, "-i", str(files["wide"])],
        "another model's mmproj": [*target, "--mmproj", str(files["narrow"]), "-i", str(files["wide"])],
        "not an image": [*with_mmproj, "-i", str(_write(tmp_path / "x.png", b"not a picture"))],
        "truncated": [*with_mmproj, "-i", str(_write(tmp_path / "cut.png", WIDE[:60]))],
        "too many pixels": [*with_mmproj, "-i", str(files["wide"])],
        "more than the context holds": [*with_mmproj, "--ctx", "64", *["-i", str(files["wide"])] * 3],
        "a draft mmproj without a draft": [*target, "--draft-mmproj", str(files["mmproj"]), "-i", str(files["wide"])],
    }[case]
    monkeypatch.setattr(vision, "MAX_PIXELS", 100 if case == "too many pixels" else vision.MAX_PIXELS)
    code, output = spec(*args, "hello")
    assert code == 2, output
    assert says in output and len(output.strip().splitlines()) == 1 and "Traceback" not in output


def test_models_check_says_which_side_reads_images(files: dict[str, Path]) -> None:
    result = runner.invoke(app, ["models", "check", str(files["target"]), str(files["draft"])])
    assert result.exit_code == 0, result.output
    assert "yes, through mmproj-target.gguf" in result.output  # the single mmproj beside the target
    assert "no: it drafts from the text around the images" in result.output  # the draft shares the target's folder


def test_spec_chat_attaches_an_image_with_slash_image(files: dict[str, Path]) -> None:
    lines = f"/image {files['wide']}\nwhat is this?\n/image {files['target']}\n/exit\n"
    result = runner.invoke(app, ["chat", "--target", str(files["target"]), "-n", "4", "--temp", "0"], input=lines)
    assert result.exit_code == 0, result.output
    assert "reading images with mmproj-target.gguf" in result.output
    assert f"{files['wide']} attached to the next message" in result.output
    assert "is not an image llama.cpp reads" in result.output and "Traceback" not in result.output
