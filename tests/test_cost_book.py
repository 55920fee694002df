"""The cost book: what a pair measured is kept when it closes, and the next process on this machine starts from
it (costs known, K at the best the costs say, no warm-up); a damaged book is ignored, never fatal."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support import children
from typer.testing import CliRunner

from spec_cli import GenerationRequest, load_pair
from spec_cli.decoding.sampling import SamplingParams
from spec_cli.decoding.scheduler import Scheduler
from spec_cli.cli.app import app
from spec_cli.decoding.draft_length import AdaptiveK
from spec_cli.drafting import cost_book
from spec_cli.llama import kernels

PROMPT = "the cat and the dog"


def measure(target: Path, draft: Path, threads: int = 2) -> dict:
    """Generate once with the draft model at K auto, close, and return what the book holds."""
    with load_pair(target, draft, n_threads=threads) as pair:
        for _ in pair.generate(PROMPT, raw=True, max_tokens=40, draft_mode="model", draft_max="auto", seed=1):
            pass
    return cost_book.read_all()


def test_a_closed_pair_keeps_what_it_measured(target_path: Path, other_draft_path: Path) -> None:
    book = measure(target_path, other_draft_path)
    [entry] = book.values()
    assert entry["machine"] == kernels.machine_key() and entry["cpu"] == kernels.cpu_name()
    assert entry["pair"] == [target_path.name, other_draft_path.name]
    assert "1" in entry["passes"] and "1" in entry["books"]["model"]["draft"]  # the target's passes by rows
    assert entry["books"]["model"]["per_row"] > 0  # and the work on their rows (p, the verification) apart
    assert entry["acceptance"]["model"]["reached"][0] > 0
    assert cost_book.this_machine() == [entry]


def test_the_next_pair_starts_from_the_book(target_path: Path, other_draft_path: Path) -> None:
    """The book's means seed the next pair's costs (read as means: a price reads them through the monotone fit, which
    pools a noisy c(1) above c(2), as a tiny model's sub-millisecond steps under CI's load once had)."""
    [entry] = measure(target_path, other_draft_path).values()
    with load_pair(target_path, other_draft_path, n_threads=2) as pair:
        costs = pair.drafting.costs("model")
        assert costs.draft.mean(1) == pytest.approx(entry["books"]["model"]["draft"]["1"], rel=1e-9)
        assert costs.verify.mean(1) == pytest.approx(entry["passes"]["1"], rel=1e-9)
        assert costs.per_row == pytest.approx(entry["books"]["model"]["per_row"])
        length = pair.drafting.build("model", 0.0, "auto")[1]
        assert isinstance(length, AdaptiveK) and length.priced  # no warm-up: the planner prices it at once
        assert length.acceptance.alpha == pytest.approx(entry["acceptance"]["model"]["accepted"] / (
            entry["acceptance"]["model"]["accepted"] + entry["acceptance"]["model"]["rejections"]))
        assert length.acceptance.measured <= 8.0  # a prior that the rounds measured now soon outweigh
        for slot in pair.slots(2):  # each slot of `--parallel` starts from the book too, not cold
            assert slot.drafting.costs("model").draft.mean(1) == pytest.approx(entry["books"]["model"]["draft"]["1"],
                                                                               rel=1e-9)


def on_slots(target: Path, draft: Path) -> tuple[list, dict, dict]:
    """Two generations on two slots under one scheduler, the draft model at K = 4; the pair closed after. Returns them,
    and as the pair's drafting stood before it closed: what it keeps, and its own book of the draft's steps."""
    request = GenerationRequest(sampling=SamplingParams(), draft_max=4, draft_mode="model", max_tokens=40)
    with load_pair(target, draft, n_threads=2) as pair:
        scheduler = Scheduler()
        generations = [slot.generate(pair.prompt_tokens(prompt, raw=True), request)
                       for slot, prompt in zip(pair.slots(2), (PROMPT, "a dog and a cat and a dog"))]
        for generation in generations:
            scheduler.join(generation)
        while len(scheduler):
            scheduler.step()
        return generations, pair.drafting.learnt() or {}, pair.drafting.costs("model").draft.as_dict()


def test_what_the_slots_of_parallel_learnt_is_kept(target_path: Path, other_draft_path: Path) -> None:
    """Under `--parallel` the pair's own drafting never runs: the draft's acceptance its slots measured, over every text
    and on each, is what the book keeps (each slot kept its own before, and a batch's process left the book's as it
    found it), and so are the draft's steps where the pair measured none (a slot books a step it shared as its share
    of the pass: cheaper than a lone step, dearer than the free price of one never measured, with which the next
    process tried the draft model again); where the book held a lone generation's steps, they stand."""
    generations, _, _ = on_slots(target_path, other_draft_path)
    assert all(generation.stats.reached_at[:1] >= [3] for generation in generations)  # rounds that drafted
    [entry] = cost_book.read_all().values()
    assert entry["acceptance"]["model"]["reached"][0] > 0
    assert len(entry["texts"]["model"]) == 2  # each slot's text, as it stood when the pair closed
    assert entry["books"]["model"]["draft"]["1"] > 0
    cost_book.path().unlink()
    measure(target_path, other_draft_path)
    _, learnt, own = on_slots(target_path, other_draft_path)
    assert own and learnt["books"]["model"]["draft"] == own  # the lone book (read at this process's load) stands


