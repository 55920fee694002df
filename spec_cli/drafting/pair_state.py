"""A pair's drafting: the models its drafters draw on (`modes.Sources`) and what they learn across generations (the
loop's costs, one K controller per mode, drafter and K, each own drafter's acceptance pooled over texts, the hybrid's
state), so that one prompt (or chat turn) starts where the last left off, and a new process where the last one on
this machine left off: what it keeps in the cost book (`learnt`) and starts from (`seed`), with the entry's parsing.
"""

from __future__ import annotations

from collections import deque
from typing import Any
from weakref import WeakSet

from spec_cli.decoding.batch_costs import BatchCosts
from spec_cli.decoding.costs import DECAY, LoopCosts, Position
from spec_cli.decoding.draft_length import (AUTO_K_MAX, POOLED_DECAY, AdaptiveK, DraftLength, FixedK, Pool,
                                            PositionAcceptance)
from spec_cli.decoding.drafter import Drafter
from spec_cli.drafting.hybrid import K_START
from spec_cli.drafting.hybrid_state import ANSWERS_KEPT, MEMORY, NGRAM, HybridState
from spec_cli.drafting.matches import BANDS, MatchPools
from spec_cli.drafting.modes import MODES, NONE, Mode, Sources, mode
from spec_cli.drafting.window import DraftMemory
from spec_cli.errors import SpecError

BOOK_CALLS = 4.0  # calls each mean in the cost book counts as when a pair starts from it
BOOK_ROUNDS = 8.0  # rounds' worth of an own drafter's acceptance that a text starts from


