"""Drafting with an EAGLE-3 head and with a DFlash drafter, both fed with the target's layer inputs: tiny
drafters written with the gguf writer for a tiny llama target (`tiny_models.write_eagle3`, `write_dflash`),
whose drafts are often accepted and often rejected. Refusals of pairs llama.cpp would abort over run in a
child process, as a user meets them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
from click.testing import Result
from support.exactness import (SAMPLED, SIGNIFICANCE, chat_turns_match_the_target_alone, chi_square_p_value,
                       exact_pair_distribution, finish, priced_to_draft, sampled_pairs)
from support.tiny_models import CHAT_TEMPLATE, MASK_TOKEN, write_dflash, write_eagle3, write_model
from typer.testing import CliRunner

from spec_cli import Generation, Pair, SpecError, load_pair
from spec_cli.cli.app import app
from spec_cli.decoding.costs import PER_ROUND, PER_TOKEN
from spec_cli.decoding.draft_length import AdaptiveK
from spec_cli.drafting.dflash import DFlashDrafter
from spec_cli.drafting.eagle3 import Eagle3Drafter
from spec_cli.llama.context import Context
from spec_cli.llama.heads import BlockContext, HeadContext

KINDS = ("eagle3", "dflash")
runner = CliRunner()
PROMPTS = ("the cat and the dog", "and the dog ran far away from the big red barn")
BLOCK = 8


@pytest.fixture(scope="module")
def fed_target(models_dir: Path) -> Path:
    """Its layers add little to what each token says (`layer_scale`), so the drafters' bigram is often right;
    its logits are flat enough (`output_scale`) for sampling to spread over several tokens."""
    return write_model(models_dir / "fed-target.gguf", seed=1, layer_scale=0.3, output_scale=0.3,
                       chat_template=CHAT_TEMPLATE)


@pytest.fixture(scope="module")
def drafter_paths(models_dir: Path, fed_target: Path) -> dict[str, Path]:
    return {"eagle3": write_eagle3(models_dir / "eagle3.gguf"),
            "dflash": write_dflash(models_dir / "dflash.gguf", fed_target, block_size=BLOCK)}


@pytest.fixture(scope="module", params=KINDS)
def pair(request: pytest.FixtureRequest, fed_target: Path, drafter_paths: dict[str, Path]) -> Iterator[Pair]:
    with load_pair(fed_target, drafter_paths[request.param]) as loaded:
        yield loaded


def greedy(pair: Pair, prompt: str | list[int], **options: object) -> Generation:
    return finish(pair.generate(prompt, raw=True, max_tokens=48, **options))


def kind(pair: Pair) -> str:
    """The mode of the pair's drafter file: eagle3 or dflash."""
    assert pair.drafter_file is not None
    return pair.drafter_file.kind


def test_the_drafter_file_selects_its_mode_and_the_target_keeps_its_layers(pair: Pair) -> None:
    found = pair.drafter_file
    assert found is not None and pair.default_draft_mode == "hybrid" and pair.drafting.own_models() == (found.kind,)
    assert pair.drafting_modes == (found.kind, "ngram", "memory", "hybrid") and pair.draft_context is None
    assert pair.target_context.feature_layers == found.target_layers
    assert found.target_layers == ((0, 1, 1) if found.kind == "eagle3" else (0, 1))
    if found.kind == "dflash":
        assert (found.block_size, found.mask_token, found.causal) == (BLOCK, MASK_TOKEN, False)


@pytest.mark.parametrize("k", [1, 3, "auto"])
def test_greedy_tokens_equal_the_target_alone_with_drafts_kept_and_rejected(pair: Pair, k: int | str) -> None:
    for prompt in PROMPTS:
        alone = greedy(pair, prompt, draft_mode="none")
        drafted = greedy(pair, prompt, draft_max=k, draft_mode=kind(pair))
        assert drafted.token_ids == alone.token_ids
        # -k auto may stop drafting (K = 0): these generated drafters cost more than they save
        assert k == "auto" or drafted.stats.accepted > 0 and drafted.stats.rejected_rounds > 0


