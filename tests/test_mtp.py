"""Drafting with the target's own MTP head, on a tiny Qwen3.5 (hybrid memory: recurrent and attention layers)
with one MTP block, written with the gguf writer and loaded by llama.cpp."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import llama_cpp
import numpy as np
import pytest
from click.testing import Result
from support.exactness import (SAMPLED, SIGNIFICANCE, chat_turns_match_the_target_alone, chi_square_p_value,
                       exact_pair_distribution, finish, priced_to_draft, sampled_pairs)
from support.tiny_models import CHAT_TEMPLATE, write_qwen35_mtp
from typer.testing import CliRunner

from spec_cli import Generation, Pair, SamplingParams, SpecError, load_pair
from spec_cli.conversation.session import ChatSession, Settings, run_command
from spec_cli.cli.app import app
from spec_cli.drafting.hybrid import HybridDrafter
from spec_cli.drafting.mtp import MtpDrafter
from spec_cli.llama.context import Context
from spec_cli.llama.heads import HeadContext
from spec_cli.models.registry import parse_registry

PROMPTS = ("the cat", "and the dog ran far away from the big red barn")


@pytest.fixture(scope="module")
def mtp_path(models_dir: Path) -> Path:
    return write_qwen35_mtp(models_dir / "qwen35-mtp.gguf", chat_template=CHAT_TEMPLATE)


@pytest.fixture(scope="module")
def pair(mtp_path: Path) -> Iterator[Pair]:
    with load_pair(mtp_path) as loaded:
        yield loaded


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def greedy(pair: Pair, prompt: str | list[int], **options: object) -> Generation:
    return finish(pair.generate(prompt, raw=True, max_tokens=60, **options))


def test_a_target_with_an_mtp_head_drafts_with_it_without_a_draft_model(pair: Pair) -> None:
    assert pair.draft is None and pair.target.n_layer_mtp == 1
    assert pair.default_draft_mode == "hybrid" and pair.drafting.own_models() == ("mtp",)
    generation = greedy(pair, "the cat", draft_max=3, draft_mode="mtp")
    assert generation.stats.drafted > 0 and generation.stats.memory == {
        "target": {"kind": "hybrid", "rollback": "in place (up to 16 tokens); snapshot + replay beyond"}}


@pytest.mark.parametrize("k", [1, 3, "auto"])
def test_greedy_tokens_equal_the_target_alone_with_drafts_kept_and_rejected(pair: Pair, k: int | str) -> None:
    priced_to_draft(pair)  # -k auto drafts wherever acceptance gives a chance
    for prompt in PROMPTS:
        alone = greedy(pair, prompt, draft_mode="none")
        drafted = greedy(pair, prompt, draft_mode="mtp", draft_max=k)
        assert drafted.token_ids == alone.token_ids
        assert drafted.stats.accepted > 0 and drafted.stats.rejected_rounds > 0


def test_after_rounds_with_rejections_the_head_holds_the_pairs_a_fresh_head_would(pair: Pair) -> None:
    """Each position p of the head pairs x_p with the target's h_{p-1}, never with the head's own h' from a
    round's drafting: its next q equals the q of a fresh head fed the whole sequence's pairs."""
    generation = greedy(pair, "and the dog ran far", draft_mode="mtp", draft_max=3)
    assert generation.stats.rejected_rounds > 0
    sequence = [*generation.prompt, *generation.token_ids]
    incremental = MtpDrafter(pair.target_context, pair.head_context).propose(sequence, 1, SAMPLED, rng(0))
    target = Context(pair.target, pair.n_ctx, 1, hidden_states=True)
    head = HeadContext(pair.target, pair.n_ctx, 1)
    try:
        target.prefill(sequence[:-1])
        fresh = MtpDrafter(target, head).propose(sequence, 1, SAMPLED, rng(0))
    finally:
        head.close()
        target.close()
    assert np.abs(np.asarray(incremental.q[0]) - np.asarray(fresh.q[0])).max() < 2e-5  # batch shapes differ: ~3e-6


def test_a_prompt_longer_than_one_batch_is_paired_whole(pair: Pair) -> None:
    prompt = pair.target.tokenize("the cat sat on the mat and the dog ran. " * 30)
    assert len(prompt) > pair.target_context.n_batch
    alone = greedy(pair, prompt, draft_mode="none")
    drafted = greedy(pair, prompt, draft_mode="mtp", draft_max=3)
    assert drafted.token_ids == alone.token_ids and drafted.stats.accepted > 0
    assert pair.head_context.n_past >= len(prompt)  # the head holds every pair of the prompt


def test_hybrid_pairs_ngram_lookup_with_the_head(pair: Pair) -> None:
    prompt = "the cat sat. the cat sat. the cat"
    alone = greedy(pair, prompt, draft_mode="none")
    priced_to_draft(pair)
    hybrid = greedy(pair, prompt, draft_mode="hybrid", draft_max=4)
    assert hybrid.token_ids == alone.token_ids and hybrid.stats.accepted > 0


@pytest.mark.parametrize("verify", ["block", "token"])
def test_sampled_first_two_tokens_follow_the_target(pair: Pair, verify: str) -> None:
    """χ² at α = 0.001 against the exact law of the first two tokens, computed from the target alone."""
    prompt = pair.prompt_tokens("the dog", raw=True)
    observed, totals = sampled_pairs(pair, prompt, SAMPLED, 2, "mtp", verify, n=2000)
    assert totals.accepted > 0 and totals.rejected_rounds > 0
    assert chi_square_p_value(observed, exact_pair_distribution(pair, prompt), 2000) > SIGNIFICANCE


def test_chat_turns_reuse_the_memory_and_equal_the_target_alone(pair: Pair) -> None:
    chat_turns_match_the_target_alone(pair, "mtp")


def test_a_model_without_mtp_layers_refuses_mtp_in_one_line(target_path: Path) -> None:
    with load_pair(target_path) as plain:
        assert plain.drafting.own_models() == () and plain.head_context is None
        with pytest.raises(SpecError, match=r"target.gguf has no MTP layers to draft with"):
            plain.generate("the cat", raw=True, draft_mode="mtp")


def spec(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def test_spec_run_with_only_a_target_drafts_with_its_head_and_writes_the_target_alones_text(mtp_path: Path) -> None:
    base = ["run", "--raw", "--target", str(mtp_path), "-n", "48", "-k", "3", "--draft-mode", "mtp"]
    drafted, alone = spec(*base, "--json", "the cat"), spec(*base, "--json", "--no-draft", "the cat")
    assert drafted.exit_code == 0, drafted.output
    drafted_json, alone_json = json.loads(drafted.stdout), json.loads(alone.stdout)
    assert drafted_json["token_ids"] == alone_json["token_ids"]
    stats = drafted_json["stats"]
    assert stats["draft_mode"] == "mtp" and stats["accepted"] > 0 and stats["rejected_rounds"] > 0
    assert alone_json["stats"]["draft_mode"] == "none"
    plain = spec(*base, "the cat")
    assert "drafting: MTP head" in plain.stderr


def test_draft_mode_mtp_on_a_model_without_a_head_is_one_line(target_path: Path) -> None:
    result = spec("run", "--raw", "--target", str(target_path), "--draft-mode", "mtp", "hi")
    assert result.exit_code == 1 and len(result.stderr.strip().splitlines()) == 1
    assert "target.gguf has no MTP layers to draft with" in result.stderr


def test_chat_switches_to_the_head_with_set_mode(mtp_path: Path) -> None:
    with load_pair(mtp_path) as loaded:
        session = ChatSession(loaded, Settings(sampling=SamplingParams(), draft_max=3, draft_mode="ngram",
                                               draft_p_min=0.0, max_tokens=12))
        assert run_command(session, "/set mode mtp") == "mode = mtp"
        for _ in session.reply("hello there"):
            pass
        assert session.last.stats.draft_mode == "mtp" and session.last.stats.drafted > 0


def test_bench_compares_the_head_with_ngram_and_hybrid(mtp_path: Path, tmp_path: Path) -> None:
    result = spec("bench", "--target", str(mtp_path), "--modes", "mtp,ngram,hybrid", "-k", "3", "-n", "16",
                  "--json", str(tmp_path / "bench.json"))
    assert result.exit_code == 0, result.output
    configs = json.loads((tmp_path / "bench.json").read_text())["configs"]
    assert {c["draft_mode"] for c in configs} == {"none", "mtp", "ngram", "hybrid"}
    mtp_row = next(c for c in configs if c["draft_mode"] == "mtp")
    assert mtp_row["speedup"] > 0 and mtp_row["acceptance_rate"] > 0
    assert mtp_row["predicted_speedup"] > 0  # priced with the head's own steps
    assert all(c["predicted_speedup"] is None for c in configs if c["draft_mode"] in ("ngram", "hybrid"))


@pytest.fixture()
def mtp_pair_name(mtp_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A user pair whose draft is the target's own MTP head: no draft file."""
    models = tmp_path / "models.toml"
    models.write_text(f'[pairs.tiny-mtp]\ntarget = {{ path = "{mtp_path}" }}\ndraft = {{ mtp = true }}\n'
                      f'draft_max = 3\nctx = 512\n')
    monkeypatch.setenv("SPEC_CLI_MODELS", str(models))
    return "tiny-mtp"