class Drafting:
    """A pair's drafting: its `Sources`, and what its drafters learn, kept across generations. `shared`: the drafting of
    the pair whose sequence this one is (a slot of `--parallel`), whose books this one reads and adds to: the target's
    passes (one scheduler runs every slot's rows in one pass and books it once), each own drafter's acceptance over every
    text and the last texts', the last answers' lengths; the pair keeps them in the cost book when it closes. Its own are
    its drafters' state on its text and the books of their steps and the loop's work, which a scheduler books as each
    sequence's share of the passes it ran with others (a lone sequence's step priced at a batch's share drafts too
    much)."""

    def __init__(self, sources: Sources, shared: Drafting | None = None) -> None:
        self.sources = sources
        self._shared = shared
        # What the draft's context holds of the sequence (all of it, or a window), across generations.
        self.draft_memory = DraftMemory(sources.draft, sources.target) if sources.draft is not None else None
        # The target's passes by rows, whoever drafted: one for every book.
        self._verify = shared.passes if shared is not None else BatchCosts(DECAY)
        self._position = Position()  # where this sequence's rounds are, which every book of its ways reads c_d at
        self._costs: dict[str, LoopCosts] = {}
        self._lengths: dict[tuple[str, str, int | str], DraftLength] = {}
        self._hybrids: dict[int | str, HybridState] = {}
        self._acceptance: dict[str, dict[str, float | list[float]]] = {}  # the cost book's, by own drafter
        self._texts: dict[str, list[dict[str, float | list[float]]]] = {}  # the cost book's, by own drafter
        self._pooled: dict[str, Pool] = {}  # by own drafter, over every text (`pooled`)
        self._matched: dict[str, dict[int, dict[str, float | list[float]]]] = {}  # the cost book's, by lookup and band
        self._matches: dict[str, MatchPools] = {}  # by lookup, each band over every text (`match_pools`)
        # The last answers' (length, whether it ended on its own), every hybrid's: what an entry pays back over.
        self._answers: deque[tuple[int, bool]] = shared._answers if shared is not None else deque(maxlen=ANSWERS_KEPT)
        self._sequences: WeakSet[Drafting] = WeakSet()  # the slots' draftings that share this one (`_kept_books`)
        if shared is not None:
            shared._sequences.add(self)

    @property
    def modes(self) -> tuple[str, ...]:
        """The ways this pair can draft (the target alone aside)."""
        return tuple(m.name for m in MODES.values() if m is not NONE and m.available(self.sources))

    def own_models(self) -> tuple[str, ...]:
        """Every mode that drafts with a model of this pair's own."""
        return tuple(m.name for m in MODES.values() if m.own_model and m.available(self.sources))

    def check(self, name: str) -> Mode:
        """The mode called `name`, if this pair can draft that way."""
        found = mode(name)
        if not found.available(self.sources):
            raise SpecError(found.missing(self.sources))
        return found

    def build(self, name: str, p_min: float, k: int | str) -> tuple[Drafter | None, DraftLength]:
        """The drafter for mode `name` and the controller of its K, for a new text: every own drafter's
        controller starts again from that drafter's acceptance over every text (`PositionAcceptance.new_text`), and the
        default drafting prices each own drafter at the best K for it (`_first_k`): the K the planner last gave a way
        is kept while the way is not drafted, and a way priced at a K that was best on another text (3, where its
        best was 9) was never drafted again."""
        self.end_text()
        built = self.check(name).build(self, p_min, k)
        for length in self._lengths.values():
            length.acceptance.new_text(BOOK_ROUNDS)
        for state in self._hybrids.values():
            for way in state.ks.keys() & self._pooled.keys():
                state.ks[way] = self._first_k(way, state.lengths[way], state.lookup)
        return built

    def end_text(self) -> None:
        """The text drafted in last ends: each own drafter's acceptance on it joins the last texts' (a slot's, before
        its pair keeps them in the cost book)."""
        for pool in self._pooled.values():
            pool.new_text()

    @property
    def passes(self) -> BatchCosts:
        """The target's passes by rows: the book every mode's costs share, and the planner's c(R)."""
        return self._verify

    def costs(self, name: str) -> LoopCosts:
        """The running costs mode `name`'s rounds are priced with and recorded in: its drafter's decodes and the
        loop's work its own, the target's passes shared."""
        if name not in self._costs:
            self._costs[name] = LoopCosts.sharing(self._verify, DECAY, MODES[name].cost_shape, self._position)
        return self._costs[name]

    def length(self, key: tuple[str, str, int | str], drafter: str, limit: int = AUTO_K_MAX,
               planned: bool = False) -> DraftLength:
        """The controller of K under `key` (mode, drafter, K asked) for `drafter` (a mode's name), priced with
        that drafter's costs, at most `limit` a round; kept across generations. An own drafter's starts each text
        from its acceptance over every text (`pooled`), the cost book's to begin with. `planned`: under auto the
        planner chooses this way's K round by round (a way of the default drafting), so it only keeps acceptance, at
        most `limit`."""
        if key not in self._lengths:
            k = key[2]
            length: DraftLength = FixedK(min(k, limit)) if k != "auto" else FixedK(min(AUTO_K_MAX, limit)) \
                if planned else AdaptiveK(self.costs(drafter), k_max=min(AUTO_K_MAX, limit))
            if drafter in self.own_models():
                pool = length.acceptance.pooled = self.pooled(drafter)
                if pool.every.measured:
                    length.seed(pool.every.as_counts(), BOOK_ROUNDS)
            self._lengths[key] = length
        return self._lengths[key]

    def pooled(self, drafter: str) -> Pool:
        """Own drafter `drafter`'s acceptance over every text and on each of the last texts, which each of its
        controllers adds its rounds to: the cost book's to begin with (over every text, worth as many rounds as its
        decay keeps)."""
        if drafter in self._pooled:
            return self._pooled[drafter]
        if self._shared is not None:  # the pair's, this sequence's text its own
            pool = self._pooled[drafter] = Pool(POOLED_DECAY, shared=self._shared.pooled(drafter))
            return pool
        pool = self._pooled[drafter] = Pool(POOLED_DECAY)
        if drafter in self._acceptance:
            pool.every.seed(self._acceptance[drafter], 1.0 / (1.0 - POOLED_DECAY))
        for counts in self._texts.get(drafter, []):
            text = PositionAcceptance()
            text.seed(counts, float("inf"))
            pool.texts.append(text)
        return pool

    def match_pools(self, lookup: str) -> MatchPools:
        """The acceptance over every text of each band of match of lookup `lookup` (`drafting.matches`): the pair's,
        which its slots share, the cost book's to begin with."""
        if lookup not in self._matches:
            shared = self._shared.match_pools(lookup) if self._shared is not None else None
            pools = self._matches[lookup] = MatchPools(POOLED_DECAY, shared)
            for key, counts in self._matched.get(lookup, {}).items():
                pools.of(key).every.seed(counts, 1.0 / (1.0 - POOLED_DECAY))
        return self._matches[lookup]

    def hybrid_state(self, k: int | str) -> HybridState:
        """What the hybrid drafting with K = `k` has learnt: a K controller for each of its drafters."""
        if k not in self._hybrids:
            lookup = MEMORY if self.sources.memory is not None else NGRAM
            planned = k == "auto"
            lengths = {lookup: self.length(("hybrid", lookup, "auto"), lookup, planned=planned)}
            for name in self.own_models():
                own = MODES[name]
                lengths[name] = self.length(("hybrid", name, k), name, own.k_limit(self.sources), planned)
            ks = {name: self._first_k(name, length, lookup) for name, length in lengths.items()} if planned else {}
            self._hybrids[k] = HybridState(lengths, lookup, ks=ks, answers=self._answers, pools=self.match_pools(lookup))
        return self._hybrids[k]

    def _first_k(self, name: str, length: DraftLength, lookup: str) -> int:
        """The K a way of the default drafting is priced at before the planner has given it one: the best by the costs
        and acceptance the cost book holds (a draft model priced at K = 4 looked 1.1x the target alone on the demo pair
        where at its best K it runs 1.3x, and was never chosen), else `K_START`."""
        costs = self.costs("hybrid" if name == lookup else name)
        return costs.best_k(length.acceptance, range(1, length.k_max + 1)) or min(K_START, length.k_max)

    def seed(self, entry: dict[str, Any] | None) -> None:
        """Start from a cost book's entry (`learnt`'s form): each mean counts as `BOOK_CALLS` calls (at most as dear
        a row as a smaller size's, `_capped`), each own drafter's acceptance as up to `BOOK_ROUNDS` rounds, the rates
        at which the target and the draft take in a stretch as a few chunks (`Throughput`). An entry that does not
        read as such is ignored. A drafting that shares its pair's books (`shared`) takes only its own from it."""
        if not entry:
            return
        try:
            passes = entry_passes(entry)
            books = {name: (_capped(_means(book.get("draft", {})), rows=0), float(book.get("per_token", 0.0)),
                            float(book.get("per_row", 0.0)), _context(book.get("draft_context")))
                     for name, book in entry.get("books", {}).items() if name in MODES}
            acceptance = {name: _counts(counts) for name, counts in entry.get("acceptance", {}).items()
                          if name in self.own_models()}
            texts = {name: [_counts(counts) for counts in kept] for name, kept in entry.get("texts", {}).items()
                     if name in self.own_models()}
            throughput = {name: float(rate) for name, rate in entry.get("throughput", {}).items()
                          if name in ("target", "draft") and 0.0 < float(rate) < 1e3}
            answers = [(int(n), bool(ended)) for n, ended in entry.get("answers", []) if int(n) >= 0]
            matched = {lookup: {int(key): _counts(counts) for key, counts in bands.items() if int(key) in BANDS}
                       for lookup, bands in entry.get("matches", {}).items() if lookup in (MEMORY, NGRAM)}
        except (AttributeError, KeyError, TypeError, ValueError):
            return
        for name, (draft, per_token, per_row, context) in books.items():
            costs = self.costs(name)
            costs.draft.seed(draft, BOOK_CALLS)
            if context is not None:
                costs.draft_context.seed(context, BOOK_CALLS)
            costs.other_s, costs.other_tokens = BOOK_CALLS * per_token, BOOK_CALLS
            costs.row_s, costs.rows = BOOK_CALLS * per_row, BOOK_CALLS
        if self._shared is not None:
            return
        for name, rate in throughput.items():
            context = self.sources.target if name == "target" else self.sources.draft
            if context is not None:
                context.throughput.seed(rate)
        self._verify.seed(passes, BOOK_CALLS)
        self._acceptance, self._texts, self._pooled = acceptance, texts, {}
        self._matched, self._matches = matched, {}
        self._answers.clear()
        self._answers.extend(answers)

    def learnt(self) -> dict[str, Any] | None:
        """What to keep in the cost book: the costs measured so far, each own drafter's acceptance over every text and
        on each of the last texts, each lookup's by band of match over every text, and the last answers' lengths (a
        process that answers one prompt, as `spec run` does, otherwise prices an entry before any); None when nothing
        was measured."""
        if not self._verify.weight:
            return None
        own = self.own_models()
        acceptance = {name: pool.every.as_counts() for name, pool in self._pooled.items() if pool.every.measured}
        texts = {name: [text.as_counts() for text in pool.kept()] for name, pool in self._pooled.items()}
        matches = {lookup: {str(key): counts for key, counts in bands.items()} for lookup, bands in self._matched.items()}
        for lookup, pools in self._matches.items():  # the book's bands stand where this process measured none
            matches.setdefault(lookup, {}).update({str(key): pool.every.as_counts() for key, pool in pools.pools.items()
                                                   if pool.every.measured})
        # Only own drafters decode to draft: the other books' steps are not theirs (the hybrid's mixes them).
        books = {name: {"draft": costs.draft.as_dict() if name in own else {}, "per_token": costs.per_token,
                        "per_row": costs.per_row,
                        **({"draft_context": costs.draft_context.as_dict()}
                           if name in own and costs.draft_context.at is not None else {})}
                 for name, costs in self._kept_books().items()}
        throughput = {name: context.throughput.per_token
                      for name, context in (("target", self.sources.target), ("draft", self.sources.draft))
                      if context is not None and context.throughput.per_token is not None}
        return {"passes": self._verify.as_dict(), "books": books, "acceptance": {**self._acceptance, **acceptance},
                "texts": {**self._texts, **texts}, "throughput": throughput,
                "matches": matches,
                "answers": [[n, ended] for n, ended in self._answers]}

    def _kept_books(self) -> dict[str, LoopCosts]:
        """Each mode's running costs to keep: this drafting's own, and where it measured nothing for a mode, its slots'
        together (a process whose generations all ran on slots: `spec serve --parallel N`, `spec batch`). Only the
        pair's own were kept: such a process left the book without the draft model's steps, and the next one priced
        them as unmeasured (free, to be tried): `spec batch --parallel 2` run twice from an empty book tried the draft
        model again in the second process (13 rounds, 8.8 s against 8.1 with the first's steps kept). A slot books a
        step it shared as its share of the pass, at most what a lone step costs: less optimistic than free, and a lone
        generation's own steps soon replace it."""
        merged: dict[str, LoopCosts] = {}
        for sequence in self._sequences:
            for name, costs in sequence._costs.items():
                own = self._costs.get(name)
                if own is not None and (own.draft.weight or own.other_tokens):
                    continue  # measured here, or seeded from the book: it stands
                if name not in merged:
                    merged[name] = LoopCosts(DECAY, costs.shape)
                merged[name].merge(costs)
        return {**self._costs, **merged}


