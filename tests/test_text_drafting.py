"""Drafting through text for a draft of another vocabulary: exact greedy output, the sampled law, the
translation's bookkeeping, and the commands.

The pairs are one tiny model written over different vocabularies (`tiny_models.Tokenizer`): byte-level
BPE with ChatML specials and no BOS, and a Gemma-like SentencePiece with other merges, other special ids
and no space prefix, against the default SentencePiece with a space prefix. Where two vocabularies spell
a text alike the models compute alike (`plain_output`, small `layer_scale`: nearly a bigram model), so
drafts are often accepted, and where they spell it differently they are not.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
from support.exactness import N_SAMPLES, SAMPLED, SIGNIFICANCE, chi_square_p_value, exact_pair_distribution, sampled_pairs
from support.serving import slow_down
from support.tiny_models import (CHAT_TEMPLATE, CONTROL, NORMAL, Tokenizer, byte_level_bpe, sentencepiece_merged_otherwise,
                         write_model)
from typer.testing import CliRunner

from spec_cli import Generation, Pair, SpecError, load_pair
from spec_cli.conversation.session import ChatSession, Settings
from spec_cli.cli.app import app
from spec_cli.decoding.sampling import probabilities
from spec_cli.decoding.stats import Stats
from spec_cli.drafting.text import TextDrafter
from spec_cli.drafting.window import MIN_WINDOW, SINKS
from spec_cli.llama.context import Context
from spec_cli.llama.model import Model
from spec_cli.drafting.vocab import translation

PROMPTS = ("the cat sat on the mat", "café crème 🙂 and the")
SAMPLED_PROMPT = "a cat and the dog"  # the draft's likeliest next tokens are shared ones ("at", BPE's own, is not)
DRAFTS = {"bpe": byte_level_bpe, "sentencepiece": sentencepiece_merged_otherwise}


def finish(generation: Generation) -> Generation:
    for _ in generation:
        pass
    return generation


def near_bigram(path: Path, tokenizer: Tokenizer | None = None, noise: float = 0.0,
                chat_template: str | None = None) -> Path:
    return write_model(path, seed=1, tokenizer=tokenizer, noise=noise, plain_output=True, layer_scale=0.1,
                       chat_template=chat_template)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("text-drafting")
    written = {"target": near_bigram(folder / "target.gguf")}
    for name, tokenizer in DRAFTS.items():
        written[name] = near_bigram(folder / f"{name}.gguf", tokenizer(), noise=0.05)
    written["noisy"] = near_bigram(folder / "noisy.gguf", byte_level_bpe(), noise=0.5)  # often rejected
    return written


@pytest.fixture(scope="module")
def alone(files: dict[str, Path]) -> Iterator[Pair]:
    with load_pair(files["target"]) as pair:
        yield pair


@pytest.fixture(scope="module")
def bpe_pair(files: dict[str, Path]) -> Iterator[Pair]:
    with load_pair(files["target"], files["bpe"]) as pair:
        yield pair


def test_a_pair_of_different_vocabularies_loads_with_a_translation(bpe_pair: Pair) -> None:
    assert bpe_pair.translation is not None
    assert bpe_pair.drafting_modes == ("model", "ngram", "memory", "hybrid")


def test_shared_tokens_spell_alike_in_both_vocabularies(bpe_pair: Pair) -> None:
    both = bpe_pair.translation
    assert both is not None
    pairs = dict(zip(both.shared_draft.tolist(), both.shared_target.tolist()))
    assert len(pairs) > 50
    for d, t in pairs.items():
        assert both.draft.pieces[d] == both.target.pieces[t] and not both.draft.control[d]
    letter_a = both.target.spell(b"a")
    assert letter_a != [both.target.byte_tokens[ord("a")]]  # the target's letter, not its <0x61> fallback
    assert pairs[both.draft.spell(b"a")[0]] == letter_a[0]
    assert both.draft.spell(b" the")[0] in pairs  # Ġthe and ▁the
    assert 1 not in pairs  # <|im_start|> is the draft's control token: never drafted


def test_shared_law_is_the_draft_law_restricted_and_renormalised(bpe_pair: Pair) -> None:
    both = bpe_pair.translation
    assert both is not None
    q = np.zeros(len(both.draft.pieces))
    shared_d = int(both.shared_draft[5])
    q[shared_d], q[1] = 0.3, 0.7  # token 1 is a control token: outside the shared tokens
    law = both.shared_law(q)
    assert law is not None and np.asarray(law).sum() == pytest.approx(1.0)
    over_target = both.over_target(law)
    assert over_target[int(both.shared_target[5])] == pytest.approx(1.0)
    assert both.shared_law(np.eye(len(both.draft.pieces))[1]) is None  # no mass on shared tokens: no draft


def test_aligned_points_spell_the_same_bytes_and_a_half_character_is_held_back(bpe_pair: Pair) -> None:
    both = bpe_pair.translation
    assert both is not None
    tokens = bpe_pair.prompt_tokens("the cat sat on the mat, café", raw=True)
    tokens.append(both.target.byte_tokens[0xE2])  # the first byte of "→"
    spelt, aligned, tail = both.to_draft(tokens, at_start=True)
    assert tokens[0] == both.target.bos and spelt[0] != both.draft.bos  # the draft adds no BOS of its own
    assert tail == b"\xe2"
    assert both.draft.render(spelt) == both.target.render(tokens[1:])[:-1]
    assert len(aligned) > 5
    for i, j in aligned:
        assert both.target.render(tokens[1:i]) == both.draft.render(spelt[:j])


@pytest.mark.parametrize("draft", list(DRAFTS))
@pytest.mark.parametrize("k", [1, 3, "auto"])
def test_greedy_output_equals_the_target_alone(files: dict[str, Path], alone: Pair, draft: str, k: int | str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    totals = Stats(draft_max=0)
    with load_pair(files["target"], files[draft]) as pair:
        if k == "auto":  # a target pass dear enough that drafting pays: on the tiny model itself the planner drafts none
            slow_down(pair, monkeypatch)
        for prompt in PROMPTS:
            reference = finish(alone.generate(prompt, raw=True, max_tokens=40, draft_mode="none"))
            generation = finish(pair.generate(prompt, raw=True, max_tokens=40, draft_max=k, draft_mode="model"))
            assert generation.token_ids == reference.token_ids
            totals.merge(generation.stats)
    assert totals.accepted > 0 and totals.rejected_rounds > 0
    assert totals.convert_s > 0 and 0 < totals.convert_share < 1


@pytest.mark.parametrize("draft", list(DRAFTS))
def test_greedy_output_equals_the_target_alone_the_other_way_round(files: dict[str, Path], draft: str) -> None:
    """The draft's vocabulary as the target's: its BPE or SentencePiece ids are now the truth."""
    with load_pair(files[draft]) as target_alone, load_pair(files[draft], files["target"]) as pair:
        for prompt in PROMPTS:
            reference = finish(target_alone.generate(prompt, raw=True, max_tokens=40, draft_mode="none"))
            generation = finish(pair.generate(prompt, raw=True, max_tokens=40, draft_max=3, draft_mode="model"))
            assert generation.token_ids == reference.token_ids
            assert generation.stats.drafted > 0


def test_hybrid_and_chat_turns_that_extend_the_last_stay_exact(bpe_pair: Pair, alone: Pair) -> None:
    """A second prompt that extends the first (a chat turn) re-spells only what changed; n-gram rounds in
    between leave the draft behind, and it catches up through text."""
    first = alone.prompt_tokens(PROMPTS[0], raw=True)
    answer = finish(alone.generate(first, max_tokens=24, draft_mode="none"))
    second = [*first, *answer.token_ids, *alone.target.tokenize(" and the cat", add_special=False)]
    for prompt in (first, second):
        reference = finish(alone.generate(prompt, max_tokens=32, draft_mode="none"))
        for mode in ("model", "hybrid"):
            generation = finish(bpe_pair.generate(prompt, max_tokens=32, draft_max=3, draft_mode=mode))
            assert generation.token_ids == reference.token_ids


def test_a_dear_catch_up_through_text_drafts_from_a_window_and_stays_exact(files: dict[str, Path],
                                                                             alone: Pair) -> None:
    """A long prompt whose catch-up would cost the draft more than β of the target's prefill: the draft reads the
    sinks and the latest of its spelling only, drafts are still kept, and the output is the target alone's; a
    prompt that extends it keeps that window."""
    long = alone.prompt_tokens(" ".join(["the cat sat on the mat and the dog sat on the log"] * 12), raw=True)
    with load_pair(files["target"], files["bpe"], n_ctx=1024) as pair:
        pair.draft_context.throughput.seed(1e-3)  # the draft takes a stretch in a hundred times dearer
        pair.target_context.throughput.seed(1e-5)
        reference = finish(alone.generate(long, max_tokens=24, draft_mode="none"))
        generation = finish(pair.generate(long, max_tokens=24, draft_max=3, draft_mode="model"))
        assert generation.token_ids == reference.token_ids and generation.stats.accepted > 0
        window = pair.draft_context.n_past
        assert window <= SINKS + MIN_WINDOW + 2 * 24 < len(long)
        longer = [*long, *reference.token_ids, *alone.target.tokenize(" and the cat", add_special=False)]
        reference = finish(alone.generate(longer, max_tokens=24, draft_mode="none"))
        assert finish(pair.generate(longer, max_tokens=24, draft_max=3, draft_mode="model")).token_ids == \
            reference.token_ids
        assert window <= pair.draft_context.n_past < len(longer)


def test_chat_answers_equal_answers_without_drafting(tmp_path: Path, files: dict[str, Path]) -> None:
    """The draft reads the conversation as the target's template writes it: the template's control tokens
    reach it as text, turn after turn, and each turn re-spells only what is new."""
    target = near_bigram(tmp_path / "chat.gguf", chat_template=CHAT_TEMPLATE)
    with load_pair(target, files["bpe"]) as pair:
        speculative = ChatSession(pair, Settings(draft_max=3, draft_mode="model", max_tokens=16))
        alone = ChatSession(pair, Settings(draft_max=3, draft_mode="model", max_tokens=16, use_draft=False))
        for message in ("the cat sat", "and the dog", "café"):
            for session in (speculative, alone):
                for _ in session.reply(message):
                    pass
            assert speculative.turns[-1].content == alone.turns[-1].content
        assert speculative.totals.accepted > 0 and speculative.last is not None
        assert speculative.last.stats.prompt_cached > 0


def test_each_sampled_draft_comes_with_the_law_it_was_drawn_from(files: dict[str, Path], bpe_pair: Pair) -> None:
    """q_i over the target's vocabulary is the draft's own law (its probabilities at its position, restricted
    to shared tokens, renormalised), and the drafted token is in its support."""
    assert bpe_pair.translation is not None and bpe_pair.draft_context is not None
    drafter = TextDrafter(bpe_pair.draft_context, bpe_pair.translation)
    tokens = bpe_pair.prompt_tokens(SAMPLED_PROMPT, raw=True)
    drafter.start(tokens[:-1])
    draft = drafter.propose(tokens, 3, SAMPLED, np.random.default_rng(0))
    assert len(draft.tokens) == 3 and len(draft.q) == 3
    model = Model(files["bpe"])
    check = Context(model, n_ctx=64, n_threads=1)
    try:
        spelt = bpe_pair.translation.draft.spell(bpe_pair.translation.target.render(tokens[1:]))
        for token, q in zip(draft.tokens, draft.q):
            law = bpe_pair.translation.shared_law(probabilities(check.decode(spelt[check.n_past:], 1)[0], SAMPLED))
            assert law is not None
            np.testing.assert_allclose(q, bpe_pair.translation.over_target(law), atol=1e-6)
            assert q[token] > 0 and np.asarray(q).sum() == pytest.approx(1.0)
            spelt.append(int(bpe_pair.translation.shared_draft[bpe_pair.translation.shared_target == token][0]))
    finally:
        check.close()
        model.close()


@pytest.mark.parametrize("verify", ["block", "token"])
def test_sampled_first_two_tokens_follow_the_target(files: dict[str, Path], alone: Pair, verify: str) -> None:
    """χ² at α = SIGNIFICANCE over N_SAMPLES seeded generations, with drafts both kept and rejected."""
    prompt = alone.prompt_tokens(PROMPTS[0], raw=True)  # where the target's law is spread over many pairs
    with load_pair(files["target"], files["noisy"]) as pair:
        observed, totals = sampled_pairs(pair, prompt, SAMPLED, 2, "model", verify)
    assert 0 < totals.accepted < totals.drafted
    assert chi_square_p_value(observed, exact_pair_distribution(alone, prompt), N_SAMPLES) > SIGNIFICANCE


def test_a_draft_that_cannot_spell_plain_text_is_refused_in_one_line(tmp_path: Path, files: dict[str, Path]) -> None:
    # Byte-level BPE with only lower-case letters, the space and the newline: llama.cpp drops what it cannot
    # spell. (A SentencePiece vocabulary without byte fallback would abort llama.cpp on such text instead.)
    letters_only = Tokenizer("gpt2", ["<|endoftext|>", "Ċ", "Ġ", *string.ascii_lowercase, "Ġa"],
                             [CONTROL] + [NORMAL] * 29, bos=0, eos=0, add_bos=False, merges=["Ġ a"])
    path = write_model(tmp_path / "letters.gguf", seed=1, tokenizer=letters_only)
    with pytest.raises(SpecError) as raised:
        translation(Model(files["target"], vocab_only=True), Model(path, vocab_only=True))
    assert "cannot draft for target" in str(raised.value) and "\n" not in str(raised.value)
    result = CliRunner().invoke(app, ["run", "--target", str(files["target"]), "--draft", str(path), "hi"])
    assert result.exit_code == 1 and "cannot draft for target" in result.stderr
    assert "Traceback" not in result.output


def test_spec_run_prints_the_target_s_text_and_says_it_drafts_through_text(files: dict[str, Path]) -> None:
    runner = CliRunner()
    common = ["run", "--temp", "0", "-n", "32", "--raw", "--json", "--target", str(files["target"])]
    fast = runner.invoke(app, [*common, "--draft", str(files["bpe"]), "--draft-mode", "model", "-k", "3", PROMPTS[1]])
    plain = runner.invoke(app, [*common, "--no-draft", PROMPTS[1]])
    assert fast.exit_code == 0 and plain.exit_code == 0, fast.output + plain.output
    fast_data, plain_data = json.loads(fast.stdout), json.loads(plain.stdout)
    assert fast_data["token_ids"] == plain_data["token_ids"] and fast_data["text"] == plain_data["text"]
    assert fast_data["stats"]["accepted"] > 0 and 0 < fast_data["stats"]["convert_share"] < 1
    assert fast.stderr.count("different vocabularies: drafting goes through text (exact)") == 1
    assert "drafting goes through text" not in plain.stderr


def test_models_check_reports_what_drafting_through_text_has_to_work_with(files: dict[str, Path]) -> None:
    result = CliRunner().invoke(app, ["models", "check", str(files["target"]), str(files["bpe"])])
    assert result.exit_code == 0, result.output
    assert "different vocabularies: drafting through text (exact)" in result.stdout
    assert "shared tokens" in result.stdout and "sample text" in result.stdout


def test_bench_shows_the_conversion_share_beside_n_gram_drafting(files: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(app, ["bench", "--target", str(files["target"]), "--draft", str(files["bpe"]),
                                      "-k", "3", "-n", "8", "--task", "chat", "--modes", "model,ngram",
                                      "--json", str(out)], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "conversion" in result.stdout
    shares = {c["label"]: c["time_share"]["convert"] for c in json.loads(out.read_text())["configs"]}
    assert shares["model K=3"] > 0 and shares["ngram K=3"] == 0


def test_under_a_grammar_drafts_through_text_are_cut_where_it_forbids(bpe_pair: Pair, alone: Pair) -> None:
    letters = r'root ::= [a-t ]+ "."'
    for prompt in PROMPTS:
        reference = finish(alone.generate(prompt, raw=True, max_tokens=40, draft_mode="none", grammar=letters))
        generation = finish(bpe_pair.generate(prompt, raw=True, max_tokens=40, draft_max=3, grammar=letters,
                                              draft_mode="model"))
        assert generation.token_ids == reference.token_ids
        assert generation.stats.accepted > 0
