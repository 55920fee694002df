"""What one client may hold of `spec serve`: stalled connections are closed, a body that does not come in time
is a 408, a client that leaves halfway is no error, idle connections never lock a client out, and a
connection past the cap with none idle gets a 503. Raw sockets,
as a careless or hostile client would send them."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Iterator

import pytest

from spec_cli import Pair, load_pair
from spec_cli.server.connections import Limits

from support.serving import Running, running

QUICK = Limits(header_timeout_s=0.5, body_timeout_s=0.5, connections=3)


@pytest.fixture(scope="module")
def pair(chat_target_path: Path) -> Iterator[Pair]:
    with load_pair(chat_target_path, draft=None) as loaded:
        yield loaded


@pytest.fixture()
def quick(pair: Pair) -> Iterator[Running]:
    with running(pair, limits=QUICK) as serving:
        yield serving


def connect(serving: Running) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", serving.port))
    sock.settimeout(5)
    return sock


def answer_to(sock: socket.socket) -> tuple[float, bytes]:
    """Seconds until the server closes the connection, and everything it wrote before."""
    started, received = time.monotonic(), b""
    while chunk := sock.recv(65536):
        received += chunk
    return time.monotonic() - started, received


def status_and_error(answer: bytes) -> tuple[int, dict]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)["error"]


@pytest.mark.parametrize("sent", [b"", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le"])
def test_a_connection_that_stalls_before_its_headers_end_is_closed(quick: Running, sent: bytes) -> None:
    with connect(quick) as sock:
        sock.sendall(sent)
        waited, answer = answer_to(sock)
    assert QUICK.header_timeout_s <= waited + 0.05 < 3 and answer == b""


def test_a_kept_alive_connection_gets_the_same_deadline_for_its_next_request(quick: Running) -> None:
    with connect(quick) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        received = b""
        while not received.endswith(b"}"):
            received += sock.recv(65536)
        assert received.startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /heal")
        waited, answer = answer_to(sock)
    assert waited < 3 and answer == b""


def test_a_body_that_does_not_arrive_in_time_is_a_408_and_the_connection_closes(quick: Running) -> None:
    with connect(quick) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b'{"prompt": "x')
        waited, answer = answer_to(sock)
    status, error = status_and_error(answer)
    assert status == 408 and error["code"] == "request_timeout" and waited < 3
    assert b"connection: close" in answer.lower()


def test_a_client_that_leaves_halfway_through_its_body_is_no_error(quick: Running) -> None:
    with connect(quick) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
                     b'{"messages": [{"ro')
        time.sleep(0.1)
    time.sleep(0.3)
    with connect(quick) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert answer_to(sock)[1].startswith(b"HTTP/1.1 200")
    assert not quick.uvicorn.tracebacks and not quick.uvicorn.records


def test_idle_connections_never_lock_out_a_client_that_sends_a_request(quick: Running) -> None:
    """Past the cap a new connection takes the place of the longest idle one (the issue's 300 idle connections
    against a cap of 64, here 10 against 3): the request is answered 200, never reset unread."""
    held = [connect(quick) for _ in range(10)]
    try:
        time.sleep(0.1)
        with connect(quick) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert answer_to(sock)[1].startswith(b"HTTP/1.1 200")
        assert answer_to(held[0])[1] == b""  # the longest idle one was closed for it
    finally:
        for sock in held:
            sock.close()


def test_past_the_cap_with_no_idle_connection_the_request_is_read_and_answered_503(quick: Running) -> None:
    """Every other connection is sending a request (headers in, body pending): the new one's request, body and
    all, is read, then answered 503 in OpenAI's shape and closed (unread data would make the kernel reset it)."""
    held = [connect(quick) for _ in range(QUICK.connections)]
    try:
        for sock in held:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
        time.sleep(0.1)
        with connect(quick) as extra:
            body = json.dumps({"prompt": "x" * 50_000}).encode()
            extra.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                          % (len(body), body))
            _waited, answer = answer_to(extra)
        status, error = status_and_error(answer)
        assert status == 503 and error["code"] == "server_busy" and b"retry-after: 1" in answer
    finally:
        for sock in held:
            sock.close()


@pytest.mark.parametrize("sent", [b"GARBAGE\r\n\r\n", b"GET / HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n"])
def test_bytes_that_are_not_http_get_a_400_in_openais_shape(quick: Running, sent: bytes) -> None:
    with connect(quick) as sock:
        sock.sendall(sent)
        _waited, answer = answer_to(sock)
    status, error = status_and_error(answer)
    assert status == 400 and error["type"] == "invalid_request_error" and not quick.uvicorn.tracebacks
