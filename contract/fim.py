"""Fill-in-the-middle: the prompt layouts a checkpoint may have been trained on, in token ids.

Defined once here because three places must agree on them: ``make model`` trains the default
model on the StarCoder layout, preprocessing builds a request's prompt in the checkpoint's own
layout, and postprocessing turns a finished sequence back into the text the client sees (the
prefix and the generated middle, never a sentinel). Pure lists of ints: no tokenizer here. Each
family's tokens are in :mod:`contract.model_tokens`: StarCoder, CodeLlama, Qwen2.5-Coder and
DeepSeek-Coder put a prefix, a suffix and a middle sentinel around the two texts, in PSM order
(``<pre>P<suf>S<mid>``); CodeGen2 has a layout of its own.

SPM (StarCoder and CodeLlama train on it too: ``<pre><suf>S<mid>P``, bigcode's variant of
Bavarian et al. 2022) puts the prefix last, so an editor's next request (a few more characters
before the cursor, the same text after it) starts with everything the last one did but the
prefix's end: a prefix cache reuses all of it, where in PSM every keystroke changes what
precedes the suffix. The prompt then ends at the cursor, which needs a tokenizer that ends it on
a token the model knows (the default model's does: modelbuild/tokenizer.py). ``fim_order`` in
the preprocessing and ensemble_stream configs picks the order; its default, "auto", takes the
one ``make model`` built the checkpoint for (SPM for the default model) and PSM for any other
(docs/fim.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from contract.model_tokens import (
    CODEGEN2_END_OF_MASK,
    CODEGEN2_END_OF_TEXT,
    CODEGEN2_MASK,
    CODEGEN2_PROMPT,
    CODEGEN2_SEP,
    CODEGEN2_TOKENS,
    CODELLAMA_TOKENS,
    DEEPSEEK_TOKENS,
    LAYOUTS,
    QWEN_TOKENS,
    STARCODER_TOKENS,
    LayoutTokens,
)

__all__ = [
    "CODEGEN2_END_OF_MASK",
    "CODEGEN2_END_OF_TEXT",
    "CODEGEN2_MASK",
    "CODEGEN2_PROMPT",
    "CODEGEN2_SEP",
    "CODEGEN2_TOKENS",
    "CODELLAMA_TOKENS",
    "DEEPSEEK_TOKENS",
    "NO_FIM",
    "NO_FIM_START",
    "QWEN_TOKENS",
    "STARCODER_TOKENS",
    "FimLayout",
    "find_layout",
    "tokenizer_layout",
]

# The refusal's start does not change when layouts are added: the API recognises it by that.
NO_FIM_START = "`suffix` asks for fill-in-the-middle, but this model's tokenizer has no"
NO_FIM = (
    f"{NO_FIM_START} fill-in-the-middle tokens ("
    + ", ".join(
        f"{'or ' if style == 'codegen2' else ''}{tokens.label} "
        + "/".join(name for name in tokens.required if name not in tokens.shown)
        for style, tokens in LAYOUTS.items()
    )
    + "); send the prompt without `suffix`, or serve a model trained for it"
)


@dataclass(frozen=True)
class FimLayout:
    """One checkpoint's FIM layout: its sentinel token ids and how a prompt is laid out."""

    style: str  # a key of contract.model_tokens.LAYOUTS: "starcoder", "codellama", ...
    ids: dict[str, int]  # sentinel name (as LAYOUTS spells it) -> token id
    order: str = "psm"  # "psm", or "spm" where the family trained on it (see above)

    def __post_init__(self) -> None:
        if self.style not in LAYOUTS:
            raise ValueError(f"no FIM layout {self.style!r} (there are {', '.join(LAYOUTS)})")
        if self.order not in self.tokens.orders:
            spm = [t.label for t in LAYOUTS.values() if "spm" in t.orders]
            raise ValueError(
                f"fim_order {self.order!r}: the {self.style} layout has no such prompt order "
                f"(psm, or spm for {' and '.join(spm)} tokens)"
            )

    @property
    def tokens(self) -> LayoutTokens:
        return LAYOUTS[self.style]

    @property
    def sentinels(self) -> frozenset[int]:
        """Ids the client never sees in a completion (an end token is the tokenizer's to
        skip)."""
        return frozenset(i for name, i in self.ids.items() if name not in self.tokens.shown)

    @property
    def stop(self) -> list[int] | None:
        """The word that ends a middle besides the model's end token (CodeGen2's ``<eom>``,
        CodeLlama's ``<EOT>``, Qwen2.5-Coder's ``<|endoftext|>``), or None."""
        stop = self.tokens.stop
        return [self.ids[stop]] if stop is not None and stop in self.ids else None

    @property
    def bare_suffix(self) -> bool:
        """Whether the suffix is encoded without SentencePiece's leading space (CodeLlama)."""
        return self.tokens.bare_suffix

    def _triple(self) -> tuple[int, int, int]:
        pre, suf, mid = (self.ids[name] for name in self.tokens.required[:3])
        return pre, suf, mid

    def prompt(self, prefix: Sequence[int], suffix: Sequence[int]) -> list[int]:
        """The prompt asking for the middle between ``prefix`` and ``suffix`` (token ids; the
        tokens a tokenizer puts before any prompt, a BOS, go before it: preprocessing's)."""
        if self.style == "codegen2":
            mask, sep, eot = (self.ids[t] for t in CODEGEN2_PROMPT)
            return [*prefix, mask, *suffix, eot, sep, mask]
        pre, suf, mid = self._triple()
        if self.order == "spm":
            return [pre, suf, *suffix, mid, *prefix]
        return [pre, *prefix, suf, *suffix, mid]

    def visible(self, ids: Sequence[int]) -> list[int]:
        """What a client sees of a whole sequence: for a FIM sequence the prefix then the
        middle (the suffix is the client's own text, after its cursor), else the sequence; with
        every sentinel left out either way. ``ids`` start where :meth:`prompt`'s do (a BOS
        before them is the caller's to drop)."""
        ids = list(ids)
        if self.style == "codegen2":
            mask, sep, eot = (self.ids[t] for t in CODEGEN2_PROMPT)
            tail = _find(ids, [eot, sep, mask])
            if tail is not None and mask in ids[:tail]:
                ids = ids[: ids.index(mask)] + ids[tail + 3 :]
        else:
            pre, suf, mid = self._triple()
            if ids[:1] == [pre] and mid in ids:
                middle_at = ids.index(mid)
                if ids[1:2] == [suf]:  # SPM: the prefix follows the middle sentinel
                    ids = ids[middle_at + 1 :]
                elif suf in ids[:middle_at]:
                    ids = ids[1 : ids.index(suf)] + ids[middle_at + 1 :]
        hidden = self.sentinels
        return [i for i in ids if i not in hidden]


def _find(ids: list[int], pattern: list[int]) -> int | None:
    for start in range(len(ids) - len(pattern) + 1):
        if ids[start : start + len(pattern)] == pattern:
            return start
    return None


def find_layout(token_id: Callable[[str], int | None]) -> FimLayout | None:
    """The first layout (in LAYOUTS' order) whose required sentinels are all single tokens of
    a vocabulary (``token_id`` maps a token's text to its id, or None when the vocabulary lacks
    it; CodeLlama's may be spelled ``▁<PRE>``); None for a model without."""
    for style, tokens in LAYOUTS.items():
        ids: dict[str, int] = {}
        for name in (*tokens.required, *tokens.optional):
            found = (token_id(spelling) for spelling in tokens.spellings(name))
            if (value := next((i for i in found if i is not None), None)) is not None:
                ids[name] = int(value)
        if all(name in ids for name in tokens.required):
            return FimLayout(style, ids)
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
