"""A `spec serve` server in a thread of the test's process, on a free loopback port, and what it logs."""

from __future__ import annotations

import json
import logging
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import httpx
import openai
import pytest

from spec_cli import GenerationRequest, Pair
from spec_cli.llama.context import Context
from spec_cli.server import app as server
from spec_cli.server.connections import Limits
from spec_cli.server.service import DEFAULT_QUEUE, Service

NAME = "tiny"
HELLO = [{"role": "user", "content": "hello there"}]


class Running:
    """A server in a thread of this process, over `pair`; `lines` collects what it logs, `uvicorn` what uvicorn
    does (a traceback there is a bug)."""

    def __init__(self, pair: Pair, queue_size: int = DEFAULT_QUEUE, api_key: str | None = None,
                 defaults: GenerationRequest = GenerationRequest(draft_max=3, draft_mode="model"),
                 cors: tuple[str, ...] = (), limits: Limits = Limits(), max_tokens: int | None = None,
                 parallel: int = 1, template: str | None = None, cache_ram: int = 0,
                 allow_image_urls: bool = False, metrics: bool = False) -> None:
        self.lines: list[str] = []
        self.service = Service(pair, NAME, defaults, max_tokens=max_tokens, queue_size=queue_size,
                               log=self.lines.append, parallel=parallel, template=template,
                               cache_ram=cache_ram, allow_image_urls=allow_image_urls)
        sock = server.listen("127.0.0.1", 0)
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.uvicorn = Collected()
        self._http = server.http_server(server.create_app(self.service, api_key, cors, limits, metrics), limits)
        self._thread = threading.Thread(target=self._http.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._http.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)

    def client(self, **options: object) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=options.pop("api_key", "unused"), max_retries=0,
                             timeout=30, **options)

    def post(self, path: str, body: object, **options: object) -> httpx.Response:
        content = body if isinstance(body, (str, bytes)) else json.dumps(body)
        return httpx.post(f"{self.url}{path}", content=content, timeout=30, **options)

    def stop(self) -> None:
        self._http.should_exit = True
        self._thread.join(10)
        self.service.close()
        self.uvicorn.close()
        assert not self._thread.is_alive()


class Collected(logging.Handler):
    """What uvicorn logs while a server runs."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        logging.getLogger("uvicorn.error").addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def close(self) -> None:
        logging.getLogger("uvicorn.error").removeHandler(self)
        super().close()

    @property
    def tracebacks(self) -> list[str]:
        return [record.getMessage() for record in self.records if record.exc_info]


@contextmanager
def running(pair: Pair, **options: object) -> Iterator[Running]:
    serving = Running(pair, **options)
    try:
        yield serving
    finally:
        serving.stop()


def slow_down(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every target pass takes 20 ms longer: generations last long enough to be interrupted."""
    decode = Context.decode

    def slowed(self: Context, *args: object, **kwargs: object):
        time.sleep(0.02)
        return decode(self, *args, **kwargs)

    monkeypatch.setattr(pair.target_context, "decode", slowed.__get__(pair.target_context))


def openai_error(response: httpx.Response, status: int) -> dict:
    """The error of an answer that must be `status` with OpenAI's error shape."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def wait_for(condition: Callable[[], bool], within_s: float = 10.0) -> None:
    """Until `condition` holds, which it must within `within_s`."""
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.01)
