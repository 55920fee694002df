"""Exactness checks shared by the engine, memory and drafting tests: greedy identity on real models up to the
target's own float ties, the exact distribution of the first two sampled tokens, computed from the target's
logits, the tokens seeded generations sample, and a χ² goodness-of-fit test of one against the other."""

from __future__ import annotations

import math
from collections import Counter
from typing import Callable, Sequence

import numpy as np

from spec_cli import Generation, Pair, SamplingParams
from spec_cli.conversation.session import ChatSession, Settings
from spec_cli.decoding.sampling import probabilities
from spec_cli.decoding.stats import Stats
from spec_cli.bench.ties import Difference, first_difference, tie_tolerance
from spec_cli.llama.context import Context
from spec_cli.llama.model import Model
from spec_cli.llama.vision import Projector

SAMPLED = SamplingParams(temperature=1.0, top_k=4)
SIGNIFICANCE = 0.001  # per χ² test; seeds are fixed, so a pass is reproducible
REPETITIVE = "the cat sat. the cat sat. the cat"  # so that n-gram lookup proposes tokens too
N_SAMPLES = 2000


def sampled_pairs(pair: Pair, prompt: list[int], sampling: SamplingParams, k: int | str, mode: str,
                  verify: str = "block", p_min: float = 0.0, n: int = N_SAMPLES,
                 grammar: str | None = None, whole: bool = False) -> tuple[Counter, Stats]:
    """The first two tokens of `n` seeded generations (under `grammar` if given), and their summed statistics.
    Each generation has room for its first round's whole draft, and stops once it has two tokens (the rounds
    after them cannot change them; half the time of a χ² test), or at that room where `whole` (a test whose
    statistics count the drafts of later rounds too)."""
    observed: Counter = Counter()
    totals = Stats(draft_max=0)
    room = max(k + 1, 2) if isinstance(k, int) else 6  # room for the first round's whole draft (auto: K ≤ 5)
    for seed in range(n):
        generation = pair.generate(prompt, sampling=sampling, seed=seed, max_tokens=room, draft_max=k,
                                   draft_mode=mode, verify=verify, draft_p_min=p_min, grammar=grammar)
        events = iter(generation)
        for _ in events:
            if len(generation.token_ids) >= 2 and not whole:
                break
        events.close()
        observed[tuple(generation.token_ids[:2])] += 1
        totals.merge(generation.stats)
    assert sum(observed.values()) == n
    return observed, totals


def finish(generation: Generation) -> Generation:
    for _ in generation:
        pass
    return generation


def chat_turns_match_the_target_alone(pair: Pair, mode: str) -> None:
    """Three greedy chat turns drafted in `mode` answer as the target alone does, token for token, with drafts
    kept; every turn after the first evaluates only its new tokens (the memories keep the conversation)."""
    base = dict(sampling=SamplingParams(), draft_max=3, draft_p_min=0.0, max_tokens=16)
    drafting = ChatSession(pair, Settings(draft_mode=mode, **base), system="be brief")
    alone = ChatSession(pair, Settings(draft_mode=mode, use_draft=False, **base), system="be brief")
    for i, message in enumerate(["hello there", "the cat sat", "and the dog"]):
        answer = [event.token for event in drafting.reply(message)]
        assert answer == [event.token for event in alone.reply(message)]
        if i:
            assert drafting.last.stats.prompt_cached > len(drafting.last.prompt) // 2
    assert drafting.totals.accepted > 0


def greedy_agreement(target: Model, prompt: Sequence[int], speculative: Sequence[int],
                     reference: Sequence[int], tolerance: float | None = None,
                     projector: Projector | None = None) -> tuple[int, Difference | None]:
    """How many leading tokens two greedy outputs of `prompt` share, and where they part (None when they are the
    same). They may part only on a float tie of the target alone's logits (`ties.first_difference`: its two best
    logits within `tolerance`, by default `ties.tie_tolerance` for the target's weights, chosen from the batched
    against one-row differences benchmarks/float_ties.py measures); anything else fails with the position, both
    tokens and the margin. `projector` reads the prompt's images."""
    difference = first_difference(target, prompt, speculative, reference, tolerance, projector)
    if difference is None:
        return len(reference), None
    assert difference.tie, (
        f"greedy output differs from the target alone's at generated token {difference.position}: "
        f"{difference.ours} against {difference.alone}, where the target's two best logits are "
        f"{difference.margin:.4f} apart (a float tie is within "
        f"{tie_tolerance(target) if tolerance is None else tolerance}): not a tie, a bug")
    return difference.position, difference


