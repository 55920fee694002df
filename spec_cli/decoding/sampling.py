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

import math
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np

from spec_cli.errors import SpecError

SAMPLING_ORDER = "penalties → top-k → top-p → min-p → temperature"
# The smallest temperature that is not greedy: below float32's smallest normal number, 1/T does not fit a float32.
MIN_TEMPERATURE = float(np.finfo(np.float32).tiny)
PENALTY_LIMIT = 1e30  # |presence|, |frequency| and repeat_penalty's factor are held within it (see SamplingParams)


@dataclass(frozen=True)
class SamplingParams:
    """How a token is chosen from logits, with llama.cpp's defaults.

    temperature 0 means greedy: the most likely token after the penalties (the other filters never remove
    it). So does a temperature below MIN_TEMPERATURE (about 1.2·10⁻³⁸), where 1/T overflows float32: as T → 0,
    softmax(z / T) puts all its mass on the largest logit, so greedy *is* the law's limit there, and the one
    value a float32 computation can give. Penalties look at the last `repeat_last_n` tokens of the sequence,
    prompt included, as llama.cpp's server and CLI do: repeat_penalty divides a positive logit (multiplies a
    negative one) of every token seen there; frequency_penalty is subtracted once per occurrence,
    presence_penalty once.

    Every number must be finite. Penalties beyond PENALTY_LIMIT (|presence|, |frequency| > 10³⁰, a
    repeat_penalty outside [10⁻³⁰, 10³⁰]) are clamped to it: a penalized logit then stays finite in float32
    whatever the window, so every law is finite and sums to 1, and the clamp changes no law a float32 could
    tell apart (a token 10³⁰ below the others has probability 0 either way).
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
        for name in ("temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise SpecError(f"{name.replace('_', '-')} must be a finite number, got {getattr(self, name)}")
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
        limits = {"repeat_penalty": (1 / PENALTY_LIMIT, PENALTY_LIMIT),
                  "presence_penalty": (-PENALTY_LIMIT, PENALTY_LIMIT),
                  "frequency_penalty": (-PENALTY_LIMIT, PENALTY_LIMIT)}
        for name, (low, high) in limits.items():
            object.__setattr__(self, name, min(max(getattr(self, name), low), high))  # frozen: set once, here

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE

    @property
    def penalizes(self) -> bool:
        """Whether penalties change anything (llama.cpp's own test for a disabled penalty sampler)."""
        return self.repeat_last_n > 0 and (self.repeat_penalty != 1.0 or self.presence_penalty != 0.0
                                           or self.frequency_penalty != 0.0)

    def recent(self, tokens: Sequence[int]) -> list[int]:
        """The tokens the penalties look at: the last `repeat_last_n` of `tokens` (none when they are off), an
        image's positions (negative ids) left out, as llama.cpp's sampler never hears of them."""
        return [token for token in tokens[-self.repeat_last_n:] if token >= 0] if self.penalizes else []

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


def resolve_sampling(preset: str, model_recommends: dict[str, float | int],
                     given: dict[str, float | int]) -> SamplingParams:
    """The settings to use: llama.cpp's defaults, then the preset, then what the user gave (which always wins).

    "greedy" keeps temperature 0 (reproducible, token-identical to the target alone); "model" takes what the
    target's GGUF recommends, with llama.cpp's temperature 0.8 when it names none.
    """
    if preset not in SAMPLING_PRESETS:
        raise SpecError(f"unknown sampling {preset!r}; choose one of: {', '.join(SAMPLING_PRESETS)}")
    base = {"temperature": LLAMA_CPP_TEMPERATURE, **model_recommends} if preset == "model" else {}
    return SamplingParams(**{**base, **given})


NO_TOKENS, NO_VALUES = np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)


