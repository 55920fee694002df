"""Logits → probabilities the way llama.cpp's sampler chain computes them, and the speculative-sampling
rules that need them.

Notation follows Leviathan et al. (2023), "Fast Inference from Transformers via Speculative Decoding":
p is the target model's distribution and q the draft model's, both taken *after the same transforms*
(`probabilities`, with the same recent tokens), so the output follows the target's transformed distribution
exactly. A drafted token x is accepted with probability min(1, p(x)/q(x)); on rejection the replacement is
drawn from the residual norm(max(0, p − q)). Block verification, which decides on the drafted block as a
whole, is in `verification`.

The transforms and their defaults are llama.cpp's (`common/common.h`, `src/llama-sampler.cpp`):
penalties → top-k → top-p → min-p → temperature, so `--temp 0.7 --top-p 0.9` means what it means to
`llama-cli`: top-p and min-p look at the distribution at temperature 1, and the temperature reshapes what
they kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from spec_cli.errors import SpecError

SAMPLING_ORDER = "penalties → top-k → top-p → min-p → temperature"


@dataclass(frozen=True)
class SamplingParams:
    """How a token is chosen from logits, with llama.cpp's defaults.

    temperature 0 means greedy: the most likely token after the penalties (the other filters never remove
    it). Penalties look at the last `repeat_last_n` tokens of the sequence, prompt included, as llama.cpp's
    server and CLI do: repeat_penalty divides a positive logit (multiplies a negative one) of every token
    seen there; frequency_penalty is subtracted once per occurrence, presence_penalty once.
    """

    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise SpecError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise SpecError(f"top-k must be >= 0 (0 turns it off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise SpecError(f"top-p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p < 1:
            raise SpecError(f"min-p must be in [0, 1), got {self.min_p}")
        if self.repeat_penalty <= 0:
            raise SpecError(f"repeat-penalty must be > 0 (1 turns it off), got {self.repeat_penalty}")
        if self.repeat_last_n < 0:
            raise SpecError(f"repeat-last-n must be >= 0 (0 turns penalties off), got {self.repeat_last_n}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalizes(self) -> bool:
        """Whether penalties change anything (llama.cpp's own test for a disabled penalty sampler)."""
        return self.repeat_last_n > 0 and (self.repeat_penalty != 1.0 or self.presence_penalty != 0.0
                                           or self.frequency_penalty != 0.0)

    def recent(self, tokens: Sequence[int]) -> list[int]:
        """The tokens the penalties look at: the last `repeat_last_n` of `tokens` (none when they are off)."""
        return list(tokens[-self.repeat_last_n:]) if self.penalizes else []

    def describe(self) -> str:
        """One line for banners and `/set`: the settings that change the distribution."""
        if self.greedy:
            text = "greedy"
        else:
            text = f"temp {self.temperature:g} · top-k {self.top_k} · top-p {self.top_p:g} · min-p {self.min_p:g}"
        if self.penalizes:
            text += (f" · repeat-penalty {self.repeat_penalty:g} over {self.repeat_last_n}"
                     f" · presence {self.presence_penalty:g} · frequency {self.frequency_penalty:g}")
        return text


# GGUF keys of a model's recommended sampling (llama.cpp reads the same ones), by SamplingParams field.
RECOMMENDED_KEYS = {
    "temperature": ("general.sampling.temp", float),
    "top_k": ("general.sampling.top_k", int),
    "top_p": ("general.sampling.top_p", float),
    "min_p": ("general.sampling.min_p", float),
    "repeat_penalty": ("general.sampling.penalty_repeat", float),
    "repeat_last_n": ("general.sampling.penalty_last_n", int),
}
LLAMA_CPP_TEMPERATURE = 0.8  # llama.cpp's default when sampling is asked for and the model says nothing


def recommended(metadata: Callable[[str], str | None]) -> dict[str, float | int]:
    """The sampling settings a GGUF recommends (`general.sampling.*`), by SamplingParams field.

    Values that do not parse, or that SamplingParams would refuse, are left out, so a bad file falls back
    to llama.cpp's defaults instead of failing. A negative penalty window turns penalties off, as in
    llama.cpp.
    """
    found: dict[str, float | int] = {}
    for name, (key, kind) in RECOMMENDED_KEYS.items():
        text = metadata(key)
        if text is None:
            continue
        try:
            value = kind(float(text))
        except (ValueError, OverflowError):
            continue
        if name == "repeat_last_n":
            value = max(int(value), 0)
        try:
            SamplingParams(**{name: value})
        except SpecError:
            continue
        found[name] = value
    return found


SAMPLING_PRESETS = ("greedy", "model")


def settle(preset: str, model_recommends: dict[str, float | int], given: dict[str, float | int]) -> SamplingParams:
    """The settings to use: llama.cpp's defaults, then the preset, then what the user gave (which always wins).

    "greedy" keeps temperature 0 (reproducible, token-identical to the target alone); "model" takes what the
    target's GGUF recommends, with llama.cpp's temperature 0.8 when it names none.
    """
    if preset not in SAMPLING_PRESETS:
        raise SpecError(f"unknown sampling {preset!r}; choose one of: {', '.join(SAMPLING_PRESETS)}")
    base = {"temperature": LLAMA_CPP_TEMPERATURE, **model_recommends} if preset == "model" else {}
    return SamplingParams(**{**base, **given})


def penalized(logits: np.ndarray, params: SamplingParams, recent: Sequence[int]) -> np.ndarray:
    """The logits after llama.cpp's repetition, frequency and presence penalties: `logits` itself when none
    applies, else a float32 copy (llama.cpp's precision; float32 also keeps top-k's partition fast)."""
    if not params.penalizes or not len(recent):
        return logits
    z = logits.astype(np.float32)
    tokens, counts = np.unique(np.asarray(recent[-params.repeat_last_n:]), return_counts=True)
    seen = z[tokens]
    seen = np.where(seen <= 0, seen * params.repeat_penalty, seen / params.repeat_penalty)
    z[tokens] = seen - counts * params.frequency_penalty - params.presence_penalty
    return z


def greedy_token(logits: np.ndarray, params: SamplingParams, recent: Sequence[int] = ()) -> int:
    """The token greedy decoding picks: the most likely one after the penalties."""
    return int(np.argmax(penalized(logits, params, recent)))


def probabilities(logits: np.ndarray, params: SamplingParams, recent: Sequence[int] = ()) -> np.ndarray:
    """The distribution a sampler draws from, in llama.cpp's order: penalties (over `recent`), top-k,
    top-p and min-p on the distribution at temperature 1, then softmax(logits / T) over what they kept.

    Tokens the filters remove get probability 0. Temperature 0 gives all mass to the greedy token. One
    function for p and q alike: exactness needs both through the same transforms.
    """
    z = penalized(logits, params, recent)
    if params.greedy:
        return one_hot(int(np.argmax(z)), z.size)
    kept = np.argpartition(z, -params.top_k)[-params.top_k:] if 0 < params.top_k < z.size else np.arange(z.size)
    values = z[kept].astype(np.float64)
    if params.top_p < 1.0 or params.min_p > 0.0:
        at_one = np.exp(values - values.max())
        at_one /= at_one.sum()
        order = np.argsort(-at_one, kind="stable")
        kept, values, at_one = kept[order], values[order], at_one[order]
        if params.top_p < 1.0:
            # The smallest prefix whose mass reaches top_p (at least the most likely token).
            n_keep = int(np.searchsorted(np.cumsum(at_one), params.top_p)) + 1
            kept, values, at_one = kept[:n_keep], values[:n_keep], at_one[:n_keep]
        if params.min_p > 0.0:
            enough = at_one >= params.min_p * at_one[0]
            kept, values = kept[enough], values[enough]
    scaled = np.exp((values - values.max()) / params.temperature)
    probs = np.zeros(z.size)
    probs[kept] = scaled / scaled.sum()
    return probs


def one_hot(token: int, n_vocab: int) -> np.ndarray:
    """All probability on one token: greedy decoding's law, and q of a deterministic proposal."""
    probs = np.zeros(n_vocab)
    probs[token] = 1.0
    return probs


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from `probs` by inverting the CDF with a single uniform, over the tokens with
    probability > 0 only (the filters leave few; the token drawn is the same as over the whole CDF)."""
    support = np.flatnonzero(probs > 0)
    cumulative = np.cumsum(probs[support])
    index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return int(support[min(index, support.size - 1)])


def excess(p: np.ndarray, q: np.ndarray, w: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """max(0, w·p − q), unnormalised, as (tokens, values) over the tokens with p > 0: it has no mass
    elsewhere, and the filters leave p few tokens. Its sum is block verification's r."""
    support = np.flatnonzero(p > 0)
    return support, np.maximum(w * p[support] - q[support], 0.0)


def residual(p: np.ndarray, q: np.ndarray, w: float = 1.0) -> np.ndarray:
    """norm(max(0, w·p − q)): the distribution that corrects a rejection so the output follows p (w = 1 for
    token verification; block verification weighs p by what the drafted path still owes it, w ≤ 1).

    Where q = 0 and p > 0 the residual keeps all of p there: those are tokens the draft can never propose.
    If it has no positive mass (p == q up to rounding, so a rejection was practically impossible), p
    itself is the right distribution.
    """
    support, diff = excess(p, q, w)
    total = diff.sum()
    if total <= 0:
        return p
    law = np.zeros(p.size)
    law[support] = diff / total
    return law
