"""One generation request: how to sample, the seed, K, the drafting mode and its confidence stop, the
verification rule, the token limit, the stop strings and the grammar. Every face builds one (the CLI from its flags,
chat's `/set`, the server from a JSON body, the benchmark for each configuration) and it is checked once,
here, with one set of messages; a face only turns its text or JSON into values first.

A message names its field through the face that built the request (`--draft-max` on the command line, `k`
after `/set`, `'draft_max'` in an HTTP answer): `InvalidRequest.named`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from spec_cli.decoding.reasoning import ReasoningBudget
from spec_cli.decoding.sampling import SamplingParams
from spec_cli.decoding.verification import DEFAULT_VERIFY, GUMBEL, VERIFY_RULES
from spec_cli.drafting.modes import MODES
from spec_cli.errors import SpecError

MAX_K = 64  # the largest fixed K a user may ask for
AUTO = "auto"
RANDOM_SEED = -1  # llama.cpp's LLAMA_DEFAULT_SEED as a request gives it: draw a random seed
# How the library's own messages name each field (the Python API's keyword arguments in words).
NAMES = {"draft_max": "draft-max", "draft_mode": "draft mode", "draft_p_min": "draft-p-min",
         "verify": "verification", "max_tokens": "max-tokens", "grammar": "the grammar"}


class InvalidRequest(SpecError):
    """A request field with a value it cannot take: `field` is the field, `template` the message with a
    `{name}` for it, which each face fills with what its users call that field; `code` a machine-readable
    reason where a client may act on it (OpenAI's "context_length_exceeded")."""

    def __init__(self, field_name: str, template: str, code: str | None = None) -> None:
        self.field, self.template, self.code = field_name, template, code
        super().__init__(self.named(NAMES))

    def named(self, names: Mapping[str, str]) -> str:
        # The first `{name}` only: the value quoted after it may hold braces of its own.
        return self.template.replace("{name}", names.get(self.field, self.field), 1)


class InvalidConstraint(InvalidRequest):
    """A grammar or JSON schema that cannot constrain anything: it does not parse, allows nothing, or uses a
    keyword that cannot be enforced. The command line treats it as a bad option value (exit 2, as Click's
    usage errors)."""


SHOWN_AT_MOST = 40  # characters of a client's value quoted back in an error message


def shown(value: object) -> str:
    """A client's value as an error message quotes it: short, so that no message echoes a long text (a prompt)
    back, and never failing (a huge integer has no decimal text past 4300 digits)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return "an integer too large"
    text = repr(value)
    return text if len(text) <= SHOWN_AT_MOST else f"{text[:SHOWN_AT_MOST - 1]}…"


@dataclass(frozen=True)
class GenerationRequest:
    """What to generate with. `draft_max` is K, or "auto" to let the loop choose K each round; `draft_mode` is
    a mode of `drafting.modes` (None: the pair's own drafting model, `Pair.mode_for`); `draft_p_min` the draft
    model's confidence stop; `verify` the rule sampled rounds are verified with ("block", Sun et al. 2025,
    "token", Leviathan et al. 2023, or "gumbel", Daliri et al. 2024, whose seeded text no draft can change;
    greedy rounds need none; None: `verify_rule` chooses); `stop` strings end the text where the server
    cuts it; `seed` fixes the one random generator of a generation (None, or -1 as in llama.cpp: a random
    one); `grammar` is the grammar the output must follow: GBNF, Lark, or llguidance's JSON grammar (what
    `structured` makes from a JSON schema), compiled over the target's vocabulary once per grammar;
    `reasoning_budget` closes a thought after so many tokens; `control_text`: the control tokens the target
    writes are in the text as their own text (what a chat's tool-call reader reads), not left out."""

    sampling: SamplingParams = field(default_factory=SamplingParams)
    seed: int | None = None
    draft_max: int | str = 4
    draft_mode: str | None = None
    draft_p_min: float = 0.0
    verify: str | None = None
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    grammar: str | None = None
    reasoning_budget: ReasoningBudget | None = None
    control_text: bool = False

    def __post_init__(self) -> None:
        if self.seed == RANDOM_SEED:
            object.__setattr__(self, "seed", None)
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0):
            raise InvalidRequest("seed", "{name} must be a whole number >= 0, or -1 for a random seed, "
                                         f"got {shown(self.seed)}")
        k = self.draft_max
        if k != AUTO and (not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= MAX_K):
            raise InvalidRequest("draft_max", f"{{name}} must be a number from 0 to {MAX_K} or 'auto', got {shown(k)}")
        if self.draft_mode is not None and (not isinstance(self.draft_mode, str) or self.draft_mode not in MODES):
            raise InvalidRequest("draft_mode",
                                 f"unknown {{name}} {shown(self.draft_mode)}; choose one of: {', '.join(MODES)}")
        if not isinstance(self.draft_p_min, (int, float)) or not 0 <= self.draft_p_min < 1:
            raise InvalidRequest("draft_p_min", f"{{name}} must be in [0, 1), got {shown(self.draft_p_min)}")
        if self.verify is not None and (not isinstance(self.verify, str) or self.verify not in VERIFY_RULES):
            raise InvalidRequest("verify",
                                 f"unknown {{name}} {shown(self.verify)}; choose one of: {', '.join(VERIFY_RULES)}")
        if self.grammar is not None and (not isinstance(self.grammar, str) or not self.grammar.strip()):
            raise InvalidRequest("grammar", f"{{name}} must be grammar text (GBNF or Lark), got {shown(self.grammar)}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidRequest("max_tokens", f"{{name}} must be >= 1, got {shown(self.max_tokens)}")

    @property
    def verify_rule(self) -> str:
        """The rule this request verifies with: the one it names, else the drafter-invariant one where it sets a
        seed (the same seed, the same text, whatever the draft, K, batch or memory: what a llama-server user expects
        of a seed), else the fastest exact one."""
        return self.verify or (GUMBEL if self.seed is not None else DEFAULT_VERIFY)

    @property
    def adaptive(self) -> bool:
        return self.draft_max == AUTO


def draft_max_from_text(text: str) -> int | str:
    """K as typed (a flag, a `/set`): "auto", a whole number, or the text itself for the request to refuse."""
    if text.lower() == AUTO:
        return AUTO
    return int(text) if text.lstrip("-").isdigit() else text
