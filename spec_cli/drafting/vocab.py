"""Can this draft propose token ids that mean the same to this target, and if not, can it draft through text?

The rules for sharing ids are llama.cpp's own (common/speculative.cpp): same vocabulary type, same BOS/EOS
ids and add-BOS/EOS flags, sizes within 128 of each other, and identical token text from id 5 up to the
smaller vocabulary (the first few ids are special tokens that fine-tunes often rename). A pair that breaks
one drafts through text (`drafting.text`), as long as both can spell plain text.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spec_cli.drafting.translation import Translation
from spec_cli.errors import SpecError
from spec_cli.llama.model import Model

MAX_SIZE_DIFFERENCE = 128
FIRST_COMPARED_TOKEN = 5
PLAIN_TEXT = "The quick brown fox jumps over the lazy dog: 0123456789, (a + b) * c.\n"
SAMPLE_TEXT = ("Speculative decoding keeps the target's output exactly; the draft only guesses ahead.\n"
               "def area(r: float) -> float:\n    return 3.14159 * r ** 2\n"
               "Café, naïve, Straße; 東京は晴れ。 🙂\n")


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


def shares_ids(target: Model, draft: Model) -> bool:
    return all(rule.passed for rule in compare(target, draft))


def translation(target: Model, draft: Model) -> Translation | None:
    """None when the draft's token ids mean the same to the target; else both vocabularies side by side, for
    drafting through text. A pair that cannot spell plain text gets a one-line `SpecError`."""
    if shares_ids(target, draft):
        return None
    both = Translation(target, draft)
    for who, speller in (("draft", both.draft), ("target", both.target)):
        text = PLAIN_TEXT.encode()
        spelt = speller.render(speller.spell(text))
        if spelt != text:
            raise SpecError(f"draft {draft.path.name} cannot draft for target {target.path.name} through text: "
                            f"the {who}'s vocabulary spells {_show(text)} as {_show(spelt)}")
    return both


def through_text_facts(both: Translation) -> list[tuple[str, str]]:
    """What drafting through text has to work with, measured on a sample of prose, code and non-ASCII text:
    the shared tokens (the only ones sampled rounds draft), and how much of the sample they spell."""
    n_draft = len(both.draft.pieces)
    shared = len(both.shared_draft)
    text = SAMPLE_TEXT.encode()
    target_tokens = both.target.spell(text)
    in_shared = np.isin(target_tokens, both.shared_target).sum()
    return [
        ("drafting", "different vocabularies: drafting through text (exact)"),
        ("shared tokens", f"{shared} of the draft's {n_draft} ({shared / n_draft:.0%}): one token in both; "
                          "sampled rounds draft only these"),
        ("sample text", f"{len(target_tokens)} target tokens, {len(both.draft.spell(text))} draft tokens; "
                        f"{in_shared} of the target's are shared ({in_shared / len(target_tokens):.0%})"),
    ]


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
