"""The planner: probes of an idle drafter, quiet steps, plain steps where every step drafts, and the host work a
step is priced with."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from spec_cli.decoding import planner as planning
from spec_cli.decoding.costs import HOST, PER_TOKEN, PROBE_ROUNDS, LoopCosts
from spec_cli.decoding.draft_length import AdaptiveK, FixedK, PositionAcceptance
from spec_cli.decoding.drafter import Draft, Drafter, Offer
from spec_cli.decoding.planned import Planned
from spec_cli.decoding.planner import Planner

CHUNK = 512  # the most a lone sequence's drafter catches up on in a step

def planned(costs: LoopCosts, backlog: int = 0) -> tuple[Planner, Planned]:
    """A planner whose passes cost 40 ms and 4 ms a row, planning for one sequence (a lone run, a schedule of one)
    whose drafter, priced by `costs`, has seen none of its drafts kept: what the planner reads of a generation."""
    planner = Planner()
    for rows in range(1, 18):
        planner.pass_costs.record(rows, 0.040 + 0.004 * rows)
    length = AdaptiveK(costs, k_max=16)
    for _ in range(8):
        length.update(4, 0)
    generation = SimpleNamespace(drafter=Drafter(), draft_length=length, room=lambda: 1000,
                                 stats=SimpleNamespace(draft_mode="model", adaptive=True, draft_s=0.0, plan_s=0.0),
                                 drafter_backlog=lambda: backlog, last_draft=Draft(tokens=[9]))
    return planner, Planned(generation)  # type: ignore[arg-type]


def idle_ks(planner: Planner, running: Planned, steps: int) -> list[int]:
    """The K the planner gives the sequence each of `steps` steps (a probe drafts what its drafter proposes, and keeps
    nothing)."""
    ks = []
    for _ in range(steps):
        [k] = planner._ks([running], CHUNK, False)
        if k:
            planner.drafted(running)
        ks.append(k or 0)
    return ks


def test_an_idle_drafter_is_probed_less_and_less_while_probes_do_not_pay() -> None:
    costs = LoopCosts(shape=PER_TOKEN)
    costs.draft.record(1, 0.002)
    planner, running = planned(costs)
    ks = idle_ks(planner, running, 8 * PROBE_ROUNDS)
    probes = [i for i, k in enumerate(ks) if k]
    assert probes[0] == PROBE_ROUNDS and set(ks[:PROBE_ROUNDS]) == {0}  # K = 1 once, after the idle rounds
    assert [b - a for a, b in zip(probes, probes[1:])] == [2 * PROBE_ROUNDS + 1, 4 * PROBE_ROUNDS + 1]
    assert all(k <= 1 for k in ks)


def test_a_probe_that_proposed_nothing_does_not_lengthen_the_wait_for_the_next() -> None:
    """A lookup probed where the text has no match drafts nothing and measures nothing: the next probe waits as long
    as that one did, where a probe that drafted and kept nothing waits twice as long."""
    planner, running = planned(LoopCosts(shape=HOST))
    running.generation.last_draft = Draft()
    ks = idle_ks(planner, running, 6 * PROBE_ROUNDS)
    probes = [i for i, k in enumerate(ks) if k]
    assert len(probes) == 5 and probes[0] == PROBE_ROUNDS
    assert {b - a for a, b in zip(probes, probes[1:])} == {PROBE_ROUNDS + 1} and running.probe_after == PROBE_ROUNDS
    running.generation.last_draft = Draft(tokens=[9])  # a match: each probe drafts, keeps nothing, and backs off
    ks = idle_ks(planner, running, 4 * PROBE_ROUNDS)
    probes = [i for i, k in enumerate(ks) if k]
    assert [b - a for a, b in zip(probes, probes[1:])] == [2 * PROBE_ROUNDS + 1]
    assert running.probe_after == 4 * PROBE_ROUNDS


def test_a_probe_dearer_than_its_share_of_the_idle_time_is_not_made() -> None:
    """A drafter whose catch-up on what it missed costs as much as the rounds it sat out is never probed."""
    costs = LoopCosts(shape=PER_TOKEN)
    costs.draft.record(1, 0.050)
    costs.draft.record(64, 64 * 0.050)
    planner, running = planned(costs, backlog=64)
    assert set(idle_ks(planner, running, 400)) == {0}


@pytest.mark.parametrize("backlog, left, drafts", [(2, 40, True), (100, 1000, True), (100, 40, False)])
def test_a_drafters_entry_is_paid_back_over_the_tokens_the_answer_may_still_emit(backlog: int, left: int,
                                                                                  drafts: bool) -> None:
    """A draft model that keeps its drafts pays in passes of 40 ms and 4 ms a row at its steady round (a backlog of 2:
    drafts the round fed). Lacking a prompt of 100 tokens (a second's catch-up), it enters where that second spread
    over half of the 1000 tokens the answer may still emit is little a token, not where it is spread over 20."""
    costs = LoopCosts(shape=PER_TOKEN)
    costs.draft.record(1, 0.002)
    costs.draft.record(100, 1.0)
    planner, running = planned(costs, backlog=backlog)
    for rows in range(1, 18):  # each pass measured twice: the first call of a size is cold
        planner.pass_costs.record(rows, 0.040 + 0.004 * rows)
    for _ in range(40):
        running.generation.draft_length.update(4, 4)
    running.generation.room = lambda: left
    [k] = planner._ks([running], CHUNK, False)
    assert bool(k) == drafts


def test_a_choice_of_no_drafts_stands_until_a_probe_falls_due() -> None:
    """Where choosing looks dear against a step, K = 0 stands for quiet steps that ask no drafter; the streak ends when
    the idle drafter's probe falls due, at the very step it would without quiet steps."""
    costs = LoopCosts(shape=PER_TOKEN)
    costs.draft.record(1, 0.002)
    planner, running = planned(costs)
    planner._chosen_s.extend([1.0] * planning.CHOICES_KEPT)  # each choice of no drafts stands for QUIET_MAX steps
    ks = []
    for _ in range(PROBE_ROUNDS + 1):
        [k] = planner.ks([running], CHUNK, False)
        ks.append(k)
        if ks == [0]:
            assert planner._quiet is not None and planner._quiet.left == PROBE_ROUNDS - 1
    assert ks == [0] * PROBE_ROUNDS + [1]


def ways_planned(cap: int, costs: LoopCosts | None = None, kept: int = 0,
                 owed_s: float = 0.0) -> tuple[Planner, Planned, list[int]]:
    """The planner of `planned`, for a drafter of several ways that prefers to draft up to `cap` tokens by lookup (or
    the way `costs` prices), of which the target has kept `kept` of 4 each round (cap 0: its own choice is no draft),
    each round of it leaving `owed_s` to another of its ways; and the list the K asked of each offer it makes is
    added to."""
    planner, _ = planned(LoopCosts(shape=PER_TOKEN))
    acceptance = PositionAcceptance()
    for _ in range(8):
        acceptance.update(4, kept)
    offer = Offer("lookup", acceptance, costs or LoopCosts(shape=HOST), cap, owed_s=owed_s)
    asked: list[int] = []
    generation = SimpleNamespace(drafter=SimpleNamespace(chooses_ways=True, plan_s=0.0), draft_length=FixedK(16),
                                 room=lambda: 1000, offer=lambda k, chunk, shared: asked.append(k) or [offer],
                                 take=lambda way, k: None, drafter_backlog=lambda: 0, still_idle=lambda k: True,
                                 stood=lambda: None,
                                 stats=SimpleNamespace(draft_mode="hybrid", adaptive=True, draft_s=0.0, plan_s=0.0))
    return planner, Planned(generation), asked  # type: ignore[arg-type]


def test_what_a_way_leaves_another_to_pay_is_part_of_its_round() -> None:
    """A lookup whose 4 drafts are all kept pays in passes of 40 ms and 4 ms a row (5 tokens for 60 ms, against 44 ms
    a plain token); the same proposal leaving another way 0.2 s to pay later (`Offer.owed_s`: a draft model's catch-up
    on what it emits) does not."""
    for owed_s, k in ((0.0, 4), (0.2, 0)):
        planner, running, _asked = ways_planned(4, kept=4, owed_s=owed_s)
        for rows in range(1, 18):  # each pass measured twice: the first call of a size is cold
            planner.pass_costs.record(rows, 0.040 + 0.004 * rows)
        assert planner._ks([running], CHUNK, False) == [k]


@pytest.mark.parametrize("cap", [0, 4])
def test_a_drafter_of_several_ways_is_probed_only_where_its_own_choice_drafts(cap: int) -> None:
    """A probe drafts the way its drafter prefers: where that is no draft there is nothing to probe, and a choice of no
    drafts stands for `QUIET_MAX` steps instead of ending at `PROBE_ROUNDS`."""
    planner, running, _asked = ways_planned(cap)
    planner._chosen_s.extend([1.0] * planning.CHOICES_KEPT)  # choosing looks dear: quiet steps as long as may be
    ks, streaks = [], []
    for _ in range(planning.QUIET_MAX + 2):
        ks.append(planner.ks([running], CHUNK, False)[0])
        streaks.append(id(planner._quiet))
    if cap:
        assert ks[:PROBE_ROUNDS + 1] == [0] * PROBE_ROUNDS + [1]
    else:
        assert set(ks) == {0}
        assert len(set(streaks)) == 2 and streaks.index(streaks[-1]) == planning.QUIET_MAX + 1  # chosen twice


def test_a_probe_that_does_not_pay_yet_is_priced_without_choosing_afresh() -> None:
    """A quiet streak cut short where a probe may be due goes on where it is not, priced as the streak was chosen:
    the drafter is asked for its offers again only where the probe is made. Its way's step costs 50 ms against a
    44 ms pass, so its probe (a step and a row) pays after 82 idle rounds, not at the first `PROBE_ROUNDS`."""
    dear = LoopCosts(shape=PER_TOKEN)
    dear.draft.record(1, 0.050)
    planner, running, asked = ways_planned(4, dear)
    planner._chosen_s.extend([1.0] * planning.CHOICES_KEPT)
    ks = [planner.ks([running], CHUNK, False)[0] for _ in range(83)]
    assert ks == [0] * 82 + [1] and len(asked) == 2  # the first choice, and the probe's


def test_a_choice_of_no_drafts_outlasts_a_sequence_that_leaves_or_joins_drafting_nothing() -> None:
    """Four answers of a batch end at different steps: each one that leaves keeps the others' quiet streak (choosing
    afresh at each cost a tiny model 7% of its speed); a newcomer whose first round, chosen, drafts nothing joins it."""
    costs = LoopCosts(shape=PER_TOKEN)
    costs.draft.record(1, 0.002)
    planner, first = planned(costs)
    _, second = planned(costs)
    _, third = planned(costs)
    planner._chosen_s.extend([1.0] * planning.CHOICES_KEPT)
    assert planner.ks([first, second], CHUNK, False) == [0, 0]
    streak = planner._quiet
    assert streak is not None and streak.left == PROBE_ROUNDS - 1
    assert planner.ks([second], CHUNK, False) == [0]
    assert planner._quiet is streak and streak.left == PROBE_ROUNDS - 2 and streak.running == [second]
    assert len(streak.candidates) == 1  # priced with its own candidate where the streak is cut for its probe
    assert planner.ks([], CHUNK, False) == [] and planner._quiet is None  # none generating (a prompt being fed)
    assert planner.ks([second], CHUNK, False) == [0]
    streak = planner._quiet
    assert planner.ks([second, third], CHUNK, False) == [0, 0]
    assert planner._quiet is streak and streak.running == [second, third] and len(streak.candidates) == 2
    assert second.idle == 4 and third.idle == 1  # three choices and two quiet steps; the newcomer's first round
    assert streak.left == PROBE_ROUNDS - 4  # ends where the longest-idle drafter's probe may fall due


def test_only_a_newcomers_drafter_is_asked_where_it_joins_a_quiet_streak_and_all_are_where_it_drafts() -> None:
    """A sequence that joins a quiet streak has its first round chosen, the others priced as the streak was (their
    drafters not asked again); where that round drafts (a lookup whose proposals are all kept), every sequence is
    chosen afresh."""
    planner, first, asked_first = ways_planned(0)
    _, second, asked_second = ways_planned(0)
    _, third, asked_third = ways_planned(4, kept=4)
    for rows in range(1, 18):  # each pass measured twice: the first call of a size is cold
        planner.pass_costs.record(rows, 0.040 + 0.004 * rows)
    planner._chosen_s.extend([1.0] * planning.CHOICES_KEPT)
    assert planner.ks([first], CHUNK, False) == [0]
    streak = planner._quiet
    assert streak is not None
    assert planner.ks([first, second], CHUNK, False) == [0, 0]
    assert planner._quiet is streak and (len(asked_first), len(asked_second)) == (1, 1)
    assert planner.ks([first, second, third], CHUNK, False) == [0, 0, 4]
    assert planner._quiet is None and (len(asked_first), len(asked_second), len(asked_third)) == (2, 2, 2)


def test_a_cold_first_choice_does_not_stand_for_quiet_steps() -> None:
    """The quiet rule reads the middle of the last choices' seconds, once most are known: one cold choice (a drafter's
    first trial) is not what choosing costs."""
    planner, _ = planned(LoopCosts(shape=PER_TOKEN))
    step_s = planner.pass_costs.seconds(1)
    planner._chosen_s.append(100 * step_s)
    assert planner._quiet_steps(1) == 0
    planner._chosen_s.extend([0.035 * step_s] * 2)
    assert planner._quiet_steps(1) == 3  # 3.5% of a step, at most 1% a step


def test_a_planner_that_always_drafts_measures_the_plain_pass_again() -> None:
    """Where every step drafts, the pass over the sequences alone goes stale: a step drafts nothing so that its price
    is measured again, never while it is fresh, and then once every `PROBE_ROUNDS` steps that would draft."""
    planner, running = planned(LoopCosts(shape=PER_TOKEN))
    planner.pass_costs.record(1, 0.044)
    drafting = [planner._plain_due([running]) for _ in range(3 * PROBE_ROUNDS)]
    assert drafting.count(True) == 0  # a plain pass of one row measured lately: nothing to probe
    for _ in range(40):
        planner.pass_costs.record(5, 0.060)
    plain = [i for i in range(3 * PROBE_ROUNDS) if planner._plain_due([running])]
    assert plain == [0, PROBE_ROUNDS, 2 * PROBE_ROUNDS]  # the drafting steps before counted


def steps(planner: Planner, drafted: bool, seconds: list[float]) -> None:
    """Book steps of `seconds` outside their passes, drafting or not."""
    for each in seconds:
        planner.stepped(drafted, each)


def test_host_work_is_the_middle_of_the_last_steps() -> None:
    """h is not dragged up by the cold first steps, nor down to a busy machine's luckiest step: the lower middle of
    the last steps of each kind, the lesser kind (a step that drafted adds its drafting's host work); before any step,
    nothing."""
    planner, _ = planned(LoopCosts(shape=PER_TOKEN))
    assert planner.host_s == 0.0
    steps(planner, True, [0.9e-3, 1.1e-3])
    assert planner.host_s == pytest.approx(0.9e-3)
    steps(planner, False, [1.2e-3, 0.5e-3, 0.07e-3, 0.3e-3, 0.08e-3])
    assert planner.host_s == pytest.approx(0.3e-3)
    steps(planner, False, [0.07e-3, 0.09e-3])
    assert planner.host_s == pytest.approx(0.09e-3)  # the cold ones outvoted
    steps(planner, False, [0.2e-3] * planning.HOST_KEPT)  # the cheap steps were long ago
    assert planner.host_s == pytest.approx(0.2e-3)


def test_a_plain_pass_priced_by_its_first_call_alone_is_measured_again() -> None:
    """The first pass of a shape is cold: while the pass over the sequences alone has been called once, a step that
    would draft drafts nothing, so that the next call prices it; called twice, drafting goes on."""
    planner, running = planned(LoopCosts(shape=PER_TOKEN))  # every size called once
    assert planner._plain_due([running])
    planner.pass_costs.record(1, 0.044)
    assert not any(planner._plain_due([running]) for _ in range(PROBE_ROUNDS - 1))


def test_host_work_resting_on_cold_plain_steps_that_outweighs_the_plain_pass_is_measured_again() -> None:
    """A process's first steps are cold: while h reads fewer than half of `HOST_KEPT` plain steps, drafting ones are
    measured and h outweighs the pass over the sequences alone (a tiny model), a step that would draft drafts nothing;
    with as many plain steps measured, or where the pass outweighs h (a model of some size), drafting goes on."""
    planner, running = planned(LoopCosts(shape=PER_TOKEN))
    planner.pass_costs.record(1, 0.2e-3)
    planner.pass_costs.record(1, 0.2e-3)
    steps(planner, False, [1.2e-3])
    steps(planner, True, [1.1e-3, 1.0e-3])
    due = [planner._plain_due([running]) for _ in range(planning.HOST_KEPT)]
    assert all(due)  # each a plain step, had it been booked
    steps(planner, False, [0.1e-3] * (planning.HOST_KEPT // 2 - 1))
    assert not planner._plain_due([running])  # half the plain steps known: h is theirs (0.1 ms)
    dear, dear_running = planned(LoopCosts(shape=PER_TOKEN))
    dear.pass_costs.record(1, 20e-3)
    dear.pass_costs.record(1, 20e-3)
    steps(dear, False, [1.2e-3])
    steps(dear, True, [1.1e-3, 1.0e-3])
    assert not dear._plain_due([dear_running])


def test_a_planner_reads_and_books_the_passes_of_the_first_pair_it_meets() -> None:
    """c(R) is the pair's book of the target's passes by rows, which the default's regimes and `-k auto` read too: a
    pass the planner books moves what they read (booked once, by rows), what it booked before it met one joins, and
    another pair's book does not replace it."""
    planner = Planner()
    planner.meet(None)
    planner.passed(2, 0.030)
    planner.passed(2, 0.030)
    book = LoopCosts(shape=HOST)
    for rows, seconds in ((1, 0.020), (5, 0.032), (9, 0.041)):
        book.verify.record(rows, seconds)
        book.verify.record(rows, seconds)
    planner.meet(book.verify)
    assert planner.pass_costs is book.verify
    assert [book.verify.seconds(rows) for rows in (1, 2, 5, 9)] == pytest.approx([0.020, 0.030, 0.032, 0.041])
    acceptance = PositionAcceptance()
    before = book.round_seconds(4, acceptance)
    for _ in range(40):
        planner.passed(5, 0.064)
    assert book.round_seconds(4, acceptance) - before == pytest.approx(book.verify.seconds(5) - 0.032)
    assert book.verify.seconds(5) > 0.060
    other = LoopCosts(shape=HOST)
    other.verify.record(1, 0.5)
    planner.meet(other.verify)
    assert planner.pass_costs is book.verify


def test_where_a_step_is_dear_a_choice_of_no_drafts_stands_while_its_drafter_still_offers_none() -> None:
    """Where choosing costs 3.5 × `PLAN_BUDGET` and far less than a step (no quiet steps), a choice of no drafts whose
    drafter offered no way that drafts stands for the 3 steps after it: each asks the drafter whether it would still
    offer none (`still_idle`), not for its offers; a step where it would offer one chooses afresh."""
    planner, running, asked = ways_planned(0)
    for rows in range(1, 18):  # each pass measured twice: the first call of a size is cold
        planner.pass_costs.record(rows, 0.040 + 0.004 * rows)
    planner._planned_s.extend([3.5 * planning.PLAN_BUDGET] * planning.CHOICES_KEPT)
    idle, stood = [True], []
    running.generation.still_idle = lambda k: idle[0]
    running.generation.stood = lambda: stood.append(running.idle)
    assert [planner.ks([running], CHUNK, False)[0] for _ in range(5)] == [0] * 5
    assert planner._quiet is None and len(asked) == 2 and stood == [2, 3, 4]  # chosen at steps 1 and 5
    idle[0] = False
    assert planner.ks([running], CHUNK, False) == [0] and len(asked) == 3 and len(stood) == 3


def test_a_choice_that_drafts_or_offered_a_way_to_draft_is_chosen_again_each_step() -> None:
    """Only a choice of no drafts whose drafters offered nothing to draft is watched: one that drafts, or one that
    gave K = 0 to a lookup's proposal (whose match grows round by round), is made afresh at the next step."""
    for cap, kept in ((4, 4), (4, 0)):
        planner, running, asked = ways_planned(cap, kept=kept)
        for rows in range(1, 18):
            planner.pass_costs.record(rows, 0.040 + 0.004 * rows)
        planner._planned_s.extend([3.5 * planning.PLAN_BUDGET] * planning.CHOICES_KEPT)
        ks = [planner.ks([running], CHUNK, False)[0] for _ in range(3)]
        assert ks == [4 if kept else 0] * 3 and len(asked) == 3 and planner._watched is None


def test_a_choice_of_no_drafts_is_watched_for_as_many_steps_as_hold_choosing_to_its_budget_a_sequence() -> None:
    """The steps a watched choice stands for: its cost over `PLAN_BUDGET` for each sequence planned, at most
    `WATCHED_MAX`, and none before most of the last choices are known (a cold first one is not what choosing costs)."""
    planner, _ = planned(LoopCosts(shape=PER_TOKEN))
    planner._planned_s.append(100 * planning.PLAN_BUDGET)
    assert planner._watched_steps(1) == 0
    planner._planned_s.extend([4.5 * planning.PLAN_BUDGET] * 2)
    assert [planner._watched_steps(n) for n in (1, 2, 4, 8)] == [4, 2, 1, 0]
    planner._planned_s.extend([100 * planning.PLAN_BUDGET] * 2)
    assert planner._watched_steps(1) == planning.WATCHED_MAX
