"""Drafting from memory: outputs remembered and drafted from, bounded, kept in a file that two processes may
share and that a foreign or damaged copy never spoils; exact as every drafter (greedy identity with
rejections, χ² at α = 0.001)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from spec_cli import Pair, SamplingParams, load_pair
from spec_cli.cli.app import app
from spec_cli.decoding.stats import Stats
from spec_cli.drafting import memory_file
from spec_cli.drafting.hybrid import HybridDrafter
from spec_cli.drafting.memory_file import MemoryFileError
from spec_cli.drafting.recall import CONTEXT, MemoryDrafter, OutputMemory, corpus_files
from spec_cli.errors import SpecError
from support.exactness import (N_SAMPLES, REPETITIVE, SAMPLED, SIGNIFICANCE, against_alone, assert_greedy_identity,
                       chi_square_p_value, exact_pair_distribution, finish, greedy_agreement, priced_to_draft,
                       sampled_pairs)
from support.tiny_models import write_model

runner = CliRunner()
GREEDY = SamplingParams()
RNG = np.random.default_rng(0)


def test_a_finished_generation_is_drafted_from_by_the_next() -> None:
    memory = OutputMemory("v")
    first = MemoryDrafter(memory, n_vocab=100)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    first.prefill(prompt)
    first.done([*prompt, 50, 51, 52, 53], len(prompt))
    assert memory.documents == 1 and len(memory.outputs) == CONTEXT + 4
    second = MemoryDrafter(memory, n_vocab=100)
    again = [30, 31, *prompt[-4:]]  # another prompt that ends as the first did (a template's last markers)
    second.prefill(again)
    assert second.propose(again, 3, GREEDY, RNG).tokens == [50, 51, 52]
    sampled = second.propose(again, 3, SamplingParams(temperature=1.0), RNG)
    assert [q.at(None).tolist().index(1.0) for q in sampled.q] == sampled.tokens  # one-hot q: exact when sampled


def test_the_oldest_outputs_go_first_past_the_capacity() -> None:
    memory = OutputMemory("v", capacity=100)
    for i in range(10):
        memory.remember([i] * 20)
    assert len(memory.outputs) <= 100 and memory.documents < 10
    kept = [doc[0] for doc in memory_file.split(memory.outputs.tokens)]
    assert kept == list(range(10 - len(kept), 10))


def test_the_file_keeps_outputs_for_the_next_process(tmp_path: Path) -> None:
    path = tmp_path / "memory.npz"
    memory = OutputMemory("vocabulary-a")
    memory.remember([1, 2, 3, 4, 5])
    memory.save(path)
    loaded = OutputMemory("vocabulary-a")
    assert loaded.load(path) == 1 and loaded.outputs.tokens.tolist() == [1, 2, 3, 4, 5]
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []


def test_two_processes_sharing_a_file_lose_neither_ones_outputs(tmp_path: Path) -> None:
    path = tmp_path / "memory.npz"
    one, two = OutputMemory("v"), OutputMemory("v")
    for memory in (one, two):
        memory.load(path)
    one.remember([1, 1, 1])
    two.remember([2, 2, 2])
    one.save(path)
    two.save(path)  # reads what `one` saved meanwhile, then adds its own
    assert memory_file.read(path, "v") == [[1, 1, 1], [2, 2, 2]]


@pytest.mark.parametrize("content, reason", [
    (b"not a zip file at all", "not a spec-cli memory file"),
    (None, "another vocabulary"),
])
def test_a_damaged_or_foreign_file_is_refused_with_its_reason(tmp_path: Path, content: bytes | None,
                                                              reason: str) -> None:
    path = tmp_path / "memory.npz"
    if content is None:
        memory = OutputMemory("vocabulary-b")
        memory.remember([7, 8, 9])
        memory.save(path)
    else:
        path.write_bytes(content)
    with pytest.raises(MemoryFileError, match=reason):
        OutputMemory("vocabulary-a").load(path)


def test_a_pair_ignores_a_damaged_memory_file_in_one_line_and_replaces_it(alone: Pair, tmp_path: Path) -> None:
    path = tmp_path / "memory.npz"
    path.write_bytes(b"PK\x03\x04 truncated")
    said = alone.keep_memory(path)
    assert said is not None and said.startswith(f"ignoring the memory file {path}: ") and "\n" not in said
    finish(alone.generate(REPETITIVE, raw=True, max_tokens=6, draft_mode="memory", draft_max=3))
    alone.output_memory.save(path)
    assert len(memory_file.read(path, alone.output_memory.vocabulary)) >= 1
    alone.memory_path = None


def test_the_vocabulary_key_tells_tokenizers_apart(alone: Pair, chat_pair: Pair, tmp_path: Path) -> None:
    key = memory_file.vocabulary_key(alone.target)
    assert key == alone.output_memory.vocabulary == memory_file.vocabulary_key(chat_pair.target)  # one tokenizer
    with load_pair(write_model(tmp_path / "smaller.gguf", seed=1, vocab_size=300)) as smaller:
        assert memory_file.vocabulary_key(smaller.target) != key


def test_a_corpus_is_drafted_from(alone: Pair, tmp_path: Path) -> None:
    folder = tmp_path / "repo"
    (folder / ".git").mkdir(parents=True)
    (folder / ".git" / "HEAD").write_text("ref: main")
    (folder / "notes.txt").write_text("the quick brown fox jumps over the lazy dog")
    (folder / "blob.bin").write_bytes(b"\0\1\2")
    assert [p.name for p in corpus_files([folder])] == ["blob.bin", "notes.txt"]
    memory = OutputMemory("v")
    assert memory.read_corpus([folder], lambda text: alone.target.tokenize(text, add_special=False))[0] == 1
    drafter = MemoryDrafter(memory, alone.target.n_vocab)
    context = alone.target.tokenize("what does the quick brown", add_special=False)
    drafter.prefill(context)
    assert drafter.propose(context, 4, GREEDY, RNG).tokens
    with pytest.raises(SpecError, match="no such file or folder"):
        corpus_files([tmp_path / "missing"])


def test_greedy_drafting_from_remembered_outputs_equals_the_target_alone(other: Pair) -> None:
    """Sampled answers are remembered first, so the memory's drafts are often wrong: rejections happen."""
    other.output_memory.forget()
    prompt = other.prompt_tokens(REPETITIVE, raw=True)
    for seed in range(3):
        finish(other.generate(prompt, sampling=SAMPLED, seed=seed, max_tokens=24, draft_mode="none"))
    assert other.output_memory.documents == 0  # the target alone drafts nothing and remembers nothing
    for seed in range(3):
        finish(other.generate(prompt, sampling=SAMPLED, seed=seed, max_tokens=24, draft_mode="memory"))
    assert other.output_memory.documents == 3
    totals = Stats(draft_max=0)
    assert_greedy_identity(other.target, prompt, against_alone(other, totals, draft_mode="memory", draft_max=4), 32)
    assert totals.drafted > totals.accepted > 0