def test_after_rounds_with_rejections_the_drafter_holds_what_a_fresh_one_would(pair: Pair) -> None:
    """Its memory is cut back to what the target kept: its next q equals the q of a fresh drafter given the
    whole sequence's features at once."""
    generation = greedy(pair, "and the dog ran far", draft_max=3, draft_mode=kind(pair))
    assert generation.stats.rejected_rounds > 0
    sequence = [*generation.prompt, *generation.token_ids]
    sources = pair.drafting.sources
    incremental = pair.drafting.build(kind(pair), 0.0, 2)[0].propose(sequence, 2, SAMPLED, np.random.default_rng(0))
    layers = pair.target_context.feature_layers
    target = Context(pair.target, pair.n_ctx, 1, feature_layers=layers)
    fresh_drafter: Eagle3Drafter | DFlashDrafter
    if kind(pair) == "eagle3":
        memory: HeadContext | BlockContext = HeadContext(pair.draft, pair.n_ctx, 1, target=target)
        fresh_drafter = Eagle3Drafter(target, memory)
    else:
        assert sources.dflash is not None
        memory = BlockContext(pair.draft, target, 1, sources.dflash.block_size, sources.dflash.mask_token)
        fresh_drafter = DFlashDrafter(target, memory)
    try:
        target.prefill(sequence[:-1])
        fresh = fresh_drafter.propose(sequence, 2, SAMPLED, np.random.default_rng(0))
    finally:
        memory.close()
        target.close()
    assert incremental.tokens == fresh.tokens
    for q_incremental, q_fresh in zip(incremental.q, fresh.q):
        assert np.abs(np.asarray(q_incremental) - np.asarray(q_fresh)).max() < 2e-5  # batch shapes differ


def test_a_prompt_longer_than_one_batch_is_fed_whole(pair: Pair) -> None:
    prompt = pair.target.tokenize("the cat sat on the mat and the dog ran. " * 30)
    assert len(prompt) > pair.target_context.n_batch
    alone = greedy(pair, prompt, draft_mode="none")
    drafted = greedy(pair, prompt, draft_max=3, draft_mode=kind(pair))
    assert drafted.token_ids == alone.token_ids and drafted.stats.accepted > 0


def test_hybrid_pairs_ngram_lookup_with_the_drafter(pair: Pair) -> None:
    prompt = "the cat sat. the cat sat. the cat"
    alone = greedy(pair, prompt, draft_mode="none")
    priced_to_draft(pair)
    hybrid = greedy(pair, prompt, draft_mode="hybrid", draft_max=4)
    assert hybrid.token_ids == alone.token_ids and hybrid.stats.accepted > 0


def test_modes_that_need_a_draft_model_say_which_mode_the_file_drafts_in(pair: Pair) -> None:
    with pytest.raises(SpecError, match=f"draft mode 'model' needs a draft model, and the draft given is "
                                        f"an? (EAGLE-3 head|DFlash drafter); use --draft-mode {kind(pair)}$"):
        pair.drafting.check("model")


def test_k_auto_prices_a_dflash_round_as_one_pass_and_k_stays_within_the_block(pair: Pair) -> None:
    auto = pair.drafting.build(kind(pair), 0.0, "auto")[1]
    assert isinstance(auto, AdaptiveK) and auto.costs.shape == (PER_ROUND if kind(pair) == "dflash" else PER_TOKEN)
    fixed = greedy(pair, PROMPTS[1], draft_max=12, draft_mode=kind(pair))
    assert fixed.stats.draft_max == (BLOCK - 1 if kind(pair) == "dflash" else 12)
    assert 0 < len(fixed.stats.drafted_at) <= fixed.stats.draft_max  # drafts at positions 1..K


@pytest.mark.parametrize("verify", ["block", "token"])
def test_sampled_first_two_tokens_follow_the_target(pair: Pair, verify: str) -> None:
    """χ² at α = 0.001 against the exact law of the first two tokens, computed from the target alone."""
    prompt = pair.prompt_tokens("the dog", raw=True)
    observed, totals = sampled_pairs(pair, prompt, SAMPLED, 2, kind(pair), verify, n=2000)
    assert totals.accepted > 0 and totals.rejected_rounds > 0
    assert chi_square_p_value(observed, exact_pair_distribution(pair, prompt), 2000) > SIGNIFICANCE


def test_chat_turns_reuse_the_memory_and_equal_the_target_alone(pair: Pair) -> None:
    chat_turns_match_the_target_alone(pair, kind(pair))


