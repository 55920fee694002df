"""`spec bench`: statistics arithmetic, interleaving, prompts files, JSON schema, the plot."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from support.exactness import finish
from support.tiny_models import write_model
from typer.testing import CliRunner

from spec_cli import SpecError, load_pair
from spec_cli.bench.speedup import (TARGET_ALONE, Config, Side, _compare_texts, _same_text, builtin_prompts, compare,
                            configurations, load_prompts, pooled_costs, predicted_speedup, report)
from spec_cli.cli import options
from spec_cli.cli.app import app
from spec_cli.decoding.draft_length import AUTO_K_MAX
from spec_cli.decoding.stats import Stats
from spec_cli.pair import Pair, text_tokens
from spec_cli.bench.ties import Difference, logits_after, tie_tolerance
from spec_cli.terminal.tables import _same_text_line, show_comparison

runner = CliRunner()


def stats(tokens: int, decode_s: float, rounds: int = 0, rejected: int = 0, drafted: int = 0,
          accepted: int = 0) -> Stats:
    return Stats(draft_max=4, generated_tokens=tokens, decode_s=decode_s, rounds=rounds, rejected_rounds=rejected,
                 drafted=drafted, accepted=accepted, draft_s=decode_s / 2, verify_s=decode_s / 4,
                 llama_s=decode_s * 0.9)


def test_side_figures() -> None:
    side = Side(Config("model", 4), [stats(100, 2.0, 20, 10, 80, 60), stats(100, 4.0, 25, 15, 100, 75),
                                     stats(100, 1.0, 20, 5, 80, 70)])
    assert side.rates == [50.0, 25.0, 100.0]
    assert side.tokens_per_second == 50.0
    assert side.acceptance_rate == pytest.approx(205 / 260)
    assert side.mean_accepted_length == pytest.approx(1 + 205 / 65)
    assert side.alpha == pytest.approx(205 / (205 + 30))
    assert side.share("draft_s") == pytest.approx(0.5)
    assert side.share("overhead_s") == pytest.approx(0.1)


def side_at(config: Config, rates: list[float]) -> Side:
    """A row whose runs ran at `rates` tokens/s, in order."""
    return Side(config, [stats(100, 100 / rate) for rate in rates])


def test_the_default_against_the_best_pinned_mode_held_out() -> None:
    """Two rounds of one prompt: the best pinned row is chosen on one round and read on the other, both ways."""
    sides = [side_at(Config("hybrid", "auto"), [50.0, 60.0]), side_at(Config("model", 4), [55.0, 40.0]),
             side_at(Config("ngram", 4), [45.0, 50.0])]
    best = report(sides, {}, repeat=2)["configs"][0]["against_best_pinned"]
    assert best["label"] == "model K=4" and best["ratio"] == pytest.approx(55.0 / 47.5)
    # round 0 picks the model (55 > 45), read on round 1: 60 / 40; round 1 picks n-gram (50 > 40), read on round 0
    assert best["held_out"] == pytest.approx((60.0 / 40.0 + 50.0 / 45.0) / 2)
    assert "held_out" not in report(sides, {})["configs"][0]["against_best_pinned"]  # one round: nothing to hold out


def side_writing(config: Config, rates: list[float], texts: list[list[int]]) -> Side:
    """A row whose runs ran at `rates` tokens/s and wrote `texts`, in order."""
    return Side(config, [stats(100, 100 / rate) for rate in rates], [([1, 2], text) for text in texts])


def test_each_pinned_mode_is_read_over_the_runs_in_which_it_wrote_the_defaults_text(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Two prompts, two rounds. The default's third run parted at a float tie into another text (B), which the
    model's wrote too; the model's first run parted into a text of its own (D). Each pinned row is read over the runs
    in which it wrote the default's text: n-gram over runs 1, 2 and 4 (42 / 51), the model over 2, 3 and 4 (42 / 47),
    where the runs' medians read 43.5 / 68.5 = 0.64 against n-gram."""
    a, b, c, d = [5, 6, 7], [5, 6, 8], [9, 9], [4]
    sides = [side_writing(Config("hybrid", "auto"), [100.0, 40.0, 45.0, 42.0], [a, c, b, c]),
             side_writing(Config("ngram", 5), [92.0, 51.0, 86.0, 44.0], [a, c, a, c]),
             side_writing(Config("model", 5), [57.0, 53.0, 47.0, 43.0], [d, c, b, c])]
    result = report(sides, {}, repeat=2)
    best = result["configs"][0]["against_best_pinned"]
    assert best["label"] == "ngram K=5" and best["ratio"] == pytest.approx(42.0 / 51.0)
    assert best["compared"] == 3
    # round 0 picks n-gram (71.5 against the model's 53), read on round 1 over the run both kept (42 / 44); round 1
    # picks the model (45 against 44), read on round 0 likewise (40 / 53)
    assert best["held_out"] == pytest.approx((42.0 / 44.0 + 40.0 / 53.0) / 2)
    show_comparison({**result, "settings": {"repeat": 2, "max_tokens": 100, "temperatures": [0.0]}})
    assert ("hybrid K=auto: 0.82× the best pinned mode (ngram K=5, over the 3 of 4 runs in which both wrote the "
            "same text); 0.85× held out") in " ".join(capsys.readouterr().out.split())


