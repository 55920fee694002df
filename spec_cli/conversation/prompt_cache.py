"""The exact tokens of the last conversation the caches hold, so that the next prompt can extend them.

A chat's next turn, or an API client resending the whole history, renders text that begins with the last
prompt and its answer. Tokenizing that text again can split the answer differently from the tokens the model
generated, and the caches would then be reused only up to the first difference; extending the exact tokens
keeps all of them. Text that does not extend the last (a template that rewrites earlier turns, another
conversation) is tokenized whole, and the caches keep their longest common prefix with it.
"""

from __future__ import annotations

from typing import Sequence

from spec_cli.llama.model import Model
from spec_cli.llama.prompt_text import IMAGE_MARKER, PromptText


class PromptCache:
    """The text of the last prompt and answer, and the tokens the models saw for it."""

    def __init__(self) -> None:
        self.text = ""
        self.tokens: list[int] = []

    def tokens_for(self, model: Model, prompt: PromptText, images: Sequence[Sequence[int]] = ()) -> list[int]:
        """`prompt` as tokens: the remembered tokens and the new part tokenized on its own where `prompt` extends
        the remembered text, else all of `prompt` tokenized. `images`: the ids of every image of `prompt`, in
        order (the remembered text's first)."""
        if self.text and prompt.text.startswith(self.text):
            seen = self.text.count(IMAGE_MARKER)
            return self.tokens + model.tokenize_prompt(prompt.after(len(self.text)), add_special=False,
                                                       images=images[seen:])
        return model.tokenize_prompt(prompt, images=images)

    def remember(self, text: str, tokens: Sequence[int]) -> None:
        self.text, self.tokens = text, list(tokens)

    def forget(self) -> None:
        self.remember("", [])
