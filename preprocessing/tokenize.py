"""Prompt and word-list tokenization into the model stage's tensors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from transformers import PreTrainedTokenizerFast

from contract.options import InvalidRequestError
from contract.words import decode_words, word_list


def _text(value: object, what: str, row: int) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidRequestError(f"{what} of row {row} is not valid UTF-8: {exc}") from None
    return str(value)


class Preprocessor:
    """Turns the ensemble's text inputs into the model stage's token tensors."""

    def __init__(self, tokenizer_path: str | Path) -> None:
        self.tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_path))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def prompts(self, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """QUERY [N, 1] bytes -> INPUT_ID [N, T] uint32 (0-padded), REQUEST_INPUT_LEN [N, 1]."""
        rows = [
            self.encode(_text(q, "INPUT_0", i))
            for i, q in enumerate(query.reshape(len(query), -1)[:, 0])
        ]
        for i, ids in enumerate(rows):
            if not ids:
                raise InvalidRequestError(
                    f"INPUT_0 row {i} is an empty prompt: send text to complete"
                )
        ids = np.zeros((len(rows), max(len(r) for r in rows)), dtype=np.uint32)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
        return ids, np.array([[len(r)] for r in rows], dtype=np.uint32)

    def words(self, csv_rows: np.ndarray, what: str) -> np.ndarray:
        """BAD_WORDS_DICT / STOP_WORDS_DICT [N, 1] CSV strings -> [N, 2, L] word lists."""
        flat = csv_rows.reshape(len(csv_rows), -1)[:, 0]
        tokenized = []
        for i, value in enumerate(flat):
            words = decode_words(_text(value, what, i))
            tokenized.append([self.encode(word) for word in words])
        return word_list(tokenized)
