"""K per sequence of one verify pass, chosen for the batch's goodput, on synthetic costs and acceptance."""

from __future__ import annotations

import itertools
import operator
from dataclasses import replace
from typing import Callable, Sequence

import numpy as np

from spec_cli.decoding.batch_costs import BatchCosts
from spec_cli.decoding.goodput import Candidate, choose


def choose_ks(candidates: list[Candidate], costs: BatchCosts, host_s: float = 0.0) -> list[int]:
    """K for each candidate, its way aside."""
    return [k for k, _way in choose(candidates, costs, host_s)]


def pass_costs(seconds: Callable[[int], float], sizes: range = range(1, 65)) -> BatchCosts:
    costs = BatchCosts()
    for rows in sizes:
        costs.record(rows, seconds(rows))
    return costs


def kept(rates: Sequence[float]) -> list[float]:
    """g_i = a_1·…·a_i, a candidate's chance of keeping draft position i, from the rates a_i."""
    return list(itertools.accumulate(rates, operator.mul))


def goodput(ks: list[int], candidates: list[Candidate], seconds: Callable[[int], float]) -> float:
    expected = sum(1 + sum(c.gains[:k]) for c, k in zip(candidates, ks))
    return expected / (seconds(len(ks) + sum(ks)) + sum(k * c.step_s for c, k in zip(candidates, ks)))


def cheap_rows(rows: int) -> float:
    return 0.015 + 0.001 * rows  # a pass bound by reading the weights: a row costs little


def test_nothing_measured_yet_drafts_nothing_but_what_requests_fix() -> None:
    candidates = [Candidate(kept(np.ones(8))), Candidate(kept(np.ones(8)), fixed=3)]
    assert choose_ks(candidates, BatchCosts()) == [0, 3]


def test_the_choice_is_the_best_allocation_of_draft_rows() -> None:
    """Against every allocation of up to 4 tokens to each of three sequences: none has a higher goodput."""
    candidates = [Candidate(kept(np.full(4, 0.9)), step_s=0.002), Candidate(kept(np.full(4, 0.6)), step_s=0.002),
                  Candidate(kept(np.array([0.95, 0.5, 0.5, 0.5])), step_s=0.004)]
    ks = choose_ks(candidates, pass_costs(cheap_rows))
    best = max(goodput(list(choice), candidates, cheap_rows)
               for choice in itertools.product(range(5), repeat=3))
    assert goodput(ks, candidates, cheap_rows) >= best * 0.999
    assert ks[0] > ks[1]  # the sequence the target agrees with more drafts more


def test_rows_that_cost_as_much_as_tokens_draft_nothing() -> None:
    """Compute-bound passes (each row a whole token's work): no draft of α = 0.8 pays for its row and step."""
    linear = lambda rows: 0.010 * rows  # noqa: E731
    candidates = [Candidate(kept(np.full(8, 0.8)), step_s=0.004) for _ in range(4)]
    assert choose_ks(candidates, pass_costs(linear)) == [0, 0, 0, 0]


def test_a_draft_dearer_than_its_target_is_not_used_even_alone() -> None:
    candidates = [Candidate(kept(np.full(8, 0.9)), step_s=0.030)]
    assert choose_ks(candidates, pass_costs(cheap_rows)) == [0]


def test_a_busier_batch_gives_each_sequence_fewer_drafts() -> None:
    """Past 16 rows a row costs ten times more (the pass stops being bound by reading the weights)."""
    def knee(rows: int) -> float:
        return 0.015 + 0.0005 * min(rows, 16) + 0.005 * max(0, rows - 16)
    costs = pass_costs(knee)
    alone = choose_ks([Candidate(kept(np.full(8, 0.8)), step_s=0.001)], costs)
    eight = choose_ks([Candidate(kept(np.full(8, 0.8)), step_s=0.001) for _ in range(8)], costs)
    assert alone[0] > max(eight) >= 0 and sum(eight) + 8 <= 24


def test_unmeasured_sizes_are_tried_at_most_twice_the_largest_measured() -> None:
    costs = pass_costs(cheap_rows, sizes=range(4, 5))  # only passes of 4 rows so far
    ks = choose_ks([Candidate(kept(np.ones(16))) for _ in range(4)], costs)
    assert sum(ks) + 4 == 8


def test_fixed_ks_past_twice_the_largest_measured_pass_are_priced_and_kept() -> None:
    """Requests that fix K may fill a pass beyond what the batch itself would try (`-k 16` beside a sequence under
    `-k auto`, passes of 4 rows measured so far): that pass is priced like any other, and the batch adds nothing."""
    costs = pass_costs(cheap_rows, sizes=range(4, 5))
    candidates = [Candidate(kept(np.ones(16)), fixed=16), Candidate(kept(np.ones(16)))]
    assert choose_ks(candidates, costs) == [16, 0]


def test_host_work_a_step_makes_more_drafts_worth_their_cost() -> None:
    """A draft position worth g tokens for c seconds joins a step of E tokens and C seconds where g·C > E·c: a step
    made dearer by its host work h (Python between passes, at every K) takes positions it turned down."""
    candidates = [Candidate(kept(np.full(8, 0.5)), step_s=0.010)]
    without = choose_ks(candidates, pass_costs(cheap_rows))
    with_host = choose_ks(candidates, pass_costs(cheap_rows), 0.030)
    assert without == [0] and with_host[0] >= 1