def test_a_registry_pair_without_a_draft_file_drafts_with_the_head(mtp_pair_name: str, mtp_path: Path) -> None:
    ran = spec("run", "--pair", mtp_pair_name, "--raw", "-n", "24", "--json", "the cat")
    assert ran.exit_code == 0, ran.output
    stats = json.loads(ran.stdout)["stats"]  # the default chooses among the head, n-gram lookup and no draft
    assert stats["draft_mode"] == "hybrid" and stats["adaptive_k"]
    assert set(stats["ways"]) <= {"mtp", "memory", "none"}
    pinned = json.loads(spec("run", "--pair", mtp_pair_name, "--raw", "-n", "24", "--json", "--draft-mode", "mtp",
                             "the cat").stdout)["stats"]
    assert pinned["draft_mode"] == "mtp" and pinned["draft_max"] == 3 and pinned["drafted"] > 0
    listed = spec("models", "list")
    assert "tiny-mtp" in listed.stdout and "MTP head" in listed.stdout
    shown = spec("models", "show", mtp_pair_name)
    assert shown.exit_code == 0 and "the target's MTP head (no file)" in shown.stdout
    assert "not on disk yet" not in shown.stdout  # nothing to pull for the head
    assert "MTP layers" in shown.stdout and "qwen35" in shown.stdout
    checked = spec("models", "check", mtp_pair_name)
    assert checked.exit_code == 0 and "1: it drafts for itself" in checked.stdout


