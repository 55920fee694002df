"""Can this draft propose token ids that mean the same to this target?

The rules are llama.cpp's own (common/speculative.cpp): same vocabulary type, same BOS/EOS ids and
add-BOS/EOS flags, sizes within 128 of each other, and identical token text from id 5 up to the smaller
vocabulary (the first few ids are special tokens that fine-tunes often rename).
"""

from __future__ import annotations

from dataclasses import dataclass

from spec_cli.errors import SpecError
from spec_cli.llama import Model

MAX_SIZE_DIFFERENCE = 128
FIRST_COMPARED_TOKEN = 5


@dataclass(frozen=True)
class Rule:
    """One compatibility rule and how the pair fared on it."""

    name: str
    passed: bool
    detail: str


def compare(target: Model, draft: Model) -> list[Rule]:
    """Every rule, passed or failed, in the order a reader should fix them."""
    t, d = target.vocab_info(), draft.vocab_info()
    rules = [
        _same("vocabulary type", t.vocab_type, d.vocab_type),
        _same("BOS token id", t.bos, d.bos),
        _same("EOS token id", t.eos, d.eos),
        _same("adds BOS", t.add_bos, d.add_bos),
        _same("adds EOS", t.add_eos, d.add_eos),
    ]
    difference = abs(t.n_tokens - d.n_tokens)
    rules.append(Rule("vocabulary size", difference <= MAX_SIZE_DIFFERENCE,
                      f"target {t.n_tokens}, draft {d.n_tokens} (at most {MAX_SIZE_DIFFERENCE} apart)"))
    rules.append(_token_texts(target, draft, min(t.n_tokens, d.n_tokens)))
    return rules


def check(target: Model, draft: Model) -> None:
    """Raise a one-line `SpecError` naming the first rule the pair breaks."""
    for rule in compare(target, draft):
        if not rule.passed:
            raise SpecError(f"draft {draft.path.name} does not fit target {target.path.name}: "
                            f"{rule.name} differs ({rule.detail})")


def _same(name: str, target_value: object, draft_value: object) -> Rule:
    return Rule(name, target_value == draft_value, f"target {target_value}, draft {draft_value}")


def _token_texts(target: Model, draft: Model, n_shared: int) -> Rule:
    name = "token texts"
    for token in range(FIRST_COMPARED_TOKEN, n_shared):
        t_text, d_text = target.token_text(token), draft.token_text(token)
        if t_text != d_text:
            return Rule(name, False, f"first difference at id {token}: target {_show(t_text)}, "
                                     f"draft {_show(d_text)}")
    return Rule(name, True, f"ids {FIRST_COMPARED_TOKEN}..{n_shared - 1} identical")


def _show(text: bytes) -> str:
    return repr(text.decode("utf-8", errors="replace"))
