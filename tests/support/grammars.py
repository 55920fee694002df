"""What tests of constraints and tool calls ask: whether a grammar takes a text spelt with a model's tokens,
and the calls a client assembles from streamed deltas."""

from __future__ import annotations

import json

import numpy as np

from spec_cli.llama.grammar import Constraints
from spec_cli.llama.model import Model


def accepts(model: Model, grammar: str, text: str) -> bool:
    """Whether the grammar takes `text` whole, each step the longest allowed token that spells its next bytes,
    and is then complete."""
    state = Constraints(model).start(grammar)
    rest = text.encode()
    while rest:
        allowed = [int(t) for t in np.flatnonzero(state.mask()) if model.piece(int(t))
                   and rest.startswith(model.piece(int(t)))]
        if not allowed:
            return False
        token = max(allowed, key=lambda t: len(model.piece(t)))
        state.accept(token)
        rest = rest[len(model.piece(token)):]
    return state.allows(model.vocab_info().eos)


def assembled(deltas: list[dict]) -> list[tuple[str, dict]]:
    """The calls a client assembles from streamed deltas: the name from the first, arguments from all."""
    calls: dict[int, list] = {}
    for call in (call for delta in deltas for call in delta.get("tool_calls", [])):
        entry = calls.setdefault(call["index"], [None, ""])
        entry[0] = call["function"].get("name") or entry[0]
        entry[1] += call["function"]["arguments"]
    return [(name, json.loads(arguments)) for name, arguments in calls.values()]
