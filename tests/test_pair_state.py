"""A pair's drafting (`drafting.pair_state`): each text starts from an own drafter's acceptance over every text, the
cost book keeps and restores what it learnt (costs by size, how a draft's steps grow with context, the last answers'
lengths), slots share the pair's books where they should, and each book prices its drafter by its declared shape."""

from __future__ import annotations

import pytest

from spec_cli import Pair
from spec_cli.decoding.costs import HOST, PER_ROUND, PER_TOKEN
from spec_cli.drafting.dflash import DFlashDrafter
from spec_cli.drafting.hybrid import HybridDrafter
from spec_cli.drafting.matches import FIRST_ROUNDS
from spec_cli.drafting.model import ModelDrafter
from spec_cli.drafting.modes import MODES
from spec_cli.drafting.ngram import NgramDrafter
from spec_cli.drafting.pair_state import BOOK_ROUNDS, Drafting
from spec_cli.drafting.recall import MemoryDrafter


def test_each_text_starts_from_an_own_drafters_acceptance_over_every_text(other: Pair) -> None:
    """Every controller of the draft model adds its rounds to one pool, which the cost book starts and keeps, with the
    acceptance of each of the last texts; a new generation starts each controller from the pool, not from what the last
    text taught it, and the default drafting prices the model at the best K for that acceptance."""
    drafting = Drafting(other.drafting.sources)
    book = {"accepted": 300.0, "rejections": 10.0, "reached": [100.0, 95.0], "accepted_at": [95.0, 90.0]}
    text = {"accepted": 20.0, "rejections": 4.0, "reached": [10.0, 8.0], "accepted_at": [8.0, 6.0]}
    drafting.seed({"acceptance": {"model": book}, "texts": {"model": [text]}})
    pool = drafting.pooled("model")
    assert pool.every.measured == pytest.approx(100.0) and pool.every.alpha == pytest.approx(300 / 310)
    assert [t.as_counts() for t in pool.texts] == [text]
    pinned = drafting.build("model", 0.0, "auto")[1]
    hybrid = drafting.build("hybrid", 0.0, "auto")[0]
    assert isinstance(hybrid, HybridDrafter)
    default = hybrid.state.lengths["model"]
    assert pinned.acceptance.measured == default.acceptance.measured == BOOK_ROUNDS
    for _ in range(40):  # the last text, drafted under the default: every first draft rejected
        default.update(4, 0)
    hybrid.state.ks["model"] = 1
    assert default.acceptance.alpha < 0.3 < pool.every.alpha < pinned.acceptance.alpha
    drafting.build("model", 0.0, "auto")
    for length in (pinned, default):
        assert length.acceptance.alpha == pytest.approx(pool.every.alpha)
        assert length.acceptance.measured == BOOK_ROUNDS
    assert len(pool.texts) == 2 and pool.texts[-1].alpha == 0.0 and pool.text.measured == 0.0
    assert hybrid.state.ks["model"] == drafting._first_k("model", default, hybrid.state.lookup) != 1
    drafting._verify.record(1, 0.01)  # something measured: the book is written
    learnt = drafting.learnt()
    assert learnt is not None and learnt["acceptance"]["model"] == pool.every.as_counts()
    assert learnt["texts"]["model"] == [text, pool.texts[-1].as_counts()]


def test_a_book_keeps_the_last_answers_lengths_for_the_next_process(other: Pair) -> None:
    """`spec run` answers one prompt a process: the lengths of the last answers (and whether each ended on its own),
    which price an entry into a drafter's regime, are kept in the book and shared by every hybrid of the next one."""
    drafting = Drafting(other.drafting.sources)
    hybrid = drafting.build("hybrid", 0.0, "auto")[0]
    assert isinstance(hybrid, HybridDrafter)
    hybrid.done([1] * 70, 6, ended=True)
    hybrid.done([1] * 30, 6)
    drafting._verify.record(1, 0.01)
    learnt = drafting.learnt()
    assert learnt is not None and learnt["answers"] == [[64, True], [24, False]]
    later = Drafting(other.drafting.sources)
    later.seed({**learnt, "answers": [*learnt["answers"], [-1, True]]})  # a length out of range is left out
    assert list(later.hybrid_state("auto").answers) == [(64, True), (24, False)] == list(later.hybrid_state(5).answers)
    later.seed({**learnt, "answers": [["many", True]]})  # an entry that does not read as one is ignored whole
    assert list(later.hybrid_state("auto").answers) == [(64, True), (24, False)]


def test_a_book_keeps_what_each_band_of_the_lookups_matches_kept_over_every_text(other: Pair) -> None:
    """`spec run` answers one prompt a process: each band of the lookup's matches started every process from its prior
    (one token of two kept). What a band kept over every text, every slot's rounds in it, is kept in the book and is
    where the next process's bands start; a band the process did not draft in keeps the book's."""
    drafting = Drafting(other.drafting.sources)
    slot = Drafting(other.drafting.sources, shared=drafting)
    hybrid = slot.build("hybrid", 0.0, "auto")[0]
    assert isinstance(hybrid, HybridDrafter)
    for _ in range(30):
        hybrid.state.lookup_acceptance(9).update(4, 4)
    drafting._verify.record(1, 0.01)
    learnt = drafting.learnt()
    lookup = hybrid.state.lookup
    assert learnt is not None and set(learnt["matches"][lookup]) == {"8"}
    later = Drafting(other.drafting.sources)
    later.seed({**learnt, "matches": {**learnt["matches"], "n-gram": {"8": {}}}})  # another lookup's: left out
    band = later.hybrid_state("auto").lookup_acceptance(12)
    assert band.measured == pytest.approx(FIRST_ROUNDS) and band.alpha > 0.95
    assert later.hybrid_state("auto").lookup_acceptance(2).alpha == pytest.approx(0.5)  # the prior: none kept
    later._verify.record(1, 0.01)
    assert later.learnt()["matches"][lookup]["8"] == learnt["matches"][lookup]["8"]  # not drafted: the book's stands


