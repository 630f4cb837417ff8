"""Each token's text, for the engine's editor stop rules (engine/editor_stops.py), which read
newlines and indentation as tokens are generated, and for token healing (contract/healing.py).

A token is decoded after an anchor token and the anchor's text cut off, so it reads as it does
inside a sequence: SentencePiece-style tokenizers drop a token's leading space when it is
decoded alone, and that space is indentation.
"""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedTokenizerFast

from contract.healing import TokenExtensions

ANCHOR_TEXT = "a"


def token_texts(checkpoint: Path) -> list[str]:
    """The text of every token id of the checkpoint's tokenizer, by id."""
    return tokenizer_texts(PreTrainedTokenizerFast.from_pretrained(str(checkpoint)))


def token_extensions(checkpoint: Path) -> TokenExtensions:
    """The checkpoint's prefix index for token healing (contract/healing.py)."""
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(checkpoint))
    return TokenExtensions(tokenizer_texts(tokenizer), tokenizer.all_special_ids)


def tokenizer_texts(tokenizer: PreTrainedTokenizerFast) -> list[str]:
    """The text of every token id of ``tokenizer``, by id."""
    anchor = tokenizer.encode(ANCHOR_TEXT, add_special_tokens=False)[-1]
    before = tokenizer.decode([anchor])
    ids = range(len(tokenizer))
    pairs = tokenizer.batch_decode([[anchor, token] for token in ids])
    alone = tokenizer.batch_decode([[token] for token in ids])
    return [
        both[len(before) :] if both.startswith(before) else text
        for both, text in zip(pairs, alone, strict=True)
    ]