def spec(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """`spec` in a child process: a pair llama.cpp would abort over must not take the tests with it."""
    return subprocess.run([sys.executable, "-m", "spec_cli", *map(str, args)], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("kind,label", [("eagle3", "EAGLE-3 head"), ("dflash", "DFlash block")])
def test_spec_run_drafts_with_the_drafter_file_by_itself(fed_target: Path, drafter_paths: dict[str, Path],
                                                        kind: str, label: str) -> None:
    args = ["run", "--target", fed_target, "--draft", drafter_paths[kind], "--raw", "-n", "32", "-k", "3"]
    drafted = spec(*args, "--json", "--draft-mode", kind, "the cat and the dog")
    alone = spec(*args, "--json", "--no-draft", "the cat and the dog")
    assert drafted.returncode == alone.returncode == 0, drafted.stderr + alone.stderr
    fast, plain = json.loads(drafted.stdout), json.loads(alone.stdout)
    assert fast["token_ids"] == plain["token_ids"] and fast["stats"]["draft_mode"] == kind
    assert fast["stats"]["accepted"] > 0 and fast["stats"]["accepted"] < fast["stats"]["drafted"]
    summary = spec(*args, "--draft-mode", kind, "the cat and the dog")
    assert f"drafting: {label}" in summary.stderr


def test_pairs_llama_cpp_would_abort_over_are_refused_in_one_line(models_dir: Path, fed_target: Path,
                                                                  drafter_paths: dict[str, Path]) -> None:
    cases = {
        "cannot feed": (write_model(models_dir / "gemma3.gguf", seed=1, arch="gemma3"), drafter_paths["eagle3"]),
        "was trained on a target 64 wide, but narrow.gguf is 32 wide": (
            write_model(models_dir / "narrow.gguf", seed=1, n_embd=32), drafter_paths["dflash"]),
        "reads target layers [0, 1, 5], but fed-target.gguf has 2": (
            fed_target, write_eagle3(models_dir / "deep-eagle3.gguf", target_layers=(0, 1, 5))),
        "reads target layers [0, 1, 2] (the last one's output, which spec-cli does not feed yet)": (
            fed_target, write_eagle3(models_dir / "nextn-eagle3.gguf", target_layers=(0, 1, 2))),
        "dflash2.gguf is a DFlash2 drafter, whose drafts are not read off its block's rows": (
            fed_target, write_dflash(models_dir / "dflash2.gguf", fed_target, more={"selector_top_k": 4})),
    }
    for message, (target, draft) in cases.items():
        result = spec("run", "--target", target, "--draft", draft, "--raw", "-n", "4", "the cat")
        assert result.returncode == 1, result.stderr
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
        assert "Traceback" not in result.stderr and "GGML_ASSERT" not in result.stderr


def wide(*args: str) -> Result:
    """`spec` in a terminal wide enough that no table cell wraps."""
    return runner.invoke(app, list(args), env={"COLUMNS": "300"})


def test_models_check_names_the_drafter_its_layers_and_whether_the_target_feeds_it(
        models_dir: Path, fed_target: Path, drafter_paths: dict[str, Path]) -> None:
    fits = wide("models", "check", str(fed_target), str(drafter_paths["dflash"]))
    assert fits.exit_code == 0, fits.output
    assert "DFlash block of 8 (up to 7 drafts a pass) reading target layers 0, 1; mask token 319" in fits.stdout
    assert "yes: fed-target.gguf (llama) hands over those layers' inputs" in fits.stdout
    gemma = write_model(models_dir / "gemma3-check.gguf", seed=1, arch="gemma3")
    refused = wide("models", "check", str(gemma), str(drafter_paths["eagle3"]))
    assert refused.exit_code == 1
    assert "EAGLE-3 head reading target layers 0, 1, 1" in refused.stdout
    assert "no: gemma3-check.gguf (gemma3) cannot feed the EAGLE-3 head eagle3.gguf" in refused.stdout


def test_models_show_reports_a_pairs_drafter(user_dirs: Path, fed_target: Path,
                                             drafter_paths: dict[str, Path]) -> None:
    user_file = user_dirs / ".config" / "spec-cli" / "models.toml"
    user_file.parent.mkdir(parents=True, exist_ok=True)
    user_file.write_text(f'[pairs.tiny-eagle3]\ntarget = {{ path = "{fed_target}" }}\n'
                         f'draft = {{ path = "{drafter_paths["eagle3"]}" }}\n')
    shown = wide("models", "show", "tiny-eagle3")
    assert shown.exit_code == 0, shown.output
    assert "EAGLE-3 head reading target layers 0, 1, 1 (trained on a target 64 wide)" in shown.stdout
    assert "yes: fed-target.gguf (llama)" in shown.stdout