def test_sampled_drafting_from_memory_follows_the_target(alone: Pair) -> None:
    """Every seeded run drafts from the answers of the runs before it: the memory is at work, and the first
    two tokens still follow the target's law."""
    alone.output_memory.forget()
    priced_to_draft(alone)
    prompt = alone.prompt_tokens(REPETITIVE, raw=True)
    observed, totals = sampled_pairs(alone, prompt, SAMPLED, 2, "memory", n=N_SAMPLES)
    assert totals.drafted > 0 and totals.accepted < totals.drafted
    assert chi_square_p_value(observed, exact_pair_distribution(alone, prompt), N_SAMPLES) > SIGNIFICANCE


def test_a_memory_that_cannot_be_saved_is_one_line(target_path: Path, tmp_path: Path) -> None:
    in_the_way = tmp_path / "memory.npz"
    in_the_way.mkdir()  # a folder where the file should go
    pair = load_pair(target_path)
    assert pair.keep_memory(in_the_way) is not None
    finish(pair.generate(REPETITIVE, raw=True, max_tokens=4, draft_mode="memory", draft_max=2))
    with pytest.raises(SpecError, match=f"^cannot save the memory to {in_the_way}: "):
        pair.close()


def test_a_second_process_drafts_from_the_saved_memory_on_its_first_request(target_path: Path, tmp_path: Path) -> None:
    memory = tmp_path / "run.mem"
    asked = ["run", "--target", str(target_path), "--raw", "--json", "-n", "16", "--draft-mode", "memory", "-k", "4"]
    first = runner.invoke(app, [*asked, "--memory", str(memory), "a b c d"])
    assert first.exit_code == 0, first.output
    again = json.loads(runner.invoke(app, [*asked, "--memory", str(memory), "a b c d"]).stdout)
    forgot = json.loads(runner.invoke(app, [*asked, "--no-memory", "a b c d"]).stdout)
    with load_pair(target_path) as pair:
        greedy_agreement(pair.target, pair.prompt_tokens("a b c d", raw=True), again["token_ids"],
                         forgot["token_ids"])
    assert again["stats"]["accepted"] >= 8 > forgot["stats"]["accepted"]


def test_memory_flags_are_checked_before_loading(target_path: Path, tmp_path: Path) -> None:
    both = runner.invoke(app, ["run", "--target", str(target_path), "--memory", str(tmp_path / "m"), "--no-memory", "hi"])
    assert both.exit_code == 1 and "give either --memory FILE or --no-memory, not both" in both.stderr
    missing = runner.invoke(app, ["run", "--target", str(target_path), "--lookup-corpus", str(tmp_path / "none"), "hi"])
    assert missing.exit_code == 1 and missing.stderr.strip().endswith("no such file or folder")
    damaged = tmp_path / "damaged.mem"
    damaged.write_bytes(b"garbage")
    ran = runner.invoke(app, ["run", "--target", str(target_path), "--raw", "-n", "4", "--memory", str(damaged), "hi"])
    assert ran.exit_code == 0 and f"ignoring the memory file {damaged}" in ran.stderr


def test_every_slot_drafts_from_the_pairs_one_memory(other: Pair) -> None:
    slots = other.slots(2)
    assert all(slot.drafting.sources.memory is other.output_memory for slot in slots)
    drafter, _ = slots[1].drafting.build("hybrid", 0.0, "auto")
    assert isinstance(drafter, HybridDrafter) and drafter.lookup.memory is other.output_memory
