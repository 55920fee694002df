"""Target-only against speculative decoding configurations on the same pair, in one run, interleaved.

Runs rotate through the configurations (target alone, then each drafting setup) for every prompt, so drift
in machine load hits all of them alike; figures are medians over runs. Every configuration uses the same
loaded models and the same code path (draft mode "none" is target-only decoding), so the ratios measure
speculation and nothing else.

Next to each draft-model row's measured speed-up stands the one the loop's cost model predicts
(`costs.LoopCosts`, the model `-k auto` and the hybrid drafter optimise): a round drafting K tokens yields
E[tokens](K) = 1 + Σ_{i≤K} a_1·…·a_i, from the row's acceptance by draft position, for K draft steps, the
catch-up a fully accepted round leaves, the target's pass over K + 1 tokens and the loop's own work per
token, each priced at its mean over every call of the run. Against the target alone measured in the same
run, a prediction far from the measurement means the model misses a cost, and `auto` would pick K wrongly.
"""

from __future__ import annotations

import itertools
import json
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from spec_cli.bench.held_out import held_out_ratio, paired_ratio
from spec_cli.decoding.costs import PER_TOKEN, LoopCosts
from spec_cli.decoding.draft_length import PositionAcceptance
from spec_cli.decoding.sampling import SamplingParams
from spec_cli.decoding.stats import Stats
from spec_cli.bench.ties import Difference, first_difference
from spec_cli.decoding.verification import DEFAULT_VERIFY
from spec_cli.drafting.modes import MODES
from spec_cli.errors import SpecError
from spec_cli.pair import Pair
from spec_cli.request import GenerationRequest
from spec_cli.formats.user_text import NOT_UTF8_NOTE, decode_user_text

_CODE = '''def summarize(orders):
    total = 0
    count = 0
    for order in orders:
        if order.status == "cancelled":
            continue
        total += order.amount
        count += 1
    average = total / count if count else 0
    print(f"{count} orders, total {total}, average {average:.2f}")
    return total, average
'''

_ARTICLE = (
    "The city council voted on Tuesday to convert the old railway depot into a public library and community "
    "workshop. The project, estimated at 12 million euros, will be funded partly by a regional grant and partly "
    "by a bond issue. Construction is expected to begin next spring and last about two years. Critics argued "
    "that the money would be better spent on road repairs, while supporters pointed to the depot's historical "
    "value and the lack of study space for students in the district."
)

# Built-in prompts by kind. "mixed", the default, takes some of each so results are not cherry-picked:
# chat and code accept many drafts, summaries of a given text copy from it, free writing accepts the fewest.
PROMPTS = {
    "chat": ("Explain speculative decoding in one paragraph.",
             "List five tips for staying focused while working from home."),
    "code": ("Write a Python function that checks whether a string is a palindrome.",
             "Write a SQL query that returns the ten customers with the highest total order value."),
    "summary": (f"Summarise this article in three sentences.\n\n{_ARTICLE}",),
    "creative": ("Write a surreal short poem about a lighthouse that collects lost umbrellas.",),
    "prose": ("Write a short story about a lighthouse keeper who finds a message in a bottle.",
              "Describe a walk through a city market on a rainy morning."),
    "rewrite": (f"Rename the variable `total` to `revenue` in this code. Reply with the full code only.\n\n{_CODE}",
                f"Rename the function `summarize` to `report` in this code. Reply with the full code only.\n\n{_CODE}",
                f"Add a docstring to this function. Reply with the full code only.\n\n{_CODE}"),
}
TASKS = ("mixed", *PROMPTS)


def builtin_prompt_sets(tasks: Sequence[str]) -> dict[str | None, list[str]]:
    """The built-in prompts of each task given, by task (one task: the set needs no name)."""
    if len(tasks) == 1:
        return {None: builtin_prompts(tasks[0])}
    return {task: builtin_prompts(task) for task in tasks}


def builtin_prompts(task: str) -> list[str]:
    if task == "mixed":
        return [p for kind in ("chat", "code", "summary", "creative") for p in PROMPTS[kind]]
    if task not in PROMPTS:
        raise SpecError(f"unknown task {task!r}; choose one of: {', '.join(TASKS)}")
    return list(PROMPTS[task])


