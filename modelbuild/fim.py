"""The fill-in-the-middle transformation of training windows (Bavarian et al. 2022, as bigcode
trains SantaCoder and StarCoder).

Each training window is cut at its end-of-text tokens into documents (or pieces of one); each
piece of at least ``MIN_TOKENS`` becomes, with probability ``rate``, a FIM example: its text is
split at two uniformly random characters into prefix P, middle M and suffix S, each tokenized
on its own, and laid out as PSM ``<fim_prefix>P<fim_suffix>S<fim_middle>M<|endoftext|>`` or,
with probability ``spm_rate``, SPM ``<fim_prefix><fim_suffix>S<fim_middle>PM<|endoftext|>``.
The end token after the middle teaches the model to stop once the gap is filled. A piece keeps
its length in tokens, so a window stays a window: the suffix loses its last tokens when the
sentinels do not fit (a piece whose suffix is too short stays as it was), and a shorter result
is padded with end tokens that carry no loss.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from contract.fim import STARCODER_TOKENS

IGNORE = -100  # transformers' label for "no loss here"
MIN_TOKENS = 16


@dataclass
class FimTransform:
    tokenizer: object  # a PreTrainedTokenizerFast with the StarCoder sentinels
    rate: float
    spm_rate: float
    rng: random.Random

    def __post_init__(self) -> None:
        ids = self.tokenizer.convert_tokens_to_ids(list(STARCODER_TOKENS))
        self.prefix_id, self.suffix_id, self.middle_id = ids
        self.eos = self.tokenizer.eos_token_id

    def window(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, labels) of one window: unchanged with probability 1 - rate per piece."""
        tokens, labels = [], []
        piece: list[int] = []
        for token in [*ids.tolist(), None]:
            if token is None or token == self.eos:
                new, new_labels = self.piece(piece)
                tokens += new
                labels += new_labels
                if token is not None:
                    tokens.append(token)
                    labels.append(token)
                piece = []
            else:
                piece.append(token)
        return np.array(tokens, dtype=np.int64), np.array(labels, dtype=np.int64)

    def piece(self, piece: list[int], middle_only: bool = False) -> tuple[list[int], list[int]]:
        if len(piece) < MIN_TOKENS or self.rng.random() >= self.rate:
            return piece, list(piece) if not middle_only else [IGNORE] * len(piece)
        text = self.tokenizer.decode(piece, clean_up_tokenization_spaces=False)
        lo, hi = sorted(self.rng.randint(0, len(text)) for _ in range(2))
        spm = self.rng.random() < self.spm_rate
        prefix, middle, suffix = self.tokenizer(
            [text[:lo], text[lo:hi], text[hi:]], add_special_tokens=False
        )["input_ids"]
        excess = len(prefix) + len(middle) + len(suffix) + 4 - len(piece)
        if excess > 0:
            if len(suffix) < excess:
                return piece, list(piece) if not middle_only else [IGNORE] * len(piece)
            suffix = suffix[: len(suffix) - excess]
        if spm:
            context = [self.prefix_id, self.suffix_id, *suffix, self.middle_id, *prefix]
        else:
            context = [self.prefix_id, *prefix, self.suffix_id, *suffix, self.middle_id]
        target = [*middle, self.eos]
        pad = len(piece) - len(context) - len(target)
        tokens = context + target + [self.eos] * pad
        if middle_only:  # the loss of the middle given its context: what infilling needs
            labels = [IGNORE] * len(context) + target + [IGNORE] * pad
        else:
            labels = context + target + [IGNORE] * pad
        return tokens, labels


def middle_windows(
    tokenizer, data: np.ndarray, block_size: int, count: int, seed: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Held-out windows as PSM examples whose labels are only the middle and its end token:
    their mean loss says how well a model fills a gap (fixed for a seed, whatever the build)."""
    transform = FimTransform(tokenizer, rate=1.0, spm_rate=0.0, rng=random.Random(seed))
    windows = []
    for i in range(min(count, max(1, (len(data) - 1) // block_size))):
        window = data[i * block_size : (i + 1) * block_size].tolist()
        window = [t for t in window if t != transform.eos]  # one piece per window
        tokens, labels = transform.piece(window, middle_only=True)
        if any(label != IGNORE for label in labels):
            windows.append((np.array(tokens), np.array(labels)))
    return windows
