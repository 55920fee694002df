"""Downloads against a local fake Hugging Face endpoint: pull, reuse, resume, offline, errors."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Iterator

import pytest
from support.fake_hub import FakeHub, serve
from typer.testing import CliRunner

from spec_cli.cli.app import app
from spec_cli.models import hub

runner = CliRunner()

REGISTRY = """
[pairs.tiny-hub]
description = "tiny models served by the fake hub"
target = { repo = "org/tiny-GGUF", file = "target.gguf" }
draft = { repo = "org/tiny-draft-GGUF", file = "draft.gguf" }
draft_max = 3
ctx = 256

[pairs.tiny-self]
description = "a self-draft from one download"
target = { repo = "org/tiny-GGUF", file = "target.gguf" }
draft = { derive = "target", type = "q8_0" }

[pairs.missing]
description = "a file the hub does not have"
target = { repo = "org/tiny-GGUF", file = "nope.gguf" }
draft = { repo = "org/tiny-draft-GGUF", file = "draft.gguf" }
"""


@pytest.fixture()
def fake_hub(monkeypatch: pytest.MonkeyPatch, user_dirs: Path, target_path: Path,
             other_draft_path: Path) -> Iterator[FakeHub]:
    state = FakeHub()
    state.add("org/tiny-GGUF", "target.gguf", target_path.read_bytes())
    state.add("org/tiny-draft-GGUF", "draft.gguf", other_draft_path.read_bytes())
    server = serve(state)
    registry = user_dirs / "pairs.toml"
    registry.write_text(REGISTRY)
    monkeypatch.setenv("SPEC_CLI_MODELS", str(registry))
    monkeypatch.setenv("HF_ENDPOINT", state.url)
    monkeypatch.setenv("HF_HOME", str(user_dirs / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield state
    server.shutdown()


def spec(*args: str):
    return runner.invoke(app, list(args))


def leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".incomplete") or p.name.endswith(".part")]


def test_pull_downloads_both_files_then_is_a_no_op(fake_hub: FakeHub, target_path: Path, user_dirs: Path) -> None:
    first = spec("models", "pull", "tiny-hub")
    assert first.exit_code == 0, first.output
    lines = dict(line.split(maxsplit=1) for line in first.stdout.splitlines())
    assert Path(lines["target"]).read_bytes() == target_path.read_bytes()
    assert Path(lines["target"]).is_relative_to(user_dirs / "hf" / "hub")
    assert "target.gguf" in first.stderr  # the progress bar names the file
    assert len(fake_hub.gets("target.gguf")) == 1 and len(fake_hub.gets("draft.gguf")) == 1
    second = spec("models", "pull", "tiny-hub")
    assert second.exit_code == 0 and second.stdout == first.stdout
    assert len(fake_hub.gets("target.gguf")) == 1 and len(fake_hub.gets("draft.gguf")) == 1


def test_run_pulls_on_first_use(fake_hub: FakeHub) -> None:
    result = spec("run", "--pair", "tiny-hub", "--raw", "-n", "6", "--json", "the cat")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert len(data["token_ids"]) == 6 and data["stats"]["adaptive_k"]  # the default chooses K by costs
    pinned = json.loads(spec("run", "--pair", "tiny-hub", "--raw", "-n", "6", "--json", "--draft-mode", "model",
                             "the cat").stdout)
    assert pinned["stats"]["draft_max"] == 3  # the pair's K, for its draft model
    assert fake_hub.gets("target.gguf") and fake_hub.gets("draft.gguf")


def test_dropped_connection_is_retried_to_a_complete_file(fake_hub: FakeHub, target_path: Path,
                                                          user_dirs: Path) -> None:
    """huggingface_hub retries a broken transfer, with a Range request from the last whole chunk it wrote
    (chunks are 10 MB, so for this small file it starts over); nothing partial is left either way."""
    fake_hub.drop_after = 4096
    result = spec("models", "pull", "tiny-hub")
    assert result.exit_code == 0, result.output
    assert len(fake_hub.gets("target.gguf")) == 2
    target = Path(dict(line.split(maxsplit=1) for line in result.stdout.splitlines())["target"])
    assert target.read_bytes() == target_path.read_bytes()
    assert leftovers(user_dirs / "hf") == []


def test_corrupt_download_is_detected_and_removed(fake_hub: FakeHub, user_dirs: Path) -> None:
    fake_hub.corrupt = True
    result = spec("models", "pull", "tiny-hub")
    assert result.exit_code == 1
    assert "org/tiny-GGUF/target.gguf is corrupt" in result.stderr  # the target is fetched first
    assert hub.cached("org/tiny-GGUF", "target.gguf", None) is None
    fake_hub.corrupt = False
    assert spec("models", "pull", "tiny-hub").exit_code == 0


def test_interrupted_download_leaves_no_half_file(fake_hub: FakeHub, user_dirs: Path) -> None:
    class InterruptingBar:
        def __init__(self, **_kwargs: object) -> None:
            pass

        def __enter__(self) -> "InterruptingBar":
            return self

        def __exit__(self, *_exc: object) -> None:
            pass

        def update(self, _n: int) -> None:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        hub.download("org/tiny-GGUF", "target.gguf", None, pull_hint="x", tqdm_class=InterruptingBar)
    assert hub.cached("org/tiny-GGUF", "target.gguf", None) is None
    assert leftovers(user_dirs / "hf") == []
    assert hub.download("org/tiny-GGUF", "target.gguf", None, pull_hint="x").is_file()


def test_offline_with_nothing_cached_says_what_to_run(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = spec("run", "--pair", "tiny-hub", "hi")
    assert result.exit_code == 1
    assert ("org/tiny-GGUF/target.gguf is not downloaded and HF_HUB_OFFLINE is set; "
            "run `spec models pull tiny-hub` with network access") in result.stderr
    assert fake_hub.requests == []


def test_pulled_pair_runs_without_asking_the_hub(fake_hub: FakeHub) -> None:
    assert spec("models", "pull", "tiny-hub").exit_code == 0
    seen = len(fake_hub.requests)
    result = spec("run", "--pair", "tiny-hub", "--raw", "-n", "4", "hi")
    assert result.exit_code == 0, result.output
    assert len(fake_hub.requests) == seen


def test_offline_after_pull_runs_from_the_cache(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    assert spec("models", "pull", "tiny-hub").exit_code == 0
    seen = len(fake_hub.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = spec("run", "--pair", "tiny-hub", "--raw", "-n", "4", "hi")
    assert result.exit_code == 0, result.output
    assert len(fake_hub.requests) == seen


def test_unreachable_hub_with_nothing_cached(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port}")
    # huggingface_hub retries a refused connection five times, waiting 1 + 2 + 4 + 8 + 8 s: the answer is
    # under test, not the wait.
    monkeypatch.setattr(time, "sleep", lambda _seconds: None)
    result = spec("models", "pull", "tiny-hub")
    assert result.exit_code == 1
    assert "is not downloaded and the Hub cannot be reached; run `spec models pull tiny-hub`" in result.stderr


def test_file_missing_on_the_hub(fake_hub: FakeHub) -> None:
    result = spec("models", "pull", "missing")
    assert result.exit_code == 1
    assert "org/tiny-GGUF/nope.gguf does not exist on the Hub" in result.stderr
    assert "Traceback" not in result.output


def test_self_draft_pair_derives_its_draft_and_matches_target_alone(fake_hub: FakeHub) -> None:
    fast = spec("run", "--pair", "tiny-self", "--raw", "-n", "24", "--json", "the cat")
    assert fast.exit_code == 0, fast.output
    assert "(first use only)" in fast.stderr
    plain = spec("run", "--pair", "tiny-self", "--raw", "-n", "24", "--json", "--no-draft", "the cat")
    fast_data, plain_data = json.loads(fast.stdout), json.loads(plain.stdout)
    assert fast_data["token_ids"] == plain_data["token_ids"]
    assert fast_data["stats"]["acceptance_rate"] > 0.5


def test_models_list_shows_presence_after_pull(fake_hub: FakeHub) -> None:
    before = spec("models", "list")
    assert before.exit_code == 0
    row = next(line for line in before.stdout.splitlines() if "tiny-hub" in line)
    assert "none" in row
    spec("models", "pull", "tiny-hub")
    row = next(line for line in spec("models", "list").stdout.splitlines() if "tiny-hub" in line)
    assert "both" in row and "KB" in row
