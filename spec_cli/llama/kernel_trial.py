"""One step of the kernel probe (`kernels`), run in a child process because a kernel that fails here
crashes the process: `python -m spec_cli.llama.kernel_trial STEP MODEL`. Apart from `kernels`, which `Model`
reads its verdict from, so the two never import each other."""

from __future__ import annotations

import sys
from pathlib import Path

from spec_cli.llama.context import Context
from spec_cli.llama.kernels import cpu_threads
from spec_cli.llama.model import Model


def try_step(step: str, path: Path) -> None:
    """Load with extra buffer types and decode as `step` says ("single", "batch" or "draft")."""
    model = Model(path, extra_buffers=True)
    context = Context(model, n_ctx=64, n_threads=min(cpu_threads(), 4), n_batch=8,
                      n_ubatch=1 if step == "draft" else None)
    tokens = model.tokenize("The quick brown fox jumps over the lazy dog")
    first = 1 if step == "single" else 4
    context.decode(tokens[:first], 1)
    context.decode(tokens[first:first + 1], 1)


if __name__ == "__main__":
    try_step(sys.argv[1], Path(sys.argv[2]))
