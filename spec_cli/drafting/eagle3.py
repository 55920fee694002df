"""Drafting with an EAGLE-3 head (Li et al. 2025): one decoder layer trained on the target's own features, the
inputs of three of its layers (low, middle, high) concatenated.

Its fc layer fuses the target's features at position p into g_p, and its memory pairs each token with the g
of the position before: (x_p, g_{p-1}) at its position p − 1, from x_1 on. A pair yields the head's logits
for x_{p+1} and its own pre-norm state, which the next draft step pairs with the drafted token, as an MTP head
feeds back its h'. So it drafts through the MTP head's loop (`MtpDrafter`), with g where the MTP head takes
the target's last hidden state; the verify pass that checks one round's drafts records the features the next
round's catch-up encodes.

Each drafted token is drawn from the head's own logits through the same transforms as the target's p (q is
that law), so token and block verification keep the target's distribution at every temperature.
"""

from __future__ import annotations

import numpy as np

from spec_cli.drafting.mtp import MtpDrafter
from spec_cli.llama.context import Context


class Eagle3Drafter(MtpDrafter):
    """Drafts with the EAGLE-3 head `head` for the target whose context is `target` (which keeps the
    features the head was trained on)."""

    first = 1  # x_0 has no g before it: the head's first pair is (x_1, g_0)

    @staticmethod
    def _check(target: Context) -> None:
        if not target.keeps_features:
            raise ValueError("the target context must keep the head's feature layers (feature_layers=...)")

    def _states(self, start: int, end: int) -> np.ndarray:
        """g_{p-1} = fc(features_{p-1}) for p in [start, end)."""
        assert start >= 1
        return self.head.encode(self.target.features(self.text.positions(start - 1, end - 1)))
