"""Fill-in-the-middle: the prompt layouts a checkpoint may have been trained on, in token ids.

Defined once here because three places must agree on them: ``make model`` trains the default
model on the StarCoder layout, preprocessing builds a request's prompt in the checkpoint's own
layout, and postprocessing turns a finished sequence back into the text the client sees (the
prefix and the generated middle, never a sentinel). Pure lists of ints: no tokenizer here.

- StarCoder/SantaCoder (and the default model): ``<fim_prefix>P<fim_suffix>S<fim_middle>M``
  (PSM); training also uses SPM, ``<fim_prefix><fim_suffix>S<fim_middle>PM`` (the variant of
  Bavarian et al. 2022 that bigcode's models train on). SPM puts the prefix last, so an
  editor's next request (a few more characters before the cursor, the same text after it)
  starts with everything the last one did but the prefix's end: a prefix cache reuses all of
  it, where in PSM every keystroke changes what precedes the suffix. The prompt then ends at
  the cursor, which needs a tokenizer that ends it on a token the model knows (the default
  model's does: modelbuild/tokenizer.py). ``fim_order`` in the preprocessing and
  ensemble_stream configs picks the order; its default, "auto", takes the one ``make model``
  built the checkpoint for (SPM for the default model) and PSM for any other (docs/fim.md).
- CodeGen2: ``P<mask_1>S<|endoftext|><sep><mask_1>M<eom>`` (Salesforce's model card); the model
  ends a middle with ``<eom>``, so a request stops there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

STARCODER_TOKENS = ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")
CODEGEN2_MASK, CODEGEN2_SEP, CODEGEN2_END_OF_MASK = "<mask_1>", "<sep>", "<eom>"
CODEGEN2_END_OF_TEXT = "<|endoftext|>"
CODEGEN2_PROMPT = (CODEGEN2_MASK, CODEGEN2_SEP, CODEGEN2_END_OF_TEXT)
CODEGEN2_TOKENS = (CODEGEN2_MASK, CODEGEN2_SEP, CODEGEN2_END_OF_MASK, CODEGEN2_END_OF_TEXT)

NO_FIM = (
    "`suffix` asks for fill-in-the-middle, but this model's tokenizer has no fill-in-the-middle "
    "tokens (StarCoder-style <fim_prefix>/<fim_suffix>/<fim_middle> or CodeGen2-style "
    "<mask_1>/<sep>/<eom>); send the prompt without `suffix`, or serve a model trained for it"
)


@dataclass(frozen=True)
class FimLayout:
    """One checkpoint's FIM layout: its sentinel token ids and how a prompt is laid out."""

    style: str  # "starcoder" or "codegen2"
    ids: dict[str, int]  # sentinel text -> token id
    order: str = "psm"  # starcoder: "psm" or "spm" (see above); codegen2 has one layout

    def __post_init__(self) -> None:
        if self.order not in ("psm", "spm") or (self.order == "spm" and self.style != "starcoder"):
            raise ValueError(
                f"fim_order {self.order!r}: the {self.style} layout has no such prompt order "
                "(psm, or spm for StarCoder-style tokens)"
            )

    @property
    def sentinels(self) -> frozenset[int]:
        """Ids the client never sees in a completion."""
        return frozenset(self.ids.values()) - {self.ids.get(CODEGEN2_END_OF_TEXT, -1)}

    @property
    def stop(self) -> list[int] | None:
        """Tokens that end a middle besides the model's end token (CodeGen2's ``<eom>``)."""
        return [self.ids[CODEGEN2_END_OF_MASK]] if self.style == "codegen2" else None

    def prompt(self, prefix: Sequence[int], suffix: Sequence[int]) -> list[int]:
        """The prompt asking for the middle between ``prefix`` and ``suffix`` (token ids)."""
        if self.style == "starcoder":
            pre, suf, mid = (self.ids[t] for t in STARCODER_TOKENS)
            if self.order == "spm":
                return [pre, suf, *suffix, mid, *prefix]
            return [pre, *prefix, suf, *suffix, mid]
        mask, sep, eot = (self.ids[t] for t in CODEGEN2_PROMPT)
        return [*prefix, mask, *suffix, eot, sep, mask]

    def visible(self, ids: Sequence[int]) -> list[int]:
        """What a client sees of a whole sequence: for a FIM sequence the prefix then the
        middle (the suffix is the client's own text, after its cursor), else the sequence; with
        every sentinel left out either way."""
        ids = list(ids)
        if self.style == "starcoder":
            pre, suf, mid = (self.ids[t] for t in STARCODER_TOKENS)
            if ids[:1] == [pre] and mid in ids:
                middle_at = ids.index(mid)
                if ids[1:2] == [suf]:  # SPM: the prefix follows the middle sentinel
                    ids = ids[middle_at + 1 :]
                elif suf in ids[:middle_at]:
                    ids = ids[1 : ids.index(suf)] + ids[middle_at + 1 :]
        else:
            mask, sep, eot = (self.ids[t] for t in CODEGEN2_PROMPT)
            tail = _find(ids, [eot, sep, mask])
            if tail is not None and mask in ids[:tail]:
                ids = ids[: ids.index(mask)] + ids[tail + 3 :]
        hidden = self.sentinels
        return [i for i in ids if i not in hidden]


def _find(ids: list[int], pattern: list[int]) -> int | None:
    for start in range(len(ids) - len(pattern) + 1):
        if ids[start : start + len(pattern)] == pattern:
            return start
    return None


def find_layout(token_id: Callable[[str], int | None]) -> FimLayout | None:
    """The layout whose sentinels are all single tokens of a vocabulary (``token_id`` maps a
    token's text to its id, or None when the vocabulary lacks it); None for a model without."""
    for style, tokens in (("starcoder", STARCODER_TOKENS), ("codegen2", CODEGEN2_TOKENS)):
        ids = {t: token_id(t) for t in tokens}
        if all(i is not None for i in ids.values()):
            return FimLayout(style, {t: int(i) for t, i in ids.items() if i is not None})
    return None


def tokenizer_layout(tokenizer) -> FimLayout | None:
    """The layout of a transformers tokenizer (duck-typed: ``get_vocab`` and ``encode``): its
    sentinels must be in the vocabulary and encode as themselves, one token each."""
    vocabulary = tokenizer.get_vocab()

    def token_id(text: str) -> int | None:
        if text not in vocabulary:
            return None
        ids = tokenizer.encode(text, add_special_tokens=False)
        return ids[0] if ids == [vocabulary[text]] else None

    return find_layout(token_id)
