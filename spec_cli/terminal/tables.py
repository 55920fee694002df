"""Tables: the benchmark's comparison, the model pairs and their files, vocabulary rules, and facts."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from spec_cli.reports.models import MemberReport, PairRow
from spec_cli.drafting.vocab import Rule
from spec_cli.reports.summary import percent, way_shares
from spec_cli.terminal.output import human_size


def show_comparison(result: dict) -> None:
    """The benchmark's figures side by side: measured and predicted speed-up against the target alone; a
    speed and a drafting table for each prompt set."""
    console = Console(highlight=False)
    settings, costs = result["settings"], result["costs"]
    temperatures = ", ".join(f"{t:g}" for t in settings["temperatures"] if t > 0)
    sampling = "greedy" if not temperatures else \
        f"{'greedy and ' if 0 in settings['temperatures'] else ''}temperature {temperatures}"
    for task in dict.fromkeys(c["task"] for c in result["configs"]):
        configs = [c for c in result["configs"] if c["task"] == task]
        prompts = len(configs[0]["runs"]) // settings["repeat"]
        console.print(_speed_table(configs, f"Speed{f', {task} prompts' if task else ''}: {sampling}, {prompts} "
                                            f"prompts × {settings['repeat']}, {settings['max_tokens']} tokens each"))
        console.print(_drafting_table(configs, f"Drafting{f', {task} prompts' if task else ''}"))
    for c in result["configs"]:
        if c["position_acceptance"]:
            positions = " ".join(percent(rate) for rate in c["position_acceptance"][:16])
            where = f" ({c['task']})" if c["task"] else ""
            console.print(f"acceptance by draft position, {c['label']}{where}: {positions}", style="dim")
    for c in result["configs"]:
        if c.get("same_as_target_alone"):
            line, style = _same_text_line(c)
            console.print(line, style=style, markup=False)
    for c in result["configs"]:
        if c.get("ways"):
            where = f" ({c['task']})" if c["task"] else ""
            console.print(f"{c['label']}{where} chose: {way_shares(c['ways'])}", style="dim")
    for c in result["configs"]:
        if "against_best_pinned" in c:
            where = f" ({c['task']})" if c["task"] else ""
            best = c["against_best_pinned"]
            held_out = f"; {best['held_out']:.2f}× held out" if "held_out" in best else ""
            compared = (f", over the {best['compared']} of {len(c['runs'])} runs in which both wrote the same text"
                        if "compared" in best else "")
            console.print(f"{c['label']}{where}: {best['ratio']:.2f}× the best pinned mode ({best['label']}"
                          f"{compared}){held_out}")
    for task, task_costs in costs.items():
        console.print(_costs_line(task_costs, "" if task == "all" else f", {task}"), style="dim")
    console.print("runs interleaved across configurations; tokens/s counts decoding only; speed-ups are against the "
                  "target alone in the same place (local, or over RPC); tokens/pass = tokens "
                  "each target pass yields (mean accepted length); draft/verify = shares of decoding time; "
                  "rollback = the share spent taking rejected tokens back (snapshots, restores, replays: "
                  "recurrent and hybrid models); not llama.cpp = time outside its decode calls; "
                  "predicted = the cost model's tokens/s, E[tokens](K) / (draft steps with their catch-up + "
                  "c_verify(K) + o per token), over the target alone's",
                  style="dim", markup=False)


def _same_text_line(config: dict) -> tuple[str, str]:
    """How many greedy runs of a row gave the target alone's text, and where each other one first differs, with
    the target alone's margin there: a float tie (its two best logits within `ties.FLOAT_TIE`) or a bug."""
    same = config["same_as_target_alone"]
    where = f" ({config['task']})" if config["task"] else ""
    parts = [f"{config['label']}{where}: {same['same']}/{same['runs']} runs gave the target alone's text"]
    for d in same["differences"]:
        verdict = "a float tie" if d["tie"] else "NOT a float tie: a bug, please report it"
        parts.append(f"run {d['run'] + 1} differs from generated token {d['position']} ({d['ours']} against "
                     f"{d['alone']}, the target's two best logits {d['margin']:.4f} apart: {verdict})")
    bad = any(not d["tie"] for d in same["differences"])
    return "; ".join(parts), "bold red" if bad else "dim"


def _speed_table(configs: list[dict], title: str) -> Table:
    """Speed and speed-up of each configuration; with the target over RPC too, the time of a target pass,
    where the round trips show."""
    placed = any(c["where"] for c in configs)
    table = _table(title, ("tok/s", "min–max", "speed-up", "predicted", *(("ms/target pass",) if placed else ())))
    for c in configs:
        rate = c["tokens_per_second"]
        table.add_row(c["label"], f"{rate['median']:.1f}", f"{rate['min']:.1f}–{rate['max']:.1f}",
                      f"{c['speedup']:.2f}×" if c["speedup"] else "–",
                      f"{c['predicted_speedup']:.2f}×" if c["predicted_speedup"] else "–",
                      *((f"{c['seconds_per_target_pass'] * 1000:.1f}",) if placed else ()))
    return table


def _drafting_table(configs: list[dict], title: str) -> Table:
    """Acceptance and where the time went; a "conversion" column (of the draft's time) when a draft drafted
    through text."""
    through_text = any(c["time_share"]["convert"] for c in configs)
    table = _table(title, ("accepted", "tokens/pass", "draft/verify", *(("conversion",) if through_text else ()),
                           "rollback", "not llama.cpp"))
    for c in configs:
        if c["draft_mode"] != "none":
            share = c["time_share"]
            table.add_row(c["label"], percent(c["acceptance_rate"]), f"{c['mean_accepted_length']:.2f}",
                          f"{percent(share['draft'])} / {percent(share['verify'])}",
                          *((percent(share["convert"], 1),) if through_text else ()), percent(share["rollback"], 1),
                          percent(share["outside_llama_cpp"], 1))
    return table