def entry_passes(entry: dict[str, Any]) -> dict[str, float]:
    """A cost book entry's target passes by rows (c_v(R), `_capped`); an entry written before they were kept by rows
    holds them by K under "verify" (a pass of K + 1 rows). ValueError where a cost is out of range."""
    if "passes" in entry:
        return _capped(_means(entry["passes"]), rows=0)
    return {str(int(k) + 1): seconds for k, seconds in _capped(_means(entry.get("verify", {})), rows=1).items()}


def _means(means: dict[str, float]) -> dict[str, float]:
    """A cost book's means by size, checked: sizes are counts, seconds are positive and finite."""
    checked = {str(int(n)): float(seconds) for n, seconds in means.items()}
    if any(not 0.0 < seconds < 1e6 for seconds in checked.values()):
        raise ValueError("a cost out of range")
    return checked


def _context(kept: Any) -> dict[str, float] | None:
    """A cost book's context slope of a draft's decodes (`ContextSlope.as_dict`'s form), checked; None where the
    book has none (one written before it was kept)."""
    if kept is None:
        return None
    checked = {"at": float(kept["at"]), "slope": float(kept["slope"])}
    if not 0.0 <= checked["at"] < 1e7 or not 0.0 <= checked["slope"] < 1.0:
        raise ValueError("a context slope out of range")
    return checked