Run = Callable[[list[int], int], tuple[list[int], list[int]]]


def against_alone(pair: Pair, totals: Stats | None = None, **fields: object) -> Run:
    """A `Run` of `pair`: greedy generations with `fields` (K, mode…) and with the target alone, from token ids;
    the speculative runs' statistics are summed into `totals` if given."""
    def run(prompt: list[int], n: int) -> tuple[list[int], list[int]]:
        # The target alone first: the speculative run then starts from the memory it left (a sliding window
        # wrapped past the prompt is cut back before the rounds begin).
        alone = finish(pair.generate(prompt, sampling=SamplingParams(), max_tokens=n, draft_mode="none"))
        speculative = finish(pair.generate(prompt, sampling=SamplingParams(), max_tokens=n, **fields))
        if totals is not None:
            totals.merge(speculative.stats)
        return speculative.token_ids, alone.token_ids
    return run


def assert_greedy_identity(target: Model, prompt: Sequence[int], run: Run, n: int,
                           least: float = 0.9, projector: Projector | None = None) -> list[Difference]:
    """Greedy identity of a speculative run with the target alone, up to float ties: `run(prompt, n)` gives both
    runs' `n` (or fewer, on a stop) greedy tokens. At a tie both texts legitimately differ from there, so the
    comparison goes on from the tie with the speculative run's token forced into both prompts, until `n` tokens
    have been compared or both stopped; at least `least` of the tokens must have been compared (not ties).
    Returns the ties passed (for a test that wants to see them)."""
    ties: list[Difference] = []
    compared, prompt = 0, list(prompt)
    while compared + len(ties) < n:
        speculative, reference = run(prompt, n - compared - len(ties))
        agreed, tie = greedy_agreement(target, prompt, speculative, reference, projector=projector)
        compared += agreed
        if tie is None or tie.ours is None:
            break
        ties.append(tie)
        prompt += [*reference[:agreed], tie.ours]
    assert compared > 0 and compared >= least * (compared + len(ties)), f"compared {compared} tokens, ties {ties}"
    return ties


REST = ("rest",)  # the pairs an expectation leaves out, as one cell


def exact_pair_distribution(pair: Pair, prompt: list[int], sampling: SamplingParams = SAMPLED,
                            least: float = 0.0) -> dict[tuple, float]:
    """P(x1, x2) = p(x1 | prompt) · p(x2 | prompt, x1) computed from the target's logits.

    With `least` > 0, only the pairs of probability ≥ least are listed and the rest of the mass is REST's: a law
    with no filter has the whole vocabulary for support, too many pairs to list."""
    context = Context(pair.target, n_ctx=len(prompt) + 8, n_threads=1)
    context.projector = pair.vision  # the prompt's images, if any
    try:
        p1 = np.asarray(probabilities(context.decode(prompt, 1)[0], sampling, sampling.recent(prompt)))
        result: dict[tuple, float] = {}
        for x1 in np.flatnonzero((p1 > 0) & (p1 >= least)):
            context.trim(len(prompt))  # a recurrent memory may go back further: feed what it lacks
            p2 = np.asarray(probabilities(context.decode([*prompt[context.n_past:], int(x1)], 1)[0], sampling,
                                          sampling.recent([*prompt, int(x1)])))
            for x2 in np.flatnonzero((p2 > 0) & (p1[x1] * p2 >= least)):
                result[(int(x1), int(x2))] = float(p1[x1] * p2[x2])
        if least > 0:
            result[REST] = 1.0 - sum(result.values())
        return result
    finally:
        context.close()


