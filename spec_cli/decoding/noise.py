"""Counter-based Gumbel noise: sampling that no draft, K or batch can change.

Drafter-invariant speculative decoding (Daliri, Musco & Suresh, "Coupling without Communication and
Drafter-Invariant Speculative Decoding", arXiv 2408.07978) samples every position t by the Gumbel-max trick:
with g_t(x) = −log(−log u_t(x)) for uniforms u_t(x), the token argmax_x log p_t(x) + g_t(x) is distributed
as p_t. Here u_t(x) is a hash of (seed, t, x), not a draw from a stream, so the noise at a position is the
same wherever that position is computed: in a one-row step of the target alone, in row i of a K + 1-row
verify pass, or beside other sequences in a batched pass. The draft proposes argmax log q_t + g_t with the
same noise, and a drafted token is kept iff it is the target's own pick (`verification.gumbel_verification`).
The text a seed gives is then the target alone's, token for token, whatever drafts it (up to float ties in
p), and its law is exactly p; drafts agree with the target with probability at least (1 − TV)/(1 + TV)
(TV the total variation distance between p_t and q_t), less than rejection sampling's 1 − TV.
"""

from __future__ import annotations

import numpy as np

from spec_cli.decoding.sampling import Law

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment: successive counters land far apart
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64s (wrapping arithmetic): a bijection that scatters nearby counters."""
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    return x ^ (x >> np.uint64(31))


class GumbelNoise:
    """g_t(x) for one seed: `pick(p, t)` is the token position t takes under law p."""

    def __init__(self, seed: int) -> None:
        self._key = int(_mix(np.array([seed & _MASK], dtype=np.uint64))[0])

    def gumbel(self, position: int, tokens: np.ndarray) -> np.ndarray:
        """g_t at `tokens`: −log(−log u) with u in (0, 1) from the top 53 bits of the hash of (seed, t, x)."""
        row = int(_mix(np.array([(self._key + position * _GOLDEN) & _MASK], dtype=np.uint64))[0])
        bits = _mix(np.uint64(row) ^ (tokens.astype(np.uint64) * np.uint64(_GOLDEN)))
        u = ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53
        return -np.log(-np.log(u))

    def pick(self, law: Law | np.ndarray, position: int) -> int:
        """argmax_x log p(x) + g_t(x) over p's support: a draw from p that depends on (seed, t) alone."""
        law = Law.of(law)
        support = np.flatnonzero(law.probs > 0)
        tokens = support if law.tokens is None else law.tokens[support]
        scores = np.log(law.probs[support]) + self.gumbel(position, tokens)
        return int(tokens[int(np.argmax(scores))])

    def from_position(self, position: int) -> NoiseCursor:
        """Draws for a proposal whose first token lands at `position`."""
        return NoiseCursor(self, position)


class NoiseCursor:
    """What a drafter draws from under the Gumbel rule, in place of a random generator (`sampling.sample`
    asks it): each draw picks with the noise of the next position, so the i-th drafted token uses g_{t+i}."""

    def __init__(self, noise: GumbelNoise, position: int) -> None:
        self.noise, self.position = noise, position

    def pick(self, law: Law | np.ndarray) -> int:
        token = self.noise.pick(law, self.position)
        self.position += 1
        return token