def load_prompts(path: Path, notify: Callable[[str], None] = lambda _message: None) -> list[str]:
    """The user's prompts: one per line, or JSON Lines with a "prompt" field (or a JSON string) per line.

    Bytes that are not UTF-8 are replaced, and `notify` is told."""
    try:
        text, replaced = decode_user_text(path.read_bytes())
    except OSError as exc:
        raise SpecError(f"cannot read prompts from {path}: {exc.strerror}") from exc
    if replaced:
        notify(f"note: {path} is {NOT_UTF8_NOTE}")
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise SpecError(f"{path} has no prompts")
    if not lines[0].lstrip().startswith(("{", '"')):
        return lines
    prompts = []
    for number, line in enumerate(lines, start=1):
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SpecError(f"{path}, line {number}: not JSON ({exc.msg})") from exc
        prompt = item.get("prompt") if isinstance(item, dict) else item
        if not isinstance(prompt, str) or not prompt.strip():
            raise SpecError(f"{path}, line {number}: expected a \"prompt\" string")
        prompts.append(prompt)
    return prompts


@dataclass(frozen=True)
class Config:
    """One way of decoding: a draft mode ("none" for the target alone), K (a number or "auto"), for sampled
    decoding the temperature and the verification rule; and the prompt set it runs on (None: the only one)."""

    draft_mode: str
    draft_max: int | str
    temperature: float = 0.0
    verify: str = DEFAULT_VERIFY
    task: str | None = None
    where: str | None = None  # "local" or "rpc" (the target split over RPC workers) when both are measured

    @property
    def label(self) -> str:
        return self._named("target alone" if self.draft_mode == "none" else f"{self.draft_mode} K={self.draft_max}")

    @property
    def series(self) -> str:
        """What a plot draws as one line across K: the label without K, with the prompt set."""
        name = self._named("target alone" if self.draft_mode == "none" else self.draft_mode)
        return f"{name}, {self.task}" if self.task else name

    def _named(self, name: str) -> str:
        """`name` with the rule and temperature of sampled decoding (the target alone has no rule), and where
        the target runs."""
        if self.temperature:
            rule = "" if self.draft_mode == "none" else f" {self.verify}"
            name = f"{name}{rule} T={self.temperature:g}"
        return f"{name}, {PLACES[self.where]}" if self.where else name


TARGET_ALONE = Config("none", 0)
PLACES = {"local": "local", "rpc": "over RPC"}


def configurations(modes: Sequence[str], ks: Sequence[int | str], temperatures: Sequence[float],
                   rules: Sequence[str], tasks: Sequence[str | None] = (None,),
                   places: Sequence[str | None] = (None,)) -> list[Config]:
    """For each prompt set, temperature and place of the target, the target alone and then every
    mode × K × rule (greedy needs no rule)."""
    configs = []
    for task, temperature, where in itertools.product(tasks, temperatures, places):
        configs.append(Config("none", 0, temperature, task=task, where=where))
        for mode, k in itertools.product(modes, ks):
            for rule in (rules if temperature > 0 else [DEFAULT_VERIFY]):
                configs.append(Config(mode, k, temperature, rule, task, where))
    return configs


@dataclass
class Side:
    """The runs of one configuration, and the figures derived from them."""

    config: Config
    runs: list[Stats] = field(default_factory=list)
    outputs: list[tuple[list[int], list[int]]] = field(default_factory=list)  # (prompt, tokens) of each run
    differences: list[Difference | None] | None = None  # greedy drafted runs against the target alone's

    @property
    def label(self) -> str:
        return self.config.label

    @property
    def rates(self) -> list[float]:
        return [s.tokens_per_second for s in self.runs]

    @property
    def tokens_per_second(self) -> float:
        return statistics.median(self.rates)

    @property
    def totals(self) -> Stats:
        total = Stats(draft_max=0)
        for run in self.runs:
            total.merge(run)
        return total

    @property
    def drafted(self) -> int:
        return self.totals.drafted

    @property
    def acceptance_rate(self) -> float:
        return self.totals.acceptance_rate

    @property
    def mean_accepted_length(self) -> float:
        return self.totals.mean_accepted_length

    @property
    def alpha(self) -> float:
        """Per-token acceptance α̂ = accepted / (accepted + rounds that ended in a rejection)."""
        t = self.totals
        denominator = t.accepted + t.rejected_rounds
        return t.accepted / denominator if denominator else 0.0

    @property
    def seconds_per_pass(self) -> float:
        """Mean seconds of one target pass (a verify, or a plain step for the target alone): where the
        round trips to RPC workers show."""
        t = self.totals
        return t.verify_s / t.rounds if t.rounds else 0.0

    @property
    def acceptance(self) -> PositionAcceptance:
        t = self.totals
        return PositionAcceptance.from_counts(t.reached_at, t.accepted_at, t.rejected_rounds)

    def share(self, part: str) -> float:
        """Fraction of decode time spent in `part`: "draft_s", "convert_s" (of drafting: translating between
        vocabularies), "verify_s", "rollback_s" (taking rejected tokens back: snapshots, restores, replays) or
        "overhead_s" (outside llama.cpp)."""
        t = self.totals
        return getattr(t, part) / t.decode_s if t.decode_s else 0.0


