"""The FasterTransformer word-list layout, shared by preprocessing (writes) and the engine (reads).

A word list is one ``[2, L]`` int32 array per prompt: row 0 holds the token ids of all words one
after another, row 1 the end offset of each word in row 0; ids are padded with 0 and offsets with
-1 up to the longest list in the request.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


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