def _capped(means: dict[str, float], rows: int) -> dict[str, float]:
    """A book's means by size n (a pass of n + `rows` rows), each at most as dear a row as a smaller size's. A size
    measured while the machine was busy (a 7-row pass at 185 ms where 6 rows took 38) priced its K out of use for good:
    never chosen, it was never measured again, and the book kept it. A size truly dearer a row (a tiny model's 5-row
    pass, twice its 4-row one) is measured again once chosen."""
    capped: dict[str, float] = {}
    per_row = float("inf")
    for n in sorted(means, key=int):
        size = max(1, int(n) + rows)
        capped[n] = min(means[n], per_row * size)
        per_row = min(per_row, capped[n] / size)
    return capped


def _counts(counts: dict[str, float | list[float]]) -> dict[str, float | list[float]]:
    """A cost book's acceptance counts, checked (`PositionAcceptance.as_counts`'s form)."""
    reached, accepted_at = counts["reached"], counts["accepted_at"]
    if not isinstance(reached, list) or not isinstance(accepted_at, list) or len(accepted_at) > len(reached):
        raise ValueError("acceptance counts of another form")
    return {"accepted": float(counts["accepted"]), "rejections": float(counts["rejections"]),  # type: ignore[arg-type]
            "reached": [float(x) for x in reached], "accepted_at": [float(x) for x in accepted_at]}