def test_sampled_rows_are_compared_over_every_run() -> None:
    """Sampled texts are draws of one law, not workloads that a tie parted: every run counts, as before."""
    sides = [side_writing(Config("hybrid", "auto", 0.8), [50.0, 60.0], [[1], [2]]),
             side_writing(Config("model", 4, 0.8), [55.0, 40.0], [[3], [4]])]
    best = report(sides, {})["configs"][0]["against_best_pinned"]
    assert best == {"label": "model K=4 block T=0.8", "ratio": pytest.approx(55.0 / 47.5)}


def test_predicted_speedup_prices_the_rows_acceptance_with_the_runs_costs() -> None:
    """E[tokens](K) from the row's acceptance by position, each call at its mean over the whole run (every
    row's calls pooled), over the target alone's measured rate."""
    alone, model, ngram = Stats(draft_max=0), Stats(draft_max=4), Stats(draft_max=4)
    for _ in range(10):
        alone.costs.record_round([], 0, verify_s=0.040, round_s=0.041, emitted=1)
    for drafted, accepted in [(4, 4), (4, 2), (4, 4), (4, 0)]:
        model.record_round(drafted, accepted)
        model.costs.record_round([(2 if accepted == 4 else 1, 0.012), (1, 0.010), (1, 0.010), (1, 0.010)], 4,
                                 verify_s=0.060, round_s=0.110, emitted=accepted + 1)
    ngram.record_round(3, 3)
    ngram.costs.record_round([], 3, verify_s=0.056, round_s=0.058, emitted=4)
    sides = [Side(TARGET_ALONE, [alone]), Side(Config("model", 4), [model]), Side(Config("ngram", 4), [ngram])]
    costs = pooled_costs(sides)
    assert costs.draft.seconds(1) == pytest.approx((0.012 * 2 + 0.010 * 12) / 14)
    e = 1 + 3 / 4 + 3 / 4 + 2 / 4 + 2 / 4  # a_1..a_4 = 3/4, 3/3, 2/3, 2/2
    draft = 4 * costs.draft.seconds(1) + (2 / 4) * (costs.draft.seconds(2) - costs.draft.seconds(1))
    per_token = (10 * 0.001 + 0.008 * 4 + 0.002) / (10 + 14 + 4)  # round time beyond draft and verify, per token
    expected = e / (draft + 0.060 + per_token * e)
    assert predicted_speedup(sides[1], costs, 25.0) == pytest.approx(expected / 25.0)
    assert predicted_speedup(sides[2], costs, 25.0) is None  # n-gram proposals vary in length
    assert predicted_speedup(Side(Config("model", "auto"), [model]), costs, 25.0) is None


def test_runs_rotate_through_configurations(target_path: Path) -> None:
    configs = [TARGET_ALONE, Config("model", 2), Config("ngram", "auto")]
    order: list[str] = []
    with load_pair(target_path, target_path) as pair:
        sides = compare(pair, configs, {None: ["the cat", "a dog"]}, max_tokens=4, repeat=2, raw=True,
                        progress=order.append)
    labels = [c.label for c in configs]
    assert order == labels * 4
    assert [len(side.runs) for side in sides] == [4, 4, 4]


def test_every_configuration_takes_the_prompt_in_itself(target_path: Path) -> None:
    """A configuration run after another on the same prompt does not find it in the models' caches: the draft's
    catch-up on the prompt counts in decoding time, and only the first to draft with the model would pay it."""
    held: list[tuple[int, int]] = []
    with load_pair(target_path, target_path) as pair:
        assert pair.draft_context is not None
        draft = pair.draft_context

        def starting(_label: str) -> None:
            held.append((pair.target_context.n_past, draft.n_past))

        compare(pair, [TARGET_ALONE, Config("model", 2), Config("model", 3)], {None: ["the cat sat"]}, max_tokens=6,
                raw=True, progress=starting)
        assert draft.n_past > 0  # the last configuration drafted with the model
    assert held == [(0, 0)] * 3


