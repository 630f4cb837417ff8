"""Per-row token selection for a batch in which every row has its own sampling settings.

Semantics follow FasterTransformer's, which existing clients of the ensemble expect:
``top_k == 0 and top_p == 0`` (or ``top_k == 1``, or ``temperature == 0``) is greedy search;
``top_k > 0`` samples among the k most likely tokens; ``top_p > 0`` samples from the smallest set
whose probability reaches p; both together apply top-k first. The repetition penalty is the
CTRL/transformers one (divide positive logits, multiply negative ones, for every token already in
the sequence). Log-probabilities are those of the distribution the token was drawn from after the
penalties and temperature, before top-k/top-p truncation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from contract.options import SamplingParams


@dataclass
class RowState:
    """What the sampler needs to know about one running sequence."""

    params: SamplingParams
    tokens: list[int]  # prompt + generated so far
    generated_from: int  # index in ``tokens`` where generation started
    bad_words: Sequence[Sequence[int]]
    generator: torch.Generator | None


def make_generator(seed: int | None) -> torch.Generator:
    """A private generator per request, so its draws do not depend on its batch neighbours."""
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed % 2**63 if seed >= 2**63 else seed)
    return generator


def apply_repetition_penalty(logits: torch.Tensor, rows: Sequence[RowState]) -> None:
    for i, row in enumerate(rows):
        penalty = row.params.repetition_penalty
        if penalty == 1.0:
            continue
        ids = torch.tensor(sorted(set(row.tokens)), dtype=torch.long)
        scores = logits[i, ids]
        logits[i, ids] = torch.where(scores < 0, scores * penalty, scores / penalty)


def apply_bad_words(logits: torch.Tensor, rows: Sequence[RowState]) -> None:
    """Forbid the last token of every bad word whose other tokens were just generated."""
    for i, row in enumerate(rows):
        generated = row.tokens[row.generated_from :]
        for word in row.bad_words:
            prefix = list(word[:-1])
            if not prefix or (
                len(generated) >= len(prefix) and generated[-len(prefix) :] == prefix
            ):
                logits[i, word[-1]] = float("-inf")


def truncate(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Keep the top-k tokens, then the top-p nucleus, of one row; others become -inf."""
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if 0.0 < top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        drop = cumulative - torch.softmax(sorted_logits, dim=-1) >= top_p  # keeps at least one
        logits = logits.clone()
        logits[order[drop]] = float("-inf")
    return logits


def select_tokens(logits: torch.Tensor, rows: Sequence[RowState]) -> tuple[list[int], list[float]]:
    """Choose the next token of every row of ``logits`` [B, V] (float32, modified in place)."""
    apply_repetition_penalty(logits, rows)
    apply_bad_words(logits, rows)
    temperatures = torch.tensor(
        [row.params.temperature if row.params.temperature > 0 else 1.0 for row in rows]
    )
    logits /= temperatures[:, None]
    log_probs = torch.log_softmax(logits, dim=-1)
    chosen = logits.argmax(dim=-1)
    for i, row in enumerate(rows):
        if row.params.greedy:
            continue
        kept = truncate(logits[i], row.params.top_k, row.params.top_p)
        probs = torch.softmax(kept, dim=-1)
        chosen[i] = torch.multinomial(probs, 1, generator=row.generator)[0]
    picked = log_probs.gather(1, chosen[:, None])[:, 0]
    return chosen.tolist(), picked.tolist()