def test_models_check_says_whether_a_gguf_can_draft_for_itself(mtp_path: Path, target_path: Path) -> None:
    with_head = spec("models", "check", str(mtp_path))
    assert with_head.exit_code == 0 and "target MTP layers" in with_head.stdout
    without = spec("models", "check", str(target_path))
    assert without.exit_code == 1
    assert "0: no MTP head to draft with" in without.stdout and "conversion left the MTP layers out" in without.stdout


@pytest.mark.parametrize("body, message", [
    ('target = { mtp = true }\ndraft = { path = "d.gguf" }', "mtp = true stands for the draft alone"),
    ('target = { derive = "draft", type = "f32" }\ndraft = { mtp = true }', "cannot be derived from an MTP head"),
])
def test_an_mtp_member_is_the_draft_alone(body: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_registry(f"[pairs.p]\n{body}\n", origin="test")


def test_with_a_draft_model_too_each_drafter_is_priced_with_its_own_steps(mtp_path: Path,
                                                                         other_draft_path: Path) -> None:
    """A pair that drafts with a model and with its head keeps their step costs apart, so -k auto and the
    hybrid price each with what its own steps cost."""
    with load_pair(mtp_path, other_draft_path) as both:
        assert both.drafting_modes == ("model", "mtp", "ngram", "memory", "hybrid") and both.default_draft_mode == "hybrid"
        assert both.drafting.own_models() == ("model", "mtp")
        head_rounds = greedy(both, "the cat", draft_mode="mtp", draft_max=3)
        assert head_rounds.stats.drafted > 0
        assert both.drafting.costs("mtp").draft.seconds(1) is not None
        assert both.drafting.costs("model").draft.seconds(1) is None  # untouched by the head's steps
        greedy(both, "the cat", draft_mode="model", draft_max=3)
        assert both.drafting.costs("model").draft.seconds(1) is not None
        ngram = both.drafting.costs("ngram")  # no steps of its own, the target's passes shared
        assert ngram.draft.seconds(1) is None and ngram.verify is both.drafting.costs("model").verify
        hybrid = both.drafting.build("hybrid", 0.0, 3)[0]
        assert isinstance(hybrid, HybridDrafter) and hybrid.books == {"model": both.drafting.costs("model"),
                                                                      "mtp": both.drafting.costs("mtp")}


def test_under_a_grammar_the_head_drafts_from_its_masked_law(pair: Pair) -> None:
    letters = r'root ::= [a-e ]+ "."'
    alone = greedy(pair, PROMPTS[0], draft_mode="none", grammar=letters)
    drafted = greedy(pair, PROMPTS[0], draft_mode="mtp", draft_max=3, grammar=letters)
    assert drafted.token_ids == alone.token_ids
    assert set(drafted.text) <= set("abcde .")
    assert drafted.stats.accepted > 0


def test_the_heads_passes_run_on_the_count_its_threads_chose(pair: Pair) -> None:
    """The generated models' contexts are made on one thread (conftest): a count of two, set by hand as a trial
    of `llama/threads.py` would, reaches llama.cpp at the head's next pass, and the text is the target alone's."""
    head = pair.head_context
    assert head is not None and head.threads.count == llama_cpp.llama_n_threads(head._handle) == 1
    head.threads.count = 2
    try:
        drafted = greedy(pair, "and the dog ran far", draft_mode="mtp", draft_max=3)
        assert llama_cpp.llama_n_threads(head._handle) == 2 and drafted.stats.drafted > 0
        assert drafted.token_ids == greedy(pair, "and the dog ran far", draft_mode="none").token_ids
    finally:
        head.threads.count = 1