def compare(pair: Pair, configs: Sequence[Config], prompts: Mapping[str | None, Sequence[str]],
            max_tokens: int = 128, repeat: int = 1, raw: bool = False, sampling: SamplingParams = SamplingParams(),
            progress: Callable[[str], None] = lambda _label: None, rpc_pair: Pair | None = None) -> list[Side]:
    """Runs of every prompt of each set under every configuration for that set (`prompts` by task), rotating
    through the configurations; one Side each. Configurations placed "rpc" run on `rpc_pair` (the same files,
    the target split over RPC workers).

    Each run of a prompt uses the same seed in every configuration, so sampled runs compare like with like, and starts
    from models that hold nothing of it (`Pair.forget_prompts`) and an empty memory of earlier outputs.
    `sampling` gives every setting but the temperature, which each configuration brings.
    """
    sides = [Side(config) for config in configs]
    for round_number, (task, task_prompts) in itertools.product(range(repeat), prompts.items()):
        for prompt_number, prompt in enumerate(task_prompts):
            for side in (side for side in sides if side.config.task == task):
                config = side.config
                runner = rpc_pair if config.where == "rpc" and rpc_pair is not None else pair
                runner.forget_prompts()  # each configuration takes the prompt in itself, as the first to run it did
                progress(side.label)
                request = GenerationRequest(sampling=replace(sampling, temperature=config.temperature),
                                            seed=round_number * len(task_prompts) + prompt_number,
                                            draft_max=config.draft_max, draft_mode=config.draft_mode,
                                            verify=config.verify, max_tokens=max_tokens)
                runner.output_memory.forget()  # another configuration's run of this prompt wrote its answer
                generation = runner.generate(prompt, request, raw=raw)
                for _event in generation:
                    pass
                side.runs.append(generation.stats)
                side.outputs.append((generation.prompt, generation.token_ids))
    _compare_texts(pair, sides)
    return sides


def _compare_texts(pair: Pair, sides: Sequence[Side]) -> None:
    """Each greedy drafted run's text against the target alone's on the same prompt, in the same place: where it
    first differs, with the target alone's margin there (`ties`), so a float tie shows as one and a bug as a bug."""
    alone = {(s.config.task, s.config.where): s for s in sides
             if s.config.draft_mode == "none" and not s.config.temperature}
    for side in sides:
        reference = alone.get((side.config.task, side.config.where))
        if side.config.draft_mode == "none" or side.config.temperature or reference is None:
            continue
        side.differences = [first_difference(pair.target, prompt, ours, theirs)
                            for (prompt, ours), (_, theirs) in zip(side.outputs, reference.outputs)]


def pooled_costs(sides: Sequence[Side], shape: str = PER_TOKEN) -> LoopCosts:
    """Every call of these sides priced together, for a drafter of cost shape `shape`: the cost model's inputs for
    the predicted column. Each
    prompt set is pooled apart: a longer context makes every call dearer (on the demo pair the rewrite
    prompts' draft steps and verifies cost 11–14% more than the chat prompts'); so is each place of the
    target (a pass over RPC pays round trips). Read at the mean context the draft's calls were measured at: the
    whole run's, not where its last round ended."""
    costs = LoopCosts(shape=shape)
    for side in sides:
        costs.merge(side.totals.costs)
    costs.at(round(costs.draft_context.at or 0))
    return costs


# One drafter with a cost of its own, one K per round: the draft model, the EAGLE-3, DFlash and MTP heads.
PREDICTED_MODES = tuple(name for name, mode in MODES.items() if mode.own_model)


def predicted_speedup(side: Side, costs: LoopCosts, baseline: float | None) -> float | None:
    """The cost model's tokens/s for a fixed-K row of a pair's own drafter (`PREDICTED_MODES`) over the target alone's
    measured tokens/s; `costs` must hold that drafter's steps alone (`drafter_costs`).

    Only those rows have one K and one drafter per round; n-gram proposals vary in length from round to
    round, and hybrid and auto rows change drafter or K as they go."""
    k = side.config.draft_max
    if side.config.draft_mode not in PREDICTED_MODES or not isinstance(k, int) or not k or not baseline:
        return None
    rate = costs.rate(k, side.acceptance)
    return rate / baseline if rate else None


