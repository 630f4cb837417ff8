"""Stop and bad words: the CSV string a client sends, and FasterTransformer's token layout.

A client sends each prompt's words as one CSV string (``INPUT_2`` bad words, ``INPUT_3`` stop
words). Preprocessing tokenizes them into a word list: one ``[2, L]`` int32 array per prompt,
row 0 holding the token ids of all words one after another and row 1 the end offset of each word
in row 0; ids are padded with 0 and offsets with -1 up to the longest list in the request.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence

import numpy as np

from contract.options import InvalidRequestError


def encode_words(words: Sequence[str]) -> str:
    """Stop/bad words as the one CSV string the contract carries ("" for none)."""
    if not words:
        return ""
    buffer = io.StringIO()
    csv.writer(buffer, quoting=csv.QUOTE_MINIMAL).writerow(words)  # quotes "," "\"" and newlines
    return buffer.getvalue().removesuffix("\r\n")


def decode_words(text: str) -> list[str]:
    """Inverse of :func:`encode_words`; quoted fields may hold commas, quotes and newlines.

    Text without quotes is split on commas alone, so a client that sends a raw newline word
    (``"\n\n"``) unquoted gets it as one word.
    """
    if not text:
        return []
    if '"' not in text:
        return [word for word in text.split(",") if word]
    rows = list(csv.reader(io.StringIO(text, newline="")))
    if len(rows) != 1:
        raise InvalidRequestError(f"word list {text!r} is not one CSV row")
    return [word for word in rows[0] if word]


def without_stop_word(text: str, words: Sequence[str]) -> str:
    """A stream's last piece less the stop word that ended it, for a client that wants the text
    before it (OpenAI's ``stop``). A stream that a stop word ends ends with the whole of it, and
    no piece before holds any of it (postprocessing/stop_text.py): of the words the text ends
    with, the longest is the one it stopped at."""
    ending = [word for word in words if word and text.endswith(word)]
    return text[: len(text) - max(map(len, ending))] if ending else text


def word_list(words_per_row: Sequence[Sequence[Sequence[int]]]) -> np.ndarray:
    """FasterTransformer layout [N, 2, L] for N rows of tokenized words."""
    flat = [[t for word in words for t in word] for words in words_per_row]
    offsets = [np.cumsum([len(word) for word in words]).tolist() for words in words_per_row]
    width = max([1, *(len(f) for f in flat), *(len(o) for o in offsets)])
    out = np.zeros((len(flat), 2, width), dtype=np.int32)
    out[:, 1, :] = -1
    for i, (ids, ends) in enumerate(zip(flat, offsets, strict=True)):
        out[i, 0, : len(ids)] = ids
        out[i, 1, : len(ends)] = ends
    return out


def split_word_list(layout: np.ndarray) -> list[list[int]]:
    """Inverse of :func:`word_list` for one row ([2, L]): the words' token ids."""
    ids, ends = layout[0].tolist(), [e for e in layout[1].tolist() if e >= 0]
    words, begin = [], 0
    for end in ends:
        if end > begin:
            words.append(ids[begin:end])
        begin = end
    return words