def test_another_thread_count_is_another_entry(target_path: Path, other_draft_path: Path) -> None:
    measure(target_path, other_draft_path, threads=2)
    assert len(measure(target_path, other_draft_path, threads=1)) == 2


def test_a_pair_that_measured_nothing_writes_nothing(target_path: Path) -> None:
    load_pair(target_path, n_threads=2).close()
    assert not cost_book.path().exists()


def test_a_damaged_book_is_ignored(target_path: Path, other_draft_path: Path) -> None:
    cost_book.path().write_text("{ not json")
    assert len(measure(target_path, other_draft_path)) == 1  # read as empty, then written whole
    key = next(iter(cost_book.read_all()))
    cost_book.path().write_text(json.dumps({key: {"passes": {"1": -1.0}, "books": "nonsense"}}))
    with load_pair(target_path, other_draft_path, n_threads=2) as pair:
        assert pair.drafting.costs("model").verify.seconds(1) is None  # the whole entry is left aside


def test_a_book_written_before_passes_were_kept_by_rows_is_read_by_rows(target_path: Path,
                                                                        other_draft_path: Path) -> None:
    """An entry that holds the target's passes by K ("verify", a pass of K + 1 rows) seeds them by rows."""
    [(key, entry)] = measure(target_path, other_draft_path).items()
    by_k = {"0": 0.020, "4": 0.030}
    del entry["passes"]
    cost_book.path().write_text(json.dumps({key: {**entry, "verify": by_k}}))
    with load_pair(target_path, other_draft_path, n_threads=2) as pair:
        verify = pair.drafting.costs("model").verify
        assert [verify.seconds(1), verify.seconds(5)] == pytest.approx([0.020, 0.030])


def test_doctor_reads_the_book_for_this_machine(target_path: Path, other_draft_path: Path) -> None:
    """The draft's step against the target's, and the speed-up the cost model predicts from the costs and the
    acceptance measured here; before anything is measured, where the book will be."""
    before = CliRunner().invoke(app, ["doctor"], env={"COLUMNS": "400"})
    assert before.exit_code == 0 and "nothing yet: spec run, chat, serve and bench keep their costs in" in before.stdout
    [entry] = measure(target_path, other_draft_path).values()
    step, target = entry["books"]["model"]["draft"]["1"], entry["passes"]["1"]
    [line] = cost_book.reading(entry)
    assert line.startswith(f"model: a draft step costs {step / target:.2f} of a target step here; at acceptance ")
    assert re.search(r"the cost model predicts \d+\.\d\d× at K = \d+", line)
    shown = CliRunner().invoke(app, ["doctor"], env={"COLUMNS": "400"})
    assert shown.exit_code == 0 and f"measured here: {target_path.name} ← {other_draft_path.name}" in shown.stdout
    assert f"a draft step costs {step / target:.2f} of a target step here" in shown.stdout
    assert kernels.cpu_name() in shown.stdout


WRITER = """
import sys
from spec_cli.drafting import cost_book
name = sys.argv[1]
for i in range(25):
    cost_book.write(f"{name}-{i % 5}", {"passes": {"1": 0.01}, "books": {}, "filler": "x" * 20000})
"""


def test_processes_that_write_at_once_keep_every_entry_and_a_reader_never_fails(tmp_path: Path) -> None:
    """Four processes replace the book 25 times each while this one reads it: every read is a whole book, and
    the book ends with all 20 keys (each write merges under the lock what the others kept)."""
    import os
    import sys

    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    writers = [children.popen([sys.executable, str(script), f"p{n}"], env=os.environ.copy()) for n in range(4)]
    reads = 0
    while any(writer.poll() is None for writer in writers):
        if cost_book.path().exists():
            text = cost_book.path().read_text()
            assert isinstance(json.loads(text), dict)  # never half a file
            reads += 1
    assert [writer.returncode for writer in writers] == [0] * 4
    assert reads > 0
    assert sorted(cost_book.read_all()) == sorted(f"p{n}-{i}" for n in range(4) for i in range(5))
