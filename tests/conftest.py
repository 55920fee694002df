from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import pytest
from support import children
from support.serving import Running, running, slow_down
from support.tiny_models import CHAT_TEMPLATE, write_model

from spec_cli import Pair, load_pair
from spec_cli.llama import context, heads, kernels
from spec_cli.llama.model import Model


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--threads", type=int, default=None,
                     help="CPU threads for the real-model tests (default: the CPUs their worker runs on); the "
                          "reduction order, and so the float ties a greedy comparison may meet, changes with it")
    parser.addoption("--ties", action="store_true",
                     help="also run greedy identity on every prompt of the tie set (tests/support/prompts.py) for each "
                          "real target, to find float ties here rather than on users' machines")


def pytest_configure(config: pytest.Config) -> None:
    """Each pytest-xdist worker runs on its own share of the CPUs (`-n auto`, one worker a CPU: pyproject), and so
    does every process it starts: a real model's threads default to the CPUs a process may run on (`cpu_threads`).
    Two workers each decoding on both cores of this 2-core machine left llama.cpp's threads spinning for a core the
    other held: the demo pair's four-client test took 29 s instead of 11."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker is None or not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= count:
        os.sched_setaffinity(0, cpus[int(worker.removeprefix("gw")) % count::count])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--ties"):
        skip = pytest.mark.skip(reason="the tie set runs with --ties")
        for item in items:
            if "ties" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def children_ended_at_last() -> Iterator[None]:
    """Whatever a module's or the session's fixtures started (`support.children`) is ended with the session."""
    yield
    children.end_all()


@pytest.fixture(autouse=True)
def ended_children() -> Iterator[None]:
    """Every process the test started (`support.children`) is ended when it ends, pass or fail; a module's
    fixtures, set up before it, keep theirs for the module's other tests."""
    before = children.count()
    yield
    children.end_all(before)


GENERATED_WIDTH = 256  # the generated models' n_embd is at most 128; the real GGUFs' starts at 576


@pytest.fixture(autouse=True, scope="session")
def generated_models_on_one_thread() -> Iterator[None]:
    """Contexts over the generated models decode on one thread: their steps are so small that a second thread
    adds mostly its synchronisation (a one-row decode ~45 µs against ~60 µs on two threads here; test_engine
    11% faster). Each row of a matrix product is one thread's: the logits are bit for bit those of two threads. The
    real GGUFs keep the thread count their tests ask for."""
    made = context.new_context

    def on_one_thread(model: Model, n_ctx: int, n_batch: int, n_threads: int, *args: Any, **settings: Any) -> Any:
        return made(model, n_ctx, n_batch, 1 if model.n_embd <= GENERATED_WIDTH else n_threads, *args, **settings)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(context, "new_context", on_one_thread)
        patch.setattr(heads, "new_context", on_one_thread)
        yield


@pytest.fixture(scope="session")
def threads(request: pytest.FixtureRequest) -> int | None:
    """The thread count the real-model tests load with (`--threads`; None: the CPUs their worker runs on,
    `pytest_configure`)."""
    return request.config.getoption("--threads")


@pytest.fixture(scope="session")
def kernels_probed(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The probe of llama.cpp's kernels on this machine, run once for the session (a few seconds)."""
    folder = tmp_path_factory.mktemp("kernels")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPEC_CLI_CACHE", str(folder))
        patch.delenv(kernels.ENV, raising=False)
        kernels.verdict()
    return (folder / "kernels.json").read_text()


@pytest.fixture(autouse=True)
def user_dirs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, kernels_probed: str) -> Path:
    """No test touches the real home: the cache and config live in a fresh temporary folder, which holds the
    session's probe of the kernels."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("SPEC_CLI_CACHE", str(home / "cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.delenv(kernels.ENV, raising=False)
    (home / "cache").mkdir()
    (home / "cache" / "kernels.json").write_text(kernels_probed)
    return home


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def target_path(models_dir: Path) -> Path:
    return write_model(models_dir / "target.gguf", seed=1)


@pytest.fixture(scope="session")
def other_draft_path(models_dir: Path) -> Path:
    """Same vocabulary as the target, unrelated weights: few of its drafts are accepted."""
    return write_model(models_dir / "other.gguf", seed=2)


@pytest.fixture(scope="session")
def near_draft_path(models_dir: Path) -> Path:
    """The target's weights perturbed: a draft that agrees with it most of the time, not always."""
    return write_model(models_dir / "near.gguf", seed=1, noise=0.05)


@pytest.fixture(scope="session")
def chat_target_path(models_dir: Path) -> Path:
    return write_model(models_dir / "chat.gguf", seed=1, chat_template=CHAT_TEMPLATE)


# Pairs over the tiny target, one per test module: alone, drafting for itself, drafted by unrelated weights.
@pytest.fixture(scope="module")
def alone(target_path: Path) -> Iterator[Pair]:
    with load_pair(target_path, None) as pair:
        yield pair


@pytest.fixture(scope="module")
def same(target_path: Path) -> Iterator[Pair]:
    """The target drafting for itself: every draft must be accepted."""
    with load_pair(target_path, target_path) as pair:
        yield pair


@pytest.fixture(scope="module")
def other(target_path: Path, other_draft_path: Path) -> Iterator[Pair]:
    with load_pair(target_path, other_draft_path) as pair:
        yield pair


@pytest.fixture(scope="module")
def chat_pair(chat_target_path: Path, other_draft_path: Path) -> Iterator[Pair]:
    """The tiny target with a chat template, drafted by unrelated weights: what a server test serves."""
    with load_pair(chat_target_path, other_draft_path) as pair:
        yield pair


@pytest.fixture()
def live(chat_pair: Pair) -> Iterator[Running]:
    """`spec serve`'s app over `chat_pair`, on a free loopback port, for one test."""
    with running(chat_pair) as serving:
        yield serving


@pytest.fixture(scope="module")
def served(chat_pair: Pair) -> Iterator[Running]:
    """`spec serve`'s app over `chat_pair` with two slots, for a module's tests of one API."""
    with running(chat_pair, parallel=2) as serving:
        yield serving


@pytest.fixture()
def slow(chat_pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """`chat_pair`'s steps slowed down, so that a test can act while a generation is under way."""
    slow_down(chat_pair, monkeypatch)


@pytest.fixture(scope="module")
def roomy(target_path: Path, near_draft_path: Path) -> Iterator[Pair]:
    """The target and a draft that agrees with it most of the time, over a context of several thousand tokens."""
    with load_pair(target_path, near_draft_path, n_ctx=8192) as pair:
        yield pair