def chi_square_p_value(observed: Counter, expected: dict, n: int) -> float:
    """Goodness of fit of observed pair counts to exact probabilities; cells expecting < 5 are pooled. Pairs the
    expectation does not list count as REST where it has that cell."""
    if REST in expected:
        observed = Counter({key: count for key, count in observed.items() if key in expected})
        observed[REST] = n - sum(observed.values())
    stat, pooled_obs, pooled_exp, cells = 0.0, 0, 0.0, 0
    for key, prob in expected.items():
        if prob * n >= 5:
            stat += (observed[key] - prob * n) ** 2 / (prob * n)
            cells += 1
        else:
            pooled_obs += observed[key]
            pooled_exp += prob * n
    pooled_obs += sum(count for key, count in observed.items() if key not in expected)
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        cells += 1
    return chi2_survival(stat, cells - 1)


def chi2_survival(x: float, dof: int) -> float:
    """P(χ²_dof > x) by the series of the regularised lower incomplete gamma function."""
    a, z = dof / 2, x / 2
    if z > a + 40 * math.sqrt(a) + 40:
        return 0.0  # far in the tail (p < 1e-30); the series below would overflow
    term = total = 1.0 / a
    for n in range(1, 1000):
        term *= z / (a + n)
        total += term
    return max(0.0, 1.0 - math.exp(-z + a * math.log(z) - math.lgamma(a)) * total) if z > 0 else 1.0


def priced_to_draft(pair: Pair) -> None:
    """Price every own drafter's step of `pair` and every verify pass as nearly free, whatever its K, so that
    the hybrid and `-k auto` draft wherever acceptance gives a chance. On the tiny models a draft step costs
    what a target step does, and both would rightly stop drafting, leaving the paths under test (drafts kept and
    rejected, rollbacks) unrun. Measurements made after this weigh too little to change it for a test's few
    generations; and every pass is priced alike, about what a tiny model's one-row pass measures, so that more rows
    cost nothing more (a pass priced below any measured one reads as what one row measured, `BatchCosts`' floor:
    priced dearer than the one-row steps a generation measures first, K ≥ 1 never paid under the planner), while a
    probe stays a small share of the rounds it sat out (the planner reads this book: at 1 µs a pass a drafter whose
    pooled acceptance was 0 was due its probe after ~1,500 rounds, and none came in 48 tokens). A step
    costs a tenth of a microsecond a token: at 1 µs an idle drafter's catch-up grew as fast as the probe's allowance
    on a ~60 µs pass (`probe_rounds`), and a drafter whose pooled acceptance was 0 was never probed in 48 tokens.
    So is the loop's own work per emitted token (o) in an own drafter's rounds: at the tiny models' ~150 µs a token,
    beside steps and passes priced at a microsecond, it made a drafter's rate 1/o, no draft's rate, a tie that noise
    broke (the hybrid once drafted nothing in 48 tokens). The hybrid's own book, which prices its lookups and plain
    rounds, keeps what it measures: there o outweighs a lookup's host time, which is not priced here. The work on a
    verify pass's rows, which every book prices a row beside the pass, is priced as nearly free in each of them, as
    the passes are."""
    steps, passes = {str(n): 1e-7 * n for n in range(1, 129)}, {str(rows): 1e-4 for rows in range(1, 18)}
    for name in pair.drafting.own_models():
        pair.drafting.costs(name).draft.seed(steps, 1e6)
    pair.drafting.costs("hybrid").verify.seed(passes, 1e6)
    for name in pair.drafting.own_models():
        book = pair.drafting.costs(name)
        book.other_s, book.other_tokens = 1e6 * 1e-8, 1e6  # o: 10 ns a token, outweighing what a test measures
    for name in ("hybrid", *pair.drafting.own_models()):
        book = pair.drafting.costs(name)
        book.row_s, book.rows = 1e6 * 1e-8, 1e6  # the work on a pass's rows: 10 ns a row