def test_prompt_files(tmp_path: Path) -> None:
    plain = tmp_path / "p.txt"
    plain.write_text("first prompt\n\nsecond prompt\n")
    assert load_prompts(plain) == ["first prompt", "second prompt"]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "a\\nb"}\n"just a string"\n')
    assert load_prompts(jsonl) == ["a\nb", "just a string"]
    broken = tmp_path / "b.jsonl"
    broken.write_text('{"prompt": "ok"}\n{"text": "no prompt field"}\n')
    with pytest.raises(SpecError, match=r"b.jsonl, line 2: expected a \"prompt\" string"):
        load_prompts(broken)
    with pytest.raises(SpecError, match="cannot read prompts"):
        load_prompts(tmp_path / "missing.txt")


def test_prompt_file_with_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("café au lait\nnaïve\n".encode("latin-1"))
    notes: list[str] = []
    assert load_prompts(latin, notify=notes.append) == ["caf\ufffd au lait", "na\ufffdve"]
    assert notes == [f"note: {latin} is not valid UTF-8; the undecodable bytes were replaced with U+FFFD (�)"]


def test_builtin_prompt_set_covers_every_kind() -> None:
    mixed = builtin_prompts("mixed")
    for kind in ("chat", "code", "summary", "creative"):
        assert set(builtin_prompts(kind)) <= set(mixed)
    with pytest.raises(SpecError, match="unknown task 'poetry'"):
        builtin_prompts("poetry")


def run_bench(target_path: Path, *args: str):
    return runner.invoke(app,
                         ["bench", "--target", str(target_path), "--draft", str(target_path), "-n", "8", *args])


