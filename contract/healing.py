"""Token healing: which prompt token is held back, and which tokens may replace it.

A prompt that ends inside what the tokenizer would spell as one longer token (a bare newline
where SmolLM2 has newline + indentation tokens, ``re`` before ``return``, a trailing space)
leaves the model on a token it rarely saw there. Healing holds that last token back and makes
the first generated token start with its text, so the model picks the spelling itself.

Both the tokenizer stage (which holds the token back) and the engine (which constrains the
first token) use this one rule, on the same per-token texts (preprocessing/token_texts.py), so
they cannot disagree. Pure Python: ``contract`` imports nothing of the project.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from functools import lru_cache

# What transformers' heal_tokens adds to the held-back token's own logit on top of the other
# candidates (its +11 against +10), so that healing does not rewrite a complete token such as
# ``http`` into ``https`` when the model barely prefers it.
ORIGINAL_BIAS = 1.0
REPLACEMENT = "\ufffd"  # a token that ends inside a UTF-8 character decodes to this


class TokenExtensions:
    """A prefix index over a vocabulary's token texts: the tokens whose text starts with a
    given token's text. Special tokens, empty texts and tokens that hold only part of a
    character never count, neither as held back nor as a replacement."""

    def __init__(self, texts: Sequence[str], special: Iterable[int] = ()) -> None:
        skip = set(special)
        self.texts = list(texts)
        usable = [
            (text, i)
            for i, text in enumerate(self.texts)
            if i not in skip and text and REPLACEMENT not in text
        ]
        usable.sort()
        self._sorted = [text for text, _ in usable]
        self._ids = [i for _, i in usable]
        self._usable = {i for _, i in usable}
        self.allowed = lru_cache(maxsize=4096)(self._allowed)

    def _allowed(self, token: int) -> tuple[int, ...]:
        """The ids whose text starts with ``token``'s text, ``token`` first; () for a token
        that never heals (special, partial, or out of range)."""
        if token not in self._usable:
            return ()
        text = self.texts[token]
        start = bisect.bisect_left(self._sorted, text)
        found = []
        for index in range(start, len(self._sorted)):
            if not self._sorted[index].startswith(text):
                break
            if self._ids[index] != token:
                found.append(self._ids[index])
        return (token, *found)

    def heals(self, token: int) -> bool:
        """Whether ``token``'s text is a proper prefix of another token's text (held back)."""
        return len(self.allowed(token)) > 1
