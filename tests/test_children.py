"""The suite's own child processes (`support.children`): they hear Ctrl-C however the suite was started, and none
outlives its test."""

from __future__ import annotations

import signal
import subprocess
import sys

from support import children

# Python installs its own SIGINT handler (KeyboardInterrupt) only where SIGINT starts at its default.
HEARS_SIGNALS = ("import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler, "
                 "signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)")


def test_a_child_starts_with_default_signals_when_the_suite_ignores_sigint() -> None:
    """As under `nohup` or a background job: the suite's SIGINT ignored, the child's at its default."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        process = children.popen([sys.executable, "-c", HEARS_SIGNALS], stdout=subprocess.PIPE, text=True)
        out, _ = process.communicate(timeout=30)
    finally:
        signal.signal(signal.SIGINT, before)
    assert out.split() == ["True", "True"]


def test_end_all_ends_the_children_started_since_and_keeps_the_earlier_ones() -> None:
    """A module's worker, started before a test, outlives the test's own children."""
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    earlier = children.popen(sleep)
    before = children.count()
    later = children.popen(sleep)
    children.end_all(before)
    assert later.returncode is not None and earlier.poll() is None
    children.end_all(before - 1)
    assert earlier.returncode is not None