def report(sides: Sequence[Side], settings: dict[str, object], repeat: int = 1) -> dict[str, object]:
    """Everything the benchmark measured, as one JSON-ready object. Speed-ups are against the target alone on
    the same prompt set at the same temperature; the costs are pooled over the whole run. `repeat`: the rounds of
    runs `compare` made."""
    baselines = {(s.config.task, s.config.temperature, s.config.where): s.tokens_per_second for s in sides
                 if s.config.draft_mode == "none"}
    groups = dict.fromkeys((s.config.task, s.config.where) for s in sides)
    costs = {group: pooled_costs([s for s in sides if (s.config.task, s.config.where) == group]) for group in groups}
    # A drafter's rows are priced with its own draft steps: a pair may draft with a model and with its MTP head.
    drafter_costs = {(*group, mode): pooled_costs([s for s in sides if (s.config.task, s.config.where) == group
                                                   and s.config.draft_mode in (mode, "none")],
                                                  MODES[mode].cost_shape)
                     for group in groups for mode in PREDICTED_MODES}
    configs = []
    for side in sides:
        k = side.config.draft_max
        baseline = baselines.get((side.config.task, side.config.temperature, side.config.where))
        configs.append({
            "label": side.label,
            "series": side.config.series,
            "draft_mode": side.config.draft_mode,
            "draft_max": k,
            "temperature": side.config.temperature,
            "verify": side.config.verify,
            "task": side.config.task,
            "where": side.config.where,
            "tokens_per_second": {"median": side.tokens_per_second, "min": min(side.rates),
                                  "max": max(side.rates)},
            "speedup": side.tokens_per_second / baseline if baseline else None,
            "predicted_speedup": predicted_speedup(
                side, drafter_costs.get((side.config.task, side.config.where, side.config.draft_mode), LoopCosts()),
                baseline),
            "acceptance_rate": side.acceptance_rate,
            "alpha": side.alpha,
            "mean_accepted_length": side.mean_accepted_length,
            "seconds_per_target_pass": side.seconds_per_pass,
            "position_acceptance": side.totals.position_acceptance,
            "ways": side.totals.way_shares(),
            "time_share": {"draft": side.share("draft_s"), "convert": side.share("convert_s"),
                           "verify": side.share("verify_s"),
                           "rollback": side.share("rollback_s"), "outside_llama_cpp": side.share("overhead_s")},
            "runs": [run.as_dict() for run in side.runs],
            "same_as_target_alone": _same_text(side),
        })
    _against_pinned(configs, [_texts(side) for side in sides], repeat)
    return {
        "settings": settings,
        "costs": {_group_name(*group): group_costs.as_dict() for group, group_costs in costs.items()},
        "configs": configs,
    }


def _same_text(side: Side) -> dict[str, Any] | None:
    """How many greedy runs gave the target alone's text, and where each other one first differs (run index,
    generated token, both tokens, the target alone's margin, whether it is a float tie); None where not compared."""
    if side.differences is None:
        return None
    parted = [{"run": i, **asdict(d)} for i, d in enumerate(side.differences) if d is not None]
    return {"runs": len(side.differences), "same": len(side.differences) - len(parted), "differences": parted}


def _against_pinned(configs: list[dict[str, Any]], texts: list[list[tuple[int, ...]] | None], repeat: int) -> None:
    """Give each hybrid row (the default) its tokens/s over the best pinned mode's, at whichever K that mode ran
    best, on the same prompts and settings: the default exists to be at least as fast as the best single way,
    and this is where to see whether it is. With two rounds of runs or more (`repeat`), also `held_out`: that ratio
    without the best row's luck (`held_out.held_out_ratio`).

    Like for like: each pinned row is read over the runs in which it wrote the default's text (`texts`, each row's
    greedy texts run by run; None: sampled, every run compared). Greedy texts part where the target's two best
    logits tie within float rounding between a batched pass and a one-row step, and the text after the tie is
    another workload: on the demo pair a chat prompt's answer that repeats itself, which the lookup drafts at twice
    the target alone's speed, and one that does not (50 tok/s). One run of the default parted so made it read 0.64×
    the best pinned mode where the runs in which both wrote the same text read 0.82×. `compared` says over how many
    runs, where fewer than all."""
    def setting(c: dict[str, Any]) -> tuple:
        return c["task"], c["temperature"], c["verify"], c["where"]
    for c, mine in zip(configs, texts):
        peers = [(p, theirs) for p, theirs in zip(configs, texts)
                 if p["draft_mode"] not in ("hybrid", "none") and setting(p) == setting(c)]
        if c["draft_mode"] != "hybrid" or not peers:
            continue
        rates = [run["tokens_per_second"] for run in c["runs"]]
        kept = [_kept(p, mine, theirs) for p, theirs in peers]
        read = [(ratio, p, other) for (p, _), other in zip(peers, kept)
                if (ratio := paired_ratio(rates, other)) is not None]
        if not read:
            continue
        ratio, best, other = min(read, key=lambda item: item[0])
        c["against_best_pinned"] = {"label": best["label"], "ratio": ratio}
        compared = sum(rate is not None for rate in other)
        if compared < len(rates):
            c["against_best_pinned"]["compared"] = compared
        held_out = held_out_ratio(_rounds(rates, repeat), [_rounds(other, repeat) for other in kept])
        if held_out is not None:
            c["against_best_pinned"]["held_out"] = held_out


