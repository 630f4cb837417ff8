"""Token ids back to text, whole (unary) or piece by piece (streaming)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from transformers import PreTrainedTokenizerFast


class Postprocessor:
    def __init__(self, tokenizer_path: str | Path) -> None:
        self.tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_path))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(
            ids, skip_special_tokens=True, clean_up_tokenization_spaces=False
        )

    def batch(self, tokens: np.ndarray, lengths: np.ndarray | None) -> np.ndarray:
        """TOKENS_BATCH [N, beam, T] (+ SEQUENCE_LENGTH [N, beam]) -> texts, flat [N * beam].

        Flat, as the FasterTransformer ensemble returns it, so ``OUTPUT_0[0]`` is the first text.
        """
        tokens = tokens.reshape(tokens.shape[0], -1, tokens.shape[-1])
        if lengths is None:
            lengths = np.full(tokens.shape[:2], tokens.shape[-1])
        lengths = lengths.reshape(tokens.shape[:2])
        texts = [
            self.decode(tokens[i, beam, : lengths[i, beam]].tolist()).encode("utf-8")
            for i in range(tokens.shape[0])
            for beam in range(tokens.shape[1])
        ]
        return np.array(texts, dtype=np.object_)


class IncrementalDecoder:
    """Emits exactly the new text each token adds, never splitting a character.

    Byte-level BPE tokens can end inside a multi-byte UTF-8 character, and a token's text can
    depend on its neighbours; decoding the whole sequence each time and emitting only the new,
    complete suffix keeps the pieces' concatenation equal to the unary decode.
    """

    def __init__(self, postprocessor: Postprocessor, prompt_ids: list[int]) -> None:
        self.postprocessor = postprocessor
        self.ids = list(prompt_ids)
        self.emitted = len(postprocessor.decode(self.ids))

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self.postprocessor.decode(self.ids)
        if text.endswith("\ufffd"):  # an unfinished character: wait for its next byte
            return ""
        piece, self.emitted = text[self.emitted :], len(text)
        return piece

    def flush(self) -> str:
        """Whatever is left at the end (including a character that never completed)."""
        text = self.postprocessor.decode(self.ids)
        piece, self.emitted = text[self.emitted :], len(text)
        return piece