def test_a_book_size_dearer_a_row_than_a_smaller_one_is_read_at_the_smaller_ones_rate(other: Pair) -> None:
    """A pass measured while the machine was busy would price its size out of use for good (never chosen, never
    measured again): read from the book, no size costs more a row than a smaller one; cheaper ones stand."""
    drafting = Drafting(other.drafting.sources)
    drafting.seed({"passes": {"1": 0.020, "2": 0.026, "6": 0.038, "7": 0.136, "10": 0.045},
                   "books": {"model": {"draft": {"1": 0.010, "2": 0.016, "3": 0.090}, "per_token": 0.0}}})
    verify, draft = drafting.costs("model").verify, drafting.costs("model").draft
    assert [verify.seconds(rows) for rows in (1, 2, 6, 10)] == pytest.approx([0.020, 0.026, 0.038, 0.045])
    assert verify.seconds(7) == pytest.approx(0.038 * 7 / 6)
    assert [draft.seconds(n) for n in (1, 2, 3)] == pytest.approx([0.010, 0.016, 0.016 * 3 / 2])


def drafted_through_a_text(pair: Pair) -> tuple[Drafting, dict | None]:
    """A drafting of `pair`'s whose draft model stepped through contexts 100..699 at 7 ms + 5 µs a token of context,
    and what it learnt."""
    drafting = Drafting(pair.drafting.sources)
    costs = drafting.costs("model")
    for context in range(100, 700):
        costs.record_round([(1, 0.007 + 0.000005 * context)], 1, verify_s=0.02, round_s=0.03, emitted=2,
                           context=context)
    return drafting, drafting.learnt()


def test_a_book_keeps_how_the_drafts_steps_grow_with_context(other: Pair) -> None:
    """A draft model measured late in a long text must not price the next short prompt at that text's steps: the book
    keeps the steps' mean context and their slope, and a new process reads the draft where its rounds are."""
    _, learnt = drafted_through_a_text(other)
    assert learnt is not None and "draft_context" not in learnt["books"].get("ngram", {})
    kept = learnt["books"]["model"]["draft_context"]
    assert kept["slope"] == pytest.approx(0.000005) and 650 < kept["at"] < 700
    later = Drafting(other.drafting.sources)
    later.seed(learnt)
    later.costs("model").at(100)
    assert later.costs("model").step_costs(1)[0] == pytest.approx(0.0075, rel=0.02)
    later.seed({**learnt, "books": {"model": {**learnt["books"]["model"], "draft_context": {"at": -1, "slope": 0}}}})
    assert later.costs("model").draft_context.prior == pytest.approx(0.000005)  # an entry out of range is ignored


def test_slots_share_the_pairs_books_and_each_reads_its_drafts_steps_where_its_own_rounds_are(other: Pair) -> None:
    """The slots of `--parallel` share the pair's books of passes and of each own drafter's acceptance, and keep their
    own of the draft's steps (a scheduler books a sequence's share of the steps it ran with others), each priced at its
    own sequence's context (a long prompt's rounds beside a short one's), which every book of its ways reads."""
    drafting, learnt = drafted_through_a_text(other)
    assert learnt is not None
    short, long = (Drafting(other.drafting.sources, shared=drafting) for _ in range(2))
    for slot in (short, long):
        slot.seed(learnt)
    assert short.costs("model").verify is long.costs("model").verify is drafting.passes
    assert short.pooled("model").every is long.pooled("model").every is drafting.pooled("model").every
    assert short.costs("model").draft is not drafting.costs("model").draft
    short.costs("hybrid").at(100)  # the round's own book (the default's), as the loop's clock sets it
    long.costs("hybrid").at(4100)
    assert short.costs("model").step_costs(1)[0] == pytest.approx(0.0075, rel=0.02)
    assert long.costs("model").step_costs(1)[0] == pytest.approx(0.0275, rel=0.02)


def test_every_book_shares_the_targets_passes_and_keeps_its_own_steps(other: Pair) -> None:
    books = [other.drafting.costs(name) for name in ("model", "ngram", "hybrid")]
    assert books[0].verify is books[1].verify is books[2].verify
    assert len({id(book) for book in books}) == 3 and len({id(book.draft) for book in books}) == 3


def test_each_book_prices_its_drafter_as_the_drafter_declares(other: Pair) -> None:
    """The cost shape is the drafter's own word (`Drafter.cost_shape`), not the registry's: a lookup costs host time,
    a model a step a token, a block drafter a pass a round; the registry only reads it."""
    assert (NgramDrafter.cost_shape, MemoryDrafter.cost_shape, ModelDrafter.cost_shape) == (HOST, HOST, PER_TOKEN)
    assert DFlashDrafter.cost_shape == PER_ROUND
    shapes = [other.drafting.costs(name).shape for name in ("model", "ngram", "hybrid")]
    assert shapes == [PER_TOKEN, HOST, HOST]
    assert all(mode.cost_shape == (mode.drafter.cost_shape if mode.drafter else HOST) for mode in MODES.values())