def test_json_schema(target_path: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the cat\nthe dog\n")
    out = tmp_path / "result.json"
    result = run_bench(target_path, "--prompts", str(prompts), "-k", "2,4,auto", "--modes", "model", "--repeat", "2",
                       "--json", str(out))
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert set(data) == {"settings", "costs", "configs"}
    assert set(data["costs"]) == {"all"}  # one prompt set
    assert set(data["costs"]["all"]["verify_s"]) >= {"1", "3", "5"} and "1" in data["costs"]["all"]["draft_step_s"]
    assert [c["label"] for c in data["configs"]] == ["target alone", "model K=2", "model K=4", "model K=auto"]
    for config in data["configs"]:
        assert set(config) >= {"tokens_per_second", "speedup", "predicted_speedup", "acceptance_rate", "alpha",
                               "mean_accepted_length", "position_acceptance", "time_share", "runs"}
        assert len(config["runs"]) == 4
        rate = config["tokens_per_second"]
        assert rate["min"] <= rate["median"] <= rate["max"]
    assert data["configs"][0]["speedup"] == 1.0
    assert data["configs"][1]["predicted_speedup"] > 0 and data["configs"][3]["predicted_speedup"] is None
    assert "predicted" in result.stdout and "costs on this machine" in result.stdout
    assert data["configs"][0]["same_as_target_alone"] is None  # the reference itself
    assert [c["same_as_target_alone"] for c in data["configs"][1:]] == [{"runs": 4, "same": 4, "differences": []}] * 3
    assert "model K=2: 4/4 runs gave the target alone's text" in result.stdout


def test_a_greedy_row_that_parts_from_the_target_alone_says_where_and_whether_it_is_a_float_tie(
        target_path: Path) -> None:
    """A text with one token replaced by the target's runner-up where the target is sure (a broken verifier)
    is reported with its position, both tokens and the margin there, as no float tie, in red."""
    with load_pair(target_path, None) as pair:
        prompt = pair.prompt_tokens("the cat", raw=True)
        reference = finish(pair.generate(prompt, max_tokens=12)).token_ids
        rows = [logits_after(pair.target, [*prompt, *reference[:i]]) for i in range(len(reference))]
        margins = [float(np.diff(np.sort(row)[-2:])[0]) for row in rows]
        at = int(np.argmax(margins))
        broken = [*reference[:at], int(np.argsort(rows[at])[-2]), *reference[at + 1:]]
        alone, drafted = Side(TARGET_ALONE), Side(Config("model", 2))
        alone.outputs, drafted.outputs = [(prompt, reference)] * 2, [(prompt, reference), (prompt, broken)]
        _compare_texts(pair, [alone, drafted])
        assert margins[at] > tie_tolerance(pair.target)
    assert alone.differences is None and drafted.differences[0] is None
    assert drafted.differences[1] == Difference(at, broken[at], reference[at], pytest.approx(margins[at]), False)
    line, style = _same_text_line({"label": "model K=2", "task": None, "same_as_target_alone": _same_text(drafted)})
    assert line.startswith("model K=2: 1/2 runs gave the target alone's text; run 2 differs from generated token "
                           f"{at} ({broken[at]} against {reference[at]}, the target's two best logits "
                           f"{margins[at]:.4f} apart: NOT a float tie: a bug, please report it)")
    assert style == "bold red"


def test_plot_is_a_png(target_path: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "sweep.png"
    result = run_bench(target_path, "--task", "chat", "-k", "1,3,auto", "--modes", "model,ngram", "--plot", str(out))
    assert result.exit_code == 0, result.output
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 500 and height > 200


def test_plot_without_matplotlib_says_how_to_get_it(target_path: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = run_bench(target_path, "--task", "chat", "-k", "2", "--plot", str(tmp_path / "x.png"))
    assert result.exit_code == 1
    assert "--plot needs matplotlib: pip install 'spec-cli[plot]'" in result.stderr


def test_bench_on_a_recurrent_pair_shows_the_rollback_share(tmp_path: Path) -> None:
    target = write_model(tmp_path / "mamba.gguf", 1, arch="mamba")
    draft = write_model(tmp_path / "mamba-noisy.gguf", 1, arch="mamba", noise=0.1)
    out = tmp_path / "bench.json"
    result = runner.invoke(app, ["bench", "--target", str(target), "--draft", str(draft), "-k", "4",
                                "-n", "24", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "rollback" in result.stdout
    configs = json.loads(out.read_text())["configs"]  # by default, the default beside every mode it chooses among
    assert [c["label"] for c in configs] == ["target alone", "model K=4", "ngram K=4", "memory K=4", "hybrid K=4"]
    alone, speculative = configs[:2]
    assert alone["time_share"]["rollback"] == 0  # nothing drafted, nothing to take back
    assert 0 < speculative["time_share"]["rollback"] < speculative["time_share"]["verify"] + \
        speculative["time_share"]["draft"]


def test_configurations_pair_each_temperature_with_its_own_baseline_and_rules() -> None:
    configs = configurations(["model"], [4], [0.0, 1.0], ["token", "block"])
    assert [c.label for c in configs] == ["target alone", "model K=4", "target alone T=1", "model K=4 token T=1",
                                          "model K=4 block T=1"]
    assert [c.series for c in configs] == ["target alone", "model", "target alone T=1", "model token T=1",
                                           "model block T=1"]


def test_plot_of_rules_and_temperatures(target_path: Path, other_draft_path: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "rules.png"
    result = runner.invoke(app, ["bench", "--target", str(target_path), "--draft", str(other_draft_path), "-n", "4",
                                 "--task", "creative", "-k", "1,2", "--temp", "0,1", "--verify", "token,block",
                                 "--plot", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_compares_verification_rules_side_by_side(target_path: Path, other_draft_path: Path,
                                                        tmp_path: Path) -> None:
    out = tmp_path / "rules.json"
    result = runner.invoke(app, ["bench", "--target", str(target_path), "--draft", str(other_draft_path), "-n", "8",
                                 "--task", "chat", "-k", "3", "--modes", "model", "--temp", "0.7,1", "--verify",
                                 "token,block", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "temperature 0.7, 1" in result.stdout
    configs = {c["label"]: c for c in json.loads(out.read_text())["configs"]}
    assert list(configs) == ["target alone T=0.7", "model K=3 token T=0.7", "model K=3 block T=0.7",
                             "target alone T=1", "model K=3 token T=1", "model K=3 block T=1"]
    for label, config in configs.items():
        baseline = configs[f"target alone T={label.rsplit('T=', 1)[1]}"]["tokens_per_second"]["median"]
        assert config["speedup"] == pytest.approx(config["tokens_per_second"]["median"] / baseline)
        assert config["verify"] in ("token", "block") and config["temperature"] in (0.7, 1.0)


@pytest.mark.parametrize("args, message", [
    (["--temp", "0.5,hot"], "--temp must be a number >= 0, got 'hot'"),
    (["--verify", "token,joint"], "unknown --verify 'joint'"),
])
def test_bench_sampling_mistakes(target_path: Path, args: list[str], message: str) -> None:
    result = run_bench(target_path, *args)
    assert result.exit_code == 1 and message in result.stderr


def test_several_prompt_sets_in_one_run(target_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each set has its own target-alone baseline and tables; the plot's speed axis starts at 0."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    limits: list[tuple[float, float]] = []
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda figure, *a, **kw: (limits.append(figure.axes[0].get_ylim()),
                                                                      save(figure, *a, **kw)))
    out = tmp_path / "sets.json"
    result = run_bench(target_path, "--task", "chat,rewrite", "-k", "2,3", "--modes", "model,hybrid", "-r", "2",
                       "--json", str(out), "--plot", str(tmp_path / "sets.png"))
    assert result.exit_code == 0, result.output
    assert "Speed, chat prompts" in result.stdout and "Drafting, rewrite prompts" in result.stdout
    data = json.loads(out.read_text())
    configs = data["configs"]
    assert set(data["costs"]) == {"chat", "rewrite"} and "costs on this machine, rewrite (ms)" in result.stdout
    assert [(c["task"], c["label"]) for c in configs] == [
        (task, label) for task in ("chat", "rewrite")
        for label in ("target alone", "model K=2", "model K=3", "hybrid K=2", "hybrid K=3")]
    for config in configs:
        assert len(config["runs"]) == 2 * len(builtin_prompts(config["task"]))
        baseline = next(c for c in configs if c["task"] == config["task"] and c["draft_mode"] == "none")
        assert config["speedup"] == pytest.approx(config["tokens_per_second"]["median"]
                                                  / baseline["tokens_per_second"]["median"])
    for task in ("chat", "rewrite"):  # the default against the best pinned mode at its best K (only the model here)
        pinned = [c for c in configs if c["task"] == task and c["draft_mode"] == "model"]
        best = max(pinned, key=lambda c: c["tokens_per_second"]["median"])
        for hybrid in (c for c in configs if c["task"] == task and c["draft_mode"] == "hybrid"):
            ratio = hybrid["tokens_per_second"]["median"] / best["tokens_per_second"]["median"]
            against = hybrid["against_best_pinned"]
            assert against == {"label": best["label"], "ratio": pytest.approx(ratio), "held_out": against["held_out"]}
            assert (f"{hybrid['label']} ({task}): {ratio:.2f}× the best pinned mode ({best['label']}); "
                    f"{against['held_out']:.2f}× held out" in result.stdout)
            shares = hybrid["ways"]
            # the last rounds of a run, where no token is left to draft, are no choice
            assert 0 < sum(way["rounds"] for way in shares.values()) <= sum(run["rounds"] for run in hybrid["runs"])
            assert f"{hybrid['label']} ({task}) chose: " in result.stdout
    assert limits and limits[0][0] == 0


def test_unknown_task_in_a_list(target_path: Path) -> None:
    result = run_bench(target_path, "--task", "chat,poetry")
    assert result.exit_code == 1 and "unknown task 'poetry'" in result.stderr


def test_spec_bench_sizes_its_pair_to_its_longest_prompt(target_path: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The pair's contexts hold the longest prompt, as the bench tokenizes it (verbatim: the tiny model has no chat
    template), and -n, as `spec run`'s hold its one prompt, with --concurrency too; a --ctx given is kept."""
    contexts: list[int] = []
    load = options.load_pair

    def loading(*args: object, **kwargs: object) -> Pair:
        pair = load(*args, **kwargs)  # type: ignore[arg-type]
        contexts.append(pair.n_ctx)
        return pair

    monkeypatch.setattr(options, "load_pair", loading)
    prompts = ["the cat sat on", "one two three four five six seven eight nine ten"]
    prompts_file = tmp_path / "prompts.txt"
    prompts_file.write_text("\n".join(prompts) + "\n")
    for extra in ([], ["--ctx", "300"], ["--concurrency", "1,2"]):
        result = runner.invoke(app, ["bench", "--target", str(target_path), "--prompts", str(prompts_file), "-n", "5",
                                     "--modes", "ngram", "-k", "2", "-r", "1", *extra])
        assert result.exit_code == 0, result.output
    with load_pair(target_path) as pair:
        longest = max(len(text_tokens(pair.target, prompt, raw=True)) for prompt in prompts)
    held = longest + 5 + AUTO_K_MAX + 1
    assert contexts == [held, 300, held]