def test_a_round_cost_paid_once_is_weighed_against_all_its_positions() -> None:
    """A block drafter's pass (or a catch-up) is paid once however many positions it drafts: it drafts all its
    positions that pay, or none, where step-priced positions of the same total cost would not."""
    block = Candidate(kept(np.full(8, 0.9)), round_s=0.020)
    stepped = Candidate(kept(np.full(8, 0.9)), step_s=0.020)
    assert choose_ks([block], pass_costs(cheap_rows)) == [8]
    assert choose_ks([stepped], pass_costs(cheap_rows))[0] < 8


def test_an_entry_spread_over_the_tokens_ahead_is_paid_by_each_token_a_round_that_drafts_emits() -> None:
    """`token_s` is paid by every token of a round that drafts, its own included: a draft at 0.9 that pays with
    1 ms of it a token does not with 40 ms (a plain token costs 16 ms), and a round's cost grows by it × E."""
    drafting = Candidate(kept(np.full(8, 0.9)), step_s=0.001)
    [cheap] = choose_ks([replace(drafting, token_s=0.001)], pass_costs(cheap_rows))
    assert cheap > 0 and choose_ks([replace(drafting, token_s=0.040)], pass_costs(cheap_rows)) == [0]
    [free] = choose_ks([drafting], pass_costs(cheap_rows))
    assert free >= cheap


def test_a_sequence_takes_the_way_that_pays_best_in_the_pass() -> None:
    """A sequence offered two ways (a draft model whose catch-up is due, and a lookup that costs host time only)
    drafts the one whose positions pay best in this pass; one with a single way keeps it."""
    model = Candidate(kept(np.full(8, 0.9)), step_s=0.004, round_s=0.060)
    lookup = Candidate(kept(np.full(3, 0.8)))
    [(k, way)] = choose([replace(model, others=(lookup,))], pass_costs(cheap_rows))
    assert way == 1 and k == 3
    cheap_model = Candidate(kept(np.full(8, 0.9)), step_s=0.001)
    [(k, way)] = choose([replace(cheap_model, others=(Candidate(kept(np.full(2, 0.3))),))], pass_costs(cheap_rows))
    assert way == 0 and k > 2


def test_alone_acceptance_and_the_drafters_cost_set_k() -> None:
    """One sequence (a lone run is a schedule of one): high acceptance with cheap drafts drafts long, low acceptance
    short, and the same acceptance drafts less where each draft costs a step than where it costs host time only."""
    rows = lambda n: 0.040 + 0.002 * n  # noqa: E731
    [long] = choose_ks([Candidate(kept(np.full(16, 0.95)), step_s=0.001)], pass_costs(rows))
    [short] = choose_ks([Candidate(kept(np.full(16, 0.3)), step_s=0.001)], pass_costs(rows))
    assert long >= 10 and short <= 2
    falling = np.array([0.95, 0.9, 0.85, 0.8, 0.7, 0.6, 0.5, 0.4])
    [dear] = choose_ks([Candidate(kept(falling), step_s=0.015)], pass_costs(rows))
    [free] = choose_ks([Candidate(kept(falling))], pass_costs(rows))
    assert 0 < dear < free


def test_a_step_that_drafts_pays_the_choice_it_makes_the_next_step_make() -> None:
    """Where a step drafting nothing is followed by steps that do not choose, drafting pays for the next choice too
    (`replan_s`, once, like a round's own cost): a draft worth a little more than its rows drafts without it, not
    with a choice that costs what a pass does, and a draft worth much more still drafts, with as many positions as
    make that once-cost worth the most."""
    seconds = lambda rows: 0.0010 + 0.0005 * rows  # noqa: E731  (a tiny model: a pass about what a choice costs)
    costs = pass_costs(seconds, range(1, 20))
    marginal = [Candidate(kept([0.5, 0.2]))]
    assert choose_ks(marginal, costs) == [1]
    assert [k for k, _ in choose(marginal, costs, replan_s=0.0015)] == [0]
    sure = [Candidate(kept(np.full(8, 0.99)))]
    assert [k for k, _ in choose(sure, costs, replan_s=0.0015)] == [8]


def test_a_pass_whose_first_extra_row_costs_most_is_weighed_over_several_positions() -> None:
    """llama.cpp decodes one row by another path than several: where a 2-row pass costs far more than a 1-row one and
    more rows little more (the demo target on a busy machine), a sure 2-token proposal pays for its rows together
    though its first position alone does not."""
    seconds = lambda rows: 0.033 if rows == 1 else 0.0876 + 0.0014 * (rows - 2)  # noqa: E731
    costs = pass_costs(seconds, range(1, 8))
    assert choose_ks([Candidate(kept([1.0, 1.0]))], costs) == [2]
    assert choose_ks([Candidate(kept([1.0]))], costs) == [0]  # one position never pays that row


def test_a_pass_that_steps_up_past_a_sequences_first_positions_does_not_stop_its_drafts_there() -> None:
    """c(R) need not grow evenly with the rows (the demo pair's planner book read 36.7 ms at 6 rows, 42.8 at 7, 44.1
    at 8): each move looks past such a step, so a sequence drafts the K of the best goodput of all, not the last K
    before the step (where it stopped at 3 for one step of 5 ms when 16 sure positions paid a third more)."""
    seconds = lambda rows: 0.020 + 0.003 * rows + (0.005 if rows >= 5 else 0.0)  # noqa: E731
    candidate = Candidate(kept(np.full(16, 0.99)), step_s=0.004)
    [k] = choose_ks([candidate], pass_costs(seconds, range(1, 18)))
    assert k == max(range(17), key=lambda n: goodput([n], [candidate], seconds)) == 16
