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


def test_end_all_ends_a_child_that_is_still_running() -> None:
    process = children.popen([sys.executable, "-c", "import time; time.sleep(600)"])
    children.end_all()
    assert process.returncode is not None
