"""What `load_pair` decides before anything generates: the default context, read from the model as llama-server
reads it, and said in one line where a context reaches past what the target was trained on."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.tiny_models import N_CTX_TRAIN, write_model
from typer.testing import CliRunner

from spec_cli import load_pair
from spec_cli import pair as pairs
from spec_cli.cli import options
from spec_cli.cli.app import app
from spec_cli.decoding.draft_length import AUTO_K_MAX


def test_the_default_context_is_the_trained_one_where_it_fits(target_path: Path, other_draft_path: Path) -> None:
    with load_pair(target_path, other_draft_path, n_ctx=None) as pair:
        assert pair.n_ctx == N_CTX_TRAIN
        assert not pair.past_training


def test_where_the_trained_context_does_not_fit_the_default_is_what_does(target_path: Path, other_draft_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Room for 300 tokens of both caches, four sequences: 256 tokens each (whole steps of 256, at least one)."""
    with load_pair(target_path, other_draft_path) as pair:
        per_token = pair.target.kv_bytes_per_token + pair.draft.kv_bytes_per_token
        assert pairs.trained_context(pair.target, pair.draft, 1) == N_CTX_TRAIN
        monkeypatch.setattr(pairs, "kv_room", lambda _model: 4 * 300 * per_token)
        assert pairs.trained_context(pair.target, pair.draft, 4) == pairs.CONTEXT_STEP
        monkeypatch.setattr(pairs, "kv_room", lambda _model: 10 * per_token)
        assert pairs.trained_context(pair.target, pair.draft, 1) == pairs.CONTEXT_STEP


def test_a_context_past_the_trained_one_is_said_in_one_line(target_path: Path) -> None:
    result = CliRunner().invoke(app, ["run", "--target", str(target_path), "--no-draft", "--ctx", "1024", "-n", "2",
                                      "--raw", "the cat"])
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if "warning" in line]
    assert warnings == [f"spec: warning: a context of 1024 tokens is past the {N_CTX_TRAIN} {target_path.name} was "
                        f"trained on, and its GGUF declares no RoPE scaling: text past {N_CTX_TRAIN} tokens will not "
                        "make sense"]
    within = CliRunner().invoke(app, ["run", "--target", str(target_path), "--no-draft", "-n", "2", "--raw", "the cat"])
    assert within.exit_code == 0 and "warning" not in within.stderr


def test_rope_scaling_the_gguf_declares_is_meant_to_reach_past_training(tmp_path: Path) -> None:
    scaled = write_model(tmp_path / "scaled.gguf", seed=1, rope_scaling=4.0)
    with load_pair(scaled, None, n_ctx=4 * N_CTX_TRAIN) as pair:
        assert pair.target.rope_scaled and not pair.past_training


def test_a_context_sized_to_the_work_holds_it_and_a_verify_pass_past_it(target_path: Path,
                                                                         other_draft_path: Path) -> None:
    """`holding`, read off the loaded target, sizes the context within the default one: never past it."""
    with load_pair(target_path, other_draft_path, n_ctx=None, holding=lambda _target: 40) as pair:
        assert pair.n_ctx == 40 + AUTO_K_MAX + 1
        assert pair.target_context.n_ctx == pair.draft_context.n_ctx == pair.n_ctx
    with load_pair(target_path, other_draft_path, n_ctx=None, holding=lambda _target: 10 * N_CTX_TRAIN) as pair:
        assert pair.n_ctx == N_CTX_TRAIN


def test_spec_run_sizes_its_context_to_its_prompt_and_max_tokens(target_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The prompt as `generate` tokenizes it (verbatim: the tiny model has no chat template) and -n; a --ctx given is
    the context, as asked."""
    contexts: list[tuple[int, int]] = []
    load = options.load_pair

    def loading(*args: object, **kwargs: object) -> pairs.Pair:
        pair = load(*args, **kwargs)  # type: ignore[arg-type]
        contexts.append((pair.n_ctx, len(pairs.text_tokens(pair.target, "the cat", raw=True))))
        return pair

    monkeypatch.setattr(options, "load_pair", loading)
    for ctx in ([], ["--ctx", "300"]):
        result = CliRunner().invoke(app, ["run", "--target", str(target_path), "--no-draft", "-n", "5", *ctx,
                                          "the cat"])
        assert result.exit_code == 0, result.output
    (sized, prompt), (asked, _) = contexts
    assert sized == prompt + 5 + AUTO_K_MAX + 1 and asked == 300