def _penalties(logits: np.ndarray, params: SamplingParams, recent: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """The tokens llama.cpp's repetition, frequency and presence penalties change (the distinct `recent`
    ones) and their penalized logits: the rest of the row stays as it is, so a filter can work on it sparsely."""
    if not params.penalizes or not len(recent):
        return NO_TOKENS, NO_VALUES
    tokens, counts = np.unique(np.asarray(recent[-params.repeat_last_n:]), return_counts=True)
    seen = logits[tokens].astype(np.float32)
    seen = np.where(seen <= 0, seen * params.repeat_penalty, seen / params.repeat_penalty)
    return tokens, (seen - counts * params.frequency_penalty - params.presence_penalty).astype(np.float32)


def penalized(logits: np.ndarray, params: SamplingParams, recent: Sequence[int]) -> np.ndarray:
    """The logits after llama.cpp's repetition, frequency and presence penalties: `logits` itself when none
    applies, else a float32 copy (llama.cpp's precision)."""
    if not params.penalizes or not len(recent):
        return logits
    tokens, values = _penalties(logits, params, recent)
    z = logits.astype(np.float32)
    z[tokens] = values
    return z


def greedy_token(logits: np.ndarray, params: SamplingParams, recent: Sequence[int] = ()) -> int:
    """The token greedy decoding picks: the most likely one after the penalties."""
    return int(np.argmax(penalized(logits, params, recent)))


class Law:
    """A distribution over the token ids 0..size−1, held on its support: P(tokens[i]) = probs[i] with `tokens`
    ascending, 0 elsewhere; or over every id at once (`tokens` None, P(i) = probs[i]).

    A sampled row's filters keep a few dozen tokens of 10⁵ or more, so p, q, the residual and block
    verification's sums are computed on supports: the host's work per round stays nearly independent of the
    vocabulary's size. `law[x]` reads P(x); `np.asarray(law)` is the dense vector it stands for.
    """

    __slots__ = ("probs", "tokens", "size")

    def __init__(self, probs: np.ndarray, tokens: np.ndarray | None = None, size: int | None = None) -> None:
        self.probs = probs
        self.tokens = tokens
        self.size = probs.size if tokens is None else int(size)

    @classmethod
    def of(cls, law: Law | np.ndarray) -> Law:
        """`law` itself, or a dense vector of probabilities as a Law."""
        return law if isinstance(law, Law) else cls(np.asarray(law, dtype=np.float64))

    @classmethod
    def one_hot(cls, token: int, size: int) -> Law:
        """All probability on one token: greedy decoding's law, and q of a deterministic proposal."""
        return cls(np.ones(1), np.array([token]), size)

    def at(self, ids: np.ndarray | None) -> np.ndarray:
        """P at `ids`, or at every id (the dense vector) when None."""
        if self.tokens is None:
            return self.probs if ids is None else self.probs[ids]
        if ids is None:
            dense = np.zeros(self.size, dtype=self.probs.dtype)
            dense[self.tokens] = self.probs
            return dense
        where = np.minimum(np.searchsorted(self.tokens, ids), self.tokens.size - 1)
        return np.where(self.tokens[where] == ids, self.probs[where], 0.0)

    def __getitem__(self, ids: int | Sequence[int] | np.ndarray) -> float | np.ndarray:
        if not isinstance(ids, (int, np.integer)):
            return self.at(np.asarray(ids))
        if self.tokens is None:
            return float(self.probs[ids])
        i = int(self.tokens.searchsorted(ids))
        return float(self.probs[i]) if i < self.tokens.size and self.tokens[i] == ids else 0.0

    def __array__(self, dtype: np.dtype | None = None, copy: bool | None = None) -> np.ndarray:
        dense = self.at(None)
        return dense if dtype is None else dense.astype(dtype)

    def max(self) -> float:
        return float(self.probs.max())


def probabilities(logits: np.ndarray, params: SamplingParams, recent: Sequence[int] = ()) -> Law:
    """The distribution a sampler draws from, in llama.cpp's order: penalties (over `recent`), top-k,
    top-p and min-p on the distribution at temperature 1, then softmax(logits / T) over what they kept.

    Tokens the filters remove get probability 0. Temperature 0 gives all mass to the greedy token. One
    function for p and q alike: exactness needs both through the same transforms.

    The work is sized by the candidates, not the vocabulary: top-k finds a few hundred candidates in one pass
    over the row (`_top_k`) and the rest runs on those; with no top-k, one softmax pass in float32 (no sort)
    when no other filter is on, else a float64 one, and only the head that top-p and min-p choose from is
    sorted (`_head`).
    """
    n = logits.size
    if params.greedy:
        return Law.one_hot(greedy_token(logits, params, recent), n)
    if 0 < params.top_k < n:
        return _top_law(*_top_k(logits, params, recent), params, n)
    z = penalized(logits, params, recent)
    if params.top_p == 1.0 and params.min_p == 0.0:
        return _softmax(z, params.temperature)
    values = z.astype(np.float64)
    shifted = values - values.max()
    at_one = np.exp(shifted)
    total = at_one.sum()
    kept = _head(at_one / total, params)
    return _cut(kept, shifted[kept], at_one[kept], total, params, n)


def shares_candidates(params: SamplingParams, n: int) -> bool:
    """Whether `row_laws` finds the top-k candidates of a verify pass's rows together: top-k on rows longer
    than the sample, a floor inside the sample, and no penalties (each row would count different recent
    tokens). A softmax over whole rows gains nothing from it: a matrix's passes cost what the rows' do."""
    if params.greedy or params.penalizes or not 0 < params.top_k < n or n <= SAMPLE_SIZE:
        return False
    stride, rank = _sample_rank(params.top_k, n)
    return rank < -(-n // stride)


def row_laws(rows: np.ndarray, params: SamplingParams) -> list[Law]:
    """`probabilities` of each row of a verify pass, where `shares_candidates` holds: the
    strided samples' floors and the threshold pass are one call each for all rows, not one per row.
    A row whose floor keeps fewer than k tokens goes through `probabilities`, which tries lower floors."""
    n = rows.shape[1]
    stride, rank = _sample_rank(params.top_k, n)
    floors = np.partition(rows[:, ::stride], -rank, axis=1)[:, -rank, None]
    hits = np.flatnonzero(rows >= floors)  # flat indices: a 2-D nonzero costs ten times as much
    values = rows.ravel()[hits]
    edges = [0, *np.searchsorted(hits, np.arange(1, len(rows)) * n).tolist(), hits.size]
    return [_top_law(hits[a:b] - i * n, values[a:b], params, n) if b - a >= params.top_k
            else probabilities(rows[i], params) for i, (a, b) in enumerate(zip(edges, edges[1:]))]


def _top_law(kept: np.ndarray, values: np.ndarray, params: SamplingParams, n: int) -> Law:
    """The law from top-k's candidates `kept` (at least k tokens in ascending order, holding the k largest) and
    their penalized logits: the k largest, most likely first (ties by token id, as a stable sort of the row),
    then `_cut`."""
    order = np.argsort(-values, kind="stable")[:params.top_k]
    kept, shifted = kept[order], values[order].astype(np.float64)
    shifted -= shifted[0]
    at_one = np.exp(shifted)
    return _cut(kept, shifted, at_one, at_one.sum(), params, n)


def _cut(kept: np.ndarray, shifted: np.ndarray, at_one: np.ndarray, total: float, params: SamplingParams,
         n: int) -> Law:
    """top-p and min-p on the tokens `kept` (most likely first; `shifted` their logits less the largest,
    `at_one` = exp(shifted), `total` its sum over every token top-k left), then softmax at T."""
    n_keep = kept.size
    if params.top_p < 1.0:
        # The smallest prefix whose mass reaches top_p (at least the most likely token).
        n_keep = min(n_keep, int(np.searchsorted(np.cumsum(at_one), params.top_p * total)) + 1)
    if params.min_p > 0.0:
        n_keep = min(n_keep, int(np.count_nonzero(at_one >= params.min_p * at_one[0])))
    order = kept[:n_keep].argsort()
    scaled = at_one[order] if params.temperature == 1.0 else np.exp(shifted[order] / params.temperature)
    scaled /= scaled.sum()
    return Law(scaled, kept[order], n)


SAMPLE_SIZE = 2048  # about how many logits `_top_k` samples to place its floor
SORTED_AT_MOST = 1024  # candidates sorted whole; more (a lowered floor) are partitioned to k first


def _sample_rank(k: int, n: int) -> tuple[int, int]:
    """The stride of `_top_k`'s sample of a row of n logits, and the rank r of its floor in the sample: some
    4 samples' worth of tokens beyond 2k are expected above the r-th largest sampled logit."""
    stride = n // SAMPLE_SIZE
    return stride, 4 + -(-2 * k // stride)


def _top_k(logits: np.ndarray, params: SamplingParams, recent: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Candidates for the top_k largest penalized logits, as (tokens, values), without partitioning the row:
    at least k tokens, the k largest among them.

    Every token whose logit reaches a floor is a candidate; once there are at least k of them they hold the k
    largest. The floor is the r-th largest of an evenly strided sample of about 2048 logits (`_sample_rank`),
    whatever the row's spread: one pass over the row finds a few hundred candidates. A row where that falls
    short tries a lower floor, and at last every token. Penalties change only the recent tokens: they join
    the candidates with their new values. A row no longer than the sample is a candidate whole.
    """
    k, n = params.top_k, logits.size
    if n <= SAMPLE_SIZE:
        return np.arange(n), penalized(logits, params, recent)
    seen, seen_values = _penalties(logits, params, recent)
    stride, rank = _sample_rank(k, n)
    sample = logits[::stride]
    while True:
        if rank >= sample.size:
            floor = -np.inf
            kept = np.arange(n)
        else:
            floor = np.partition(sample, -rank)[-rank]
            kept = np.flatnonzero(logits >= floor)
        if seen.size:  # the recent tokens' logits give way to their penalized values
            unseen, keep = kept[~np.isin(kept, seen)], seen_values >= floor
            kept, values = np.concatenate([unseen, seen[keep]]), np.concatenate([logits[unseen], seen_values[keep]])
            order = kept.argsort(kind="stable")
            kept, values = kept[order], values[order]
        else:
            values = logits[kept]
        if kept.size >= k:
            break
        rank *= 8
    if kept.size > SORTED_AT_MOST:
        top = np.sort(np.argpartition(values, -k)[-k:])
        kept, values = kept[top], values[top]
    return kept, values


def _head(at_one: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The indices of `at_one` (probabilities at T = 1), most likely first, that top-p and min-p choose from.

    Both filters keep a prefix of the tokens by falling probability, so only the head of that order is sorted:
    with min-p, the tokens it keeps (top-p then cuts among them or keeps them all); with top-p alone, the
    tokens above the first of a few thresholds whose mass reaches top_p. The cumulative sums over the head are
    the whole order's, so the cut is the one a full sort would make.
    """
    top = at_one.max()
    floors = [params.min_p * top] if params.min_p > 0.0 else [top * 1e-2, top * 1e-4, top * 1e-6, 0.0]
    for floor in floors:
        head = np.flatnonzero(at_one >= floor)
        head = head[np.argsort(-at_one[head], kind="stable")]
        if params.min_p > 0.0 or at_one[head].sum() >= params.top_p or floor == 0.0:
            return head
    raise AssertionError("the last floor keeps every token")


EXP_SAFE = 60.0  # exp(x) for x ≤ 60, summed over up to 10¹⁰ tokens, stays far below float32's 3.4·10³⁸


def _softmax(z: np.ndarray, temperature: float) -> Law:
    """softmax(z / T) over every token, in float32: one exp per logit and no sort.

    The usual shift by the maximum m only guards exp against overflow. Where 0 ≤ m/T ≤ EXP_SAFE no exp can
    overflow, and exp(z/T) ≥ exp(z/T − m/T) loses no small probability to underflow that the shift would keep,
    so that pass over the row is skipped. Elsewhere z − m comes first: (z − m)/T can underflow (to −∞, whose
    exp is 0) but never overflow, however small T is, so no ∞ − ∞ turns the row into NaN.
    """
    m = float(z.max())
    shift = not 0.0 <= m / temperature <= EXP_SAFE
    if temperature == 1.0 and not shift:
        e = np.exp(z, dtype=np.float32)
    else:
        if shift:
            e = np.subtract(z, np.float32(m), dtype=np.float32)
            with np.errstate(over="ignore"):  # to −∞: probability 0, as it should be
                e *= np.float32(1.0 / temperature)
        else:
            e = np.multiply(z, 1.0 / temperature, dtype=np.float32)
        np.exp(e, out=e)
    e /= e.sum()
    return Law(e)


class Picker(Protocol):
    """A source of draws that chooses a token from a law by itself."""

    def pick(self, law: Law | np.ndarray) -> int: ...


def sample(law: Law | np.ndarray, rng: np.random.Generator | Picker) -> int:
    """Draw one token id from `law` by inverting its CDF with a single uniform, over its support only; or, from
    a `Picker` (the Gumbel rule's noise at a position, `noise.NoiseCursor`), the token it picks."""
    pick = getattr(rng, "pick", None)  # cheaper than isinstance against a Protocol, once per drafted token
    if pick is not None:
        return pick(law)
    law = Law.of(law)
    index = _inverse_cdf(law.probs, rng.random())
    return index if law.tokens is None else int(law.tokens[index])


CDF_BLOCK = 1024  # weights summed per block when a CDF is long: a sequential cumsum over 10⁵ costs ~1 ms


def _inverse_cdf(weights: np.ndarray, u: float) -> int:
    """The index i with W(i−1) ≤ u·W(n) < W(i), W being the cumulative sums of `weights` (≥ 0, some > 0).

    A long vector is searched in two steps: its block sums, then the block the draw falls in. A draw that
    rounding puts past the last positive weight of its block takes that weight: never a zero-weight index.
    """
    offset = 0
    if weights.size > CDF_BLOCK:
        starts = np.arange(0, weights.size, CDF_BLOCK)
        sums = np.add.reduceat(weights, starts)  # in the weights' own type: float64 makes reduceat crawl
        cumulative = np.cumsum(sums, dtype=np.float64)
        target = u * cumulative[-1]
        block = min(int(np.searchsorted(cumulative, target, side="right")), sums.size - 1)
        u = (target - (cumulative[block - 1] if block else 0.0)) / sums[block]
        offset, weights = int(starts[block]), weights[starts[block]:starts[block] + CDF_BLOCK]
    cumulative = np.cumsum(weights, dtype=np.float64)
    index = min(int(np.searchsorted(cumulative, u * cumulative[-1], side="right")), weights.size - 1)
    if weights[index] <= 0:
        index = int(np.flatnonzero(weights[:index])[-1])
    return offset + index


def _excess(p: Law | np.ndarray, q: Law | np.ndarray, w: float) -> tuple[Law, np.ndarray]:
    """p as a Law, and max(0, w·p − q) on p's support: there is none elsewhere."""
    p, q = Law.of(p), Law.of(q)
    diff = (p.probs if w == 1.0 else w * p.probs) - q.at(p.tokens)
    return p, np.maximum(diff, 0.0, out=diff)


def excess_mass(p: Law | np.ndarray, q: Law | np.ndarray, w: float = 1.0) -> float:
    """Σ max(0, w·p − q): block verification's r."""
    return float(_excess(p, q, w)[1].sum())


def residual(p: Law | np.ndarray, q: Law | np.ndarray, w: float = 1.0) -> Law:
    """norm(max(0, w·p − q)): the distribution that corrects a rejection so the output follows p (w = 1 for
    token verification; block verification weighs p by what the drafted path still owes it, w ≤ 1).

    Where q = 0 and p > 0 the residual keeps all of p there: those are tokens the draft can never propose.
    If it has no positive mass (p == q up to rounding, so a rejection was practically impossible), p
    itself is the right distribution.
    """
    p, diff = _excess(p, q, w)
    total = diff.sum()
    if total <= 0:
        return p
    diff /= total
    return Law(diff, p.tokens, p.size)
