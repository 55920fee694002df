"""`GET /metrics` (with `spec serve --metrics`, as llama-server's): Prometheus text, llama-server's metric names where
they exist (tokens and seconds of prompts and answers, requests processing and deferred, the largest context used,
target passes), and speculation's own beside them: drafted and accepted tokens, acceptance by position, and each way
of drafting's share of rounds and tokens."""

from __future__ import annotations

from spec_cli.decoding.stats import Stats

PREFIX = "llamacpp:"  # llama-server's, so that dashboards built for it read these as they are


def exposition(totals: Stats, processing: int, deferred: int, n_tokens_max: int) -> str:
    """The text of one scrape: `totals` over every generation so far (finished and running), the requests
    `processing` and `deferred` now, the largest context a sequence has held."""
    lines: list[str] = []

    def metric(name: str, kind: str, about: str, value: float, labels: dict[str, str] | None = None,
               header: bool = True) -> None:
        if header:
            lines.extend([f"# HELP {PREFIX}{name} {about}", f"# TYPE {PREFIX}{name} {kind}"])
        shown = ",".join(f'{key}="{label}"' for key, label in (labels or {}).items())
        number = repr(float(value)) if isinstance(value, float) else str(value)  # a counter in full, never rounded
        lines.append(f"{PREFIX}{name}{{{shown}}} {number}" if shown else f"{PREFIX}{name} {number}")

    metric("prompt_tokens_total", "counter", "Number of prompt tokens processed.", totals.prompt_tokens)
    metric("prompt_seconds_total", "counter", "Prompt process time in seconds.", totals.prompt_s)
    metric("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.",
           totals.prompt_tokens_per_second)
    metric("tokens_predicted_total", "counter", "Number of generation tokens processed.", totals.generated_tokens)
    metric("tokens_predicted_seconds_total", "counter", "Predict process time in seconds.", totals.decode_s)
    metric("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.",
           totals.tokens_per_second)
    metric("requests_processing", "gauge", "Number of requests processing.", processing)
    metric("requests_deferred", "gauge", "Number of requests deferred.", deferred)
    metric("n_tokens_max", "counter", "High watermark of the context size observed.", n_tokens_max)
    metric("n_decode_total", "counter", "Total number of target verify passes a sequence took part in.",
           totals.rounds)
    drafting_rounds = totals.drafted_at[0] if totals.drafted_at else 0  # rounds that drafted a first token
    metric("spec_decode_num_draft_tokens_total", "counter", "Total draft tokens generated.", totals.drafted)
    metric("spec_decode_num_accepted_tokens_total", "counter", "Total draft tokens accepted by the target model.",
           totals.accepted)
    metric("spec_decode_num_drafts_total", "counter", "Total speculative decoding verification steps.",
           drafting_rounds)
    for i, accepted in enumerate(totals.accepted_at):
        metric("spec_decode_num_accepted_tokens_per_pos_total", "counter", "Accepted tokens per draft position.",
               accepted, {"position": str(i + 1)}, header=i == 0)
    for i, drafted in enumerate(totals.drafted_at):
        metric("spec_decode_num_draft_tokens_per_pos_total", "counter", "Drafted tokens per draft position.",
               drafted, {"position": str(i + 1)}, header=i == 0)
    for i, (way, (rounds, _drafted, _accepted)) in enumerate(sorted(totals.ways.items())):
        metric("spec_decode_way_rounds_total", "counter", "Rounds each way of drafting drafted (none: no draft).",
               rounds, {"way": way}, header=i == 0)
    for i, (way, (_rounds, _drafted, accepted)) in enumerate(sorted(totals.ways.items())):
        metric("spec_decode_way_accepted_tokens_total", "counter", "Draft tokens each way had accepted.",
               accepted, {"way": way}, header=i == 0)
    return "\n".join(lines) + "\n"