def _texts(side: Side) -> list[tuple[int, ...]] | None:
    """A greedy row's texts, run by run (None for a sampled row: its texts are a law's draws, compared as one)."""
    if side.config.temperature or len(side.outputs) != len(side.runs):
        return None
    return [tuple(tokens) for _prompt, tokens in side.outputs]


def _kept(config: dict[str, Any], mine: list[tuple[int, ...]] | None,
          theirs: list[tuple[int, ...]] | None) -> list[float | None]:
    """A pinned row's tokens/s run by run, each run whose text is not the default's (`mine`) left out (None); every
    run where either row is sampled."""
    return [run["tokens_per_second"] if mine is None or theirs is None or mine[i] == theirs[i] else None
            for i, run in enumerate(config["runs"])]


def _rounds(rates: Sequence[float | None], repeat: int) -> list[list[float | None]]:
    """Tokens/s run by run, in `repeat` rounds: each round runs every prompt once, in order (`compare`)."""
    per_round = len(rates) // repeat
    return [list(rates[i * per_round:(i + 1) * per_round]) for i in range(repeat)]


def _group_name(task: str | None, where: str | None) -> str:
    """A set of runs priced together: its prompt set and where the target ran, or "all"."""
    return ", ".join(part for part in (task, PLACES.get(where or "")) if part) or "all"


def plot(result: dict[str, object], path: Path) -> None:
    """tokens/s (from 0) and acceptance against K, one line per series (draft mode, rule and temperature when
    sampled, prompt set when there are several), the target alone of each as a reference line."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise SpecError("--plot needs matplotlib: pip install 'spec-cli[plot]'") from exc
    configs = result["configs"]
    figure, (speed, acceptance) = plt.subplots(1, 2, figsize=(11, 4.2))
    baselines = [c for c in configs if c["draft_mode"] == "none"]
    for alone, dashes in zip(baselines, itertools.cycle(("--", "-.", (0, (1, 1)), (0, (5, 1, 1, 1, 1, 1))))):
        speed.axhline(alone["tokens_per_second"]["median"], color="grey", linestyle=dashes, label=alone["series"])
    for series in dict.fromkeys(c["series"] for c in configs if c["draft_mode"] != "none"):
        members = [c for c in configs if c["series"] == series]
        fixed = sorted((c for c in members if isinstance(c["draft_max"], int)), key=lambda c: c["draft_max"])
        line = speed.plot([c["draft_max"] for c in fixed], [c["tokens_per_second"]["median"] for c in fixed],
                          marker="o", label=series)[0]
        acceptance.plot([c["draft_max"] for c in fixed], [c["acceptance_rate"] for c in fixed], marker="o",
                        label=series, color=line.get_color())
        for auto in (c for c in members if c["draft_max"] == "auto"):
            speed.axhline(auto["tokens_per_second"]["median"], color=line.get_color(), linestyle=":",
                          label=f"{auto['series']} K=auto")
    speed.set(xlabel="K (draft tokens per round)", ylabel="tokens/s (median)", title="Decoding speed")
    speed.set_ylim(bottom=0)  # from 0, so the gaps between lines read as the ratios they are
    acceptance.set(xlabel="K (draft tokens per round)", ylabel="acceptance rate", ylim=(0, 1.05),
                   title="Acceptance")
    ks = sorted({c["draft_max"] for c in configs if c["draft_mode"] != "none" and isinstance(c["draft_max"], int)})
    for axes in (speed, acceptance):
        axes.set_xticks(ks)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
    figure.tight_layout()
    try:
        figure.savefig(path, format="png", dpi=110)
    except OSError as exc:
        raise SpecError(f"cannot write {path}: {exc.strerror}") from exc
    finally:
        plt.close(figure)
