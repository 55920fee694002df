"""Every process a test starts, started here: with the default SIGINT, SIGTERM and SIGHUP whatever the suite
inherited, and ended when the test ends, pass or fail (`end_all`, run by conftest's autouse fixtures: after each test
what it started, at the end of the session whatever a module's or the session's fixtures left).

A background job's shell, or `nohup`, hands its children an ignored SIGINT (`nohup` an ignored SIGHUP too), and an
ignored signal stays ignored across exec: a test that sends Ctrl-C to a child started from such a suite would wait on
a child that never hears it, and a child left running after a failed test took a core for the rest of the suite.
"""

from __future__ import annotations

import signal
import subprocess
from typing import Any

import pexpect

ENDING_S = 5.0  # how long a child has to end on SIGTERM before it is killed

_started: list[subprocess.Popen | pexpect.spawn] = []


def default_signals() -> None:
    """In the child before exec: SIGINT, SIGTERM and SIGHUP as a terminal's process would have them."""
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)


def popen(args: list[str], **options: Any) -> subprocess.Popen:
    """`subprocess.Popen`, with default signals, ended at the test's teardown."""
    process = subprocess.Popen(args, preexec_fn=default_signals, **options)
    _started.append(process)
    return process


def spawn(command: str, args: list[str], **options: Any) -> pexpect.spawn:
    """`pexpect.spawn` (a child on a terminal), with default signals, ended at the test's teardown."""
    child = pexpect.spawn(command, args, preexec_fn=default_signals, **options)
    _started.append(child)
    return child


def count() -> int:
    """How many children have been started and not yet ended: `end_all(count())` later ends those started since."""
    return len(_started)


def end_all(since: int = 0) -> None:
    """End every child started after the first `since` still running: SIGTERM, then SIGKILL after `ENDING_S`.
    A module's fixture (a worker every test of the module talks to) starts its children before a test's count."""
    while len(_started) > since:
        child = _started.pop()
        if isinstance(child, pexpect.spawn):
            child.close(force=True)
            continue
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=ENDING_S)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(timeout=ENDING_S)
        for stream in (child.stdin, child.stdout, child.stderr):
            if stream is not None:
                stream.close()