def _table(title: str, columns: tuple[str, ...]) -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAD)
    table.add_column("", no_wrap=True)
    for column in columns:
        table.add_column(column, justify="right")
    return table


def _costs_line(costs: dict, where: str) -> str:
    """The run's mean cost of each kind of call, in ms: what the predicted column is built from."""
    def listed(by_size: dict[str, float], name: str) -> str:
        return " · ".join(f"{name}={n}: {seconds * 1000:.1f}" for n, seconds in by_size.items()) or "–"
    return (f"costs on this machine{where} (ms): draft step by tokens fed {listed(costs['draft_step_s'], 'n')}; "
            f"verify {listed(costs['verify_s'], 'K')}; loop per token {costs['other_per_token_s'] * 1000:.2f}")


def show_pairs(rows: list[PairRow], default: str) -> None:
    table = Table(title="Model pairs (spec models show NAME for details)")
    for column in ("name", "target", "draft", "memory", "local", "size on disk"):
        table.add_column(column, justify="right" if column == "size on disk" else "left", overflow="fold")
    for row in rows:
        name = f"{row.name} (default)" if row.name == default else row.name
        table.add_row(name, row.target, row.draft, row.memory or "?", _presence(row.target_present, row.draft_present),
                      human_size(row.size_bytes) if row.size_bytes else "–")
    Console(highlight=False).print(table)


def _presence(target: bool, draft: bool) -> str:
    if target and draft:
        return "[green]both[/]"
    if target or draft:
        return f"[yellow]{'target' if target else 'draft'} only[/]"
    return "[dim]none[/]"


def show_pair(name: str, description: str, settings: dict[str, object], members: list[MemberReport]) -> None:
    console = Console(highlight=False)
    console.print(f"[bold]{name}[/]: {description}")
    console.print(" · ".join(f"{key} {value}" for key, value in settings.items()), style="dim")
    for m in members:
        facts = [("source", m.source)]
        if m.is_file:
            facts.append(("file", str(m.path) if m.path else "not on disk yet (spec models pull)"))
        if m.info is not None:
            facts += [("size", human_size(m.size_bytes)), ("architecture", m.info.architecture),
                      ("type", m.info.quantization), ("context length", str(m.info.context_length or "?")),
                      ("vocabulary", str(m.info.vocab_size)),
                      ("chat template", "yes" if m.info.has_chat_template else "no"),
                      ("memory", m.info.memory), ("rollback", m.info.rollback),
                      ("MTP layers", str(m.info.mtp_layers)),
                      ("recommended sampling", _recommended(m.info.recommended_sampling))]
        show_facts(m.member, facts + m.drafter)


def _recommended(sampling: dict[str, str]) -> str:
    return " · ".join(f"{key} {_number(value)}" for key, value in sampling.items()) or "none (llama.cpp's defaults)"


def _number(text: str) -> str:
    """A metadata value as written, numbers without llama.cpp's trailing zeros (0.600000 → 0.6)."""
    try:
        return f"{float(text):g}"
    except ValueError:
        return text


def show_rules(rules: list[Rule]) -> None:
    table = Table(title="Sharing token ids (llama.cpp's rules; a pair that breaks one drafts through text)")
    for column in ("rule", "", "detail"):
        table.add_column(column)
    for rule in rules:
        table.add_row(rule.name, "[green]pass[/]" if rule.passed else "[yellow]differs[/]", rule.detail)
    Console(highlight=False).print(table)


def show_facts(title: str, facts: list[tuple[str, str]]) -> None:
    table = Table(title=title, show_header=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in facts:
        table.add_row(key, value)
    Console(highlight=False).print(table)


def show_concurrency(result: dict) -> None:
    """`spec bench --concurrency`: at each concurrency, every drafting mode and the target alone side by side: their
    throughput, its ratio to the target alone and to the best side, and each request's latency."""
    console = Console(highlight=False)
    table = _table("Several requests at once", ("mode", "tok/s", "× alone", "of best", "mean K", "acc.",
                                                "first ms", "per tok ms"))
    table.columns[0].header = "at once"
    for level in result["concurrency"]:
        for i, side in enumerate(level["sides"]):
            table.add_row(str(level["concurrency"]) if i == 0 else "", side["draft_mode"],
                          f"{side['tokens_per_second']:.1f}", f"{side['speedup']:.2f}×" if side["speedup"] else "–",
                          f"{side['of_best']:.2f}", f"{side['mean_k']:.2f}",
                          percent(side["acceptance"]) if side["mean_k"] else "–",
                          _latency(side["first_token_s"]), _latency(side["per_token_s"]))
        table.add_section()
    console.print(table)
    for level in result["concurrency"]:
        for side in level["sides"]:
            if side["draft_mode"] == "hybrid" and side.get("of_best_other_held_out") is not None:
                console.print(f"{side['draft_mode']} at {level['concurrency']}: {side['of_best_other_held_out']:.2f}× "
                              "the fastest of the others, held out (chosen on half the runs, read on the rest)")
    console.print("tokens/s = every request's tokens over the batch's wall time, each client sending its next prompt "
                  "as soon as its answer is in (median of the runs); × alone = over "
                  "the target alone at the same concurrency; of best = over the fastest side there; mean K = drafted "
                  "tokens per round (0 where the batch's goodput chose not to draft), acc. the share kept; latency "
                  "p50/p95, the first token from the request's sending, per token after the first", style="dim",
                  markup=False)


def _latency(percentiles: dict) -> str:
    return f"{percentiles['p50'] * 1000:.0f}/{percentiles['p95'] * 1000:.0f}"
