"""Where a greedy speculative text parts from the target alone's, and whether the target's own logits tie there.

A verify pass computes a position as one row of a K + 1-row batch; the target alone computes it in a one-row
step. llama.cpp's kernels for the two sum in another order (on some CPUs with other instructions), so the logits
differ by rounding, and where the target's two best logits are closer than that the greedy choice can fall either
way. llama.cpp's own speculative loop has the same property. A difference is a *float tie* when the target alone's
two best logits there are within FLOAT_TIE of each other (by weight type) and both texts' tokens are among the
tied ones; any other difference is a bug.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from spec_cli.llama.context import Context
from spec_cli.llama.model import Model
from spec_cli.llama.vision import Projector

FLOAT_WEIGHTS = {0, 1, 32}  # general.file_type of all-F32, mostly-F16 and mostly-BF16 weights
FLOAT_TIE = {"float weights": 0.25, "quantized": 1.0}
"""The largest margin (in logits) between the target alone's two best tokens that a batched and a one-row pass
can reverse, with room to spare, by weight type. benchmarks/float_ties.py measured how far the two paths move
that margin apart over 256 greedy tokens on four prompts (one past a sliding window), on an AMD EPYC: up to
0.12 with F32 and F16 weights, up to 0.96 with Q4_K_M (quantized kernels also quantize the activations, in other
blocks for a batch than for one row), and the largest margin it saw flip was 0.37. A verifier that emits a token
the target ranks lower by more than this is wrong."""


def tie_tolerance(target: Model) -> float:
    """FLOAT_TIE for the target's weights."""
    file_type = target.metadata("general.file_type")
    floats = file_type is not None and int(file_type) in FLOAT_WEIGHTS
    return FLOAT_TIE["float weights" if floats else "quantized"]


@dataclass(frozen=True)
class Difference:
    """The first place two greedy texts of one prompt part: the generated token's index, each text's token
    there (None where a text had ended), the target alone's margin between its two best logits, and whether
    that is a float tie."""

    position: int
    ours: int | None
    alone: int | None
    margin: float
    tie: bool


def first_difference(target: Model, prompt: Sequence[int], ours: Sequence[int], alone: Sequence[int],
                     tolerance: float | None = None, projector: Projector | None = None) -> Difference | None:
    """Where `ours` first differs from `alone` (both greedy continuations of `prompt`), judged by the target
    alone's logits there within `tolerance` (default: `tie_tolerance`); None when they are the same. A text that
    ended early ended on an end-of-generation token, which must be among the tied ones for a tie. `projector`
    reads the prompt's images."""
    at = next((i for i, (a, b) in enumerate(zip(ours, alone)) if a != b), min(len(ours), len(alone)))
    if len(ours) == len(alone) == at:
        return None
    logits = logits_after(target, [*prompt, *alone[:at]], projector)
    best = np.sort(logits)[-2:]
    tolerance = tie_tolerance(target) if tolerance is None else tolerance
    tied = set(np.flatnonzero(logits >= best[1] - tolerance).tolist())
    mine, theirs = (text[at] if at < len(text) else None for text in (ours, alone))
    ends = any(target.is_end_of_generation(token) for token in tied)
    tie = all(token in tied if token is not None else ends for token in (mine, theirs))
    return Difference(at, mine, theirs, float(best[1] - best[0]), tie)


def logits_after(target: Model, tokens: Sequence[int], projector: Projector | None = None) -> np.ndarray:
    """The target alone's logits for the token after `tokens`, from a context of its own (reading images through
    `projector`)."""
    context = Context(target, n_ctx=len(tokens) + 8, n_threads=1)
    context.projector = projector
    try:
        return context.decode(list(tokens), 1)[0].copy()
    finally:
        context.close()
