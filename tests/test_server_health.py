"""What `spec serve` says of itself: /health gives each slot's phase as the worker sees it (its prompt being fed,
with progress; its draft catching up; generating), a client that leaves mid-catch-up frees its slot within a
step, and every refused request is one line of the server's log."""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterator

import httpx
import pytest
from support.serving import NAME, Running, running

from spec_cli import Pair
from spec_cli.decoding.scheduler import Scheduler

STEP_S = 0.03  # what each scheduler step is slowed by, so that a phase lasts long enough to be seen


@pytest.fixture()
def slow_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    step = Scheduler.step

    def slowed(self: Scheduler):  # type: ignore[no-untyped-def]
        time.sleep(STEP_S)
        return step(self)

    monkeypatch.setattr(Scheduler, "step", slowed)


@pytest.fixture()
def server(roomy: Pair, slow_steps: None) -> Iterator[Running]:
    """A server whose draft takes a long prompt in whole (cheaply, by the rates it starts from)."""
    roomy.draft_context.throughput.seed(1e-7)
    roomy.target_context.throughput.seed(1e-5)
    with running(roomy) as serving:
        yield serving


def long_text(first: str) -> str:
    """~4,500 tokens of the tiny vocabulary, from `first` on (no slot holds a prompt that starts otherwise)."""
    return first + " ".join(f"w{i % 37} the cat" for i in range(550))


def health(serving: Running) -> dict:
    return httpx.get(f"{serving.url}/health", timeout=10).json()


def wait_for(serving: Running, seen: Callable[[dict], bool], limit_s: float = 20.0) -> dict:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        report = health(serving)
        if seen(report):
            return report
        time.sleep(0.005)
    raise AssertionError(f"/health never said so within {limit_s} s; last: {report}")


def phase(report: dict) -> str:
    return report["phases"][0]["phase"]


def test_health_says_each_phase_with_its_progress(server: Running) -> None:
    answer: list[httpx.Response] = []
    asking = threading.Thread(target=lambda: answer.append(server.post(
        "/v1/completions", {"prompt": long_text("a"), "max_tokens": 140, "temperature": 0})))
    asking.start()
    try:
        feeding = wait_for(server, lambda r: phase(r) == "prefill" and r["phases"][0]["fed"] > 0)
        assert feeding["busy"] and feeding["active"] == 1 and not feeding["generating"]
        assert 0 < feeding["phases"][0]["fed"] < feeding["phases"][0]["of"] and feeding["phases"][0]["of"] > 4000
        assert feeding["phases"][0]["endpoint"] == "completion"
        catching_up = wait_for(server, lambda r: phase(r) == "catching up")
        first = catching_up["phases"][0]["lacks"]
        later = wait_for(server, lambda r: phase(r) != "catching up" or r["phases"][0]["lacks"] < first)
        assert phase(later) in ("catching up", "generating")
        generating = wait_for(server, lambda r: phase(r) == "generating")
        assert generating["generating"] and generating["phases"][0]["tokens"] > 0
    finally:
        asking.join(60)
    assert answer[0].status_code == 200
    done = wait_for(server, lambda r: not r["busy"])
    assert done["phases"] == [{"slot": 0, "phase": "idle"}] and done["active"] == 0 and not done["generating"]


def test_a_client_that_leaves_mid_catch_up_frees_its_slot(server: Running) -> None:
    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=30,
                      json={"prompt": long_text("b"), "max_tokens": 140, "temperature": 0, "stream": True}) as stream:
        wait_for(server, lambda r: phase(r) == "catching up")
        assert stream.status_code == 200
    freed = wait_for(server, lambda r: not r["busy"], limit_s=5.0)
    assert freed["phases"] == [{"slot": 0, "phase": "idle"}]
    assert any("went away" in line for line in server.lines)
    quick = server.post("/v1/completions", {"prompt": "w1 the cat", "max_tokens": 2, "temperature": 0})
    assert quick.status_code == 200  # the slot serves the next request


def test_every_refused_request_is_one_line_of_the_log(roomy: Pair) -> None:
    with running(roomy, api_key="k") as serving:
        key = {"Authorization": "Bearer k"}
        refused = [
            (serving.post("/v1/completions", {"prompt": "w1"}), "401"),
            (httpx.get(f"{serving.url}/v1/nowhere", headers=key), "404"),
            (serving.post("/v1/completions", "{not json", headers=key), "400"),
            (serving.post("/v1/completions", {"prompt": long_text("c") * 3}, headers=key), "context_length_exceeded"),
            (serving.post("/v1/completions", {"prompt": "w1", "model": 7}, headers=key), "400"),
        ]
        ok = serving.post("/v1/completions", {"prompt": "w1 the cat", "max_tokens": 2, "model": NAME}, headers=key)
    assert [response.status_code for response, _ in refused] == [401, 404, 400, 400, 400] and ok.status_code == 200
    lines = [line for line in serving.lines if ": 4" in line]
    assert len(lines) == len(refused)
    for (response, word), line in zip(refused, lines):
        assert str(response.status_code) in line and word in line and "/v1/" in line
