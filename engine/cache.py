"""The batched key/value cache and the plan of one forward pass, shared by the engine's models
(engine/gptj.py, engine/llama.py).

The cache holds every running sequence in a *row*, each at its own length, so a decode step for
all rows is one forward pass, and rows join (prefill) or leave (finish) between steps without
touching the others. A pass may hold several segments (the decode rows and the prompts joining
them); :func:`plan_segment` works out, once per segment, what every layer's attention needs:
positions, the mask, rotary tables, and which much longer rows a decode step attends alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch


class CacheShape(Protocol):
    """What the cache needs of a model's config."""

    @property
    def n_layer(self) -> int: ...

    @property
    def n_kv_head(self) -> int: ...

    @property
    def head_dim(self) -> int: ...


@dataclass
class KVCache:
    """Keys and values of every running sequence: [n_layer, rows, n_kv_head, capacity,
    head_dim].

    Grows on demand (rows and length) so memory follows what is actually running.
    """

    keys: torch.Tensor
    values: torch.Tensor

    @classmethod
    def empty(
        cls, config: CacheShape, dtype: torch.dtype, device: torch.device | str = "cpu"
    ) -> KVCache:
        """No rows yet; ``config`` is any model's (n_layer, n_kv_head, head_dim)."""
        shape = (config.n_layer, 0, config.n_kv_head, 0, config.head_dim)
        return cls(
            torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros(shape, dtype=dtype, device=device),
        )

    @property
    def rows(self) -> int:
        return self.keys.shape[1]

    @property
    def capacity(self) -> int:
        return self.keys.shape[3]

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes

    @staticmethod
    def capacity_for(length: int) -> int:
        """Positions allocated for ``length``: powers of two, so reallocations are few."""
        return 1 << max(6, math.ceil(math.log2(max(length, 1))))

    def reserve(self, rows: int, length: int) -> None:
        """Room for the first ``rows`` sequences (the running ones) at ``length`` positions
        (their longest reach). A reallocation sizes the cache to exactly that, keeping those
        rows, so it never holds more than the engine's admission allowed."""
        if rows <= self.rows and length <= self.capacity:
            return
        new_len = self.capacity_for(length)
        for name in ("keys", "values"):
            old = getattr(self, name)
            grown = old.new_zeros((old.shape[0], rows, old.shape[2], new_len, old.shape[4]))
            keep_rows, keep_len = min(rows, old.shape[1]), min(new_len, old.shape[3])
            grown[:, :keep_rows, :, :keep_len] = old[:, :keep_rows, :, :keep_len]
            setattr(self, name, grown)

    def reorder(self, dst: list[int], src: list[int], length: int) -> None:
        """Row ``dst[i]`` takes row ``src[i]``'s first ``length`` positions (beams continuing
        another beam); every source is read before any row is written."""
        moved = [(d, s) for d, s in zip(dst, src, strict=True) if d != s]
        if not moved:
            return
        to = torch.tensor([d for d, _ in moved], device=self.keys.device)
        source = torch.tensor([s for _, s in moved], device=self.keys.device)
        for tensor in (self.keys, self.values):
            tensor[:, to, :, :length] = tensor[:, source, :, :length]

    def move_row(self, src: int, dst: int, length: int) -> None:
        """Copy row ``src`` into row ``dst`` (used to keep running rows contiguous)."""
        self.keys[:, dst, :, :length] = self.keys[:, src, :, :length]
        self.values[:, dst, :, :length] = self.values[:, src, :, :length]


@dataclass
class Segment:
    """Rows of one forward pass that take the same number of tokens each: the decode rows (one
    token) or the prompts being prefilled (right-padded). ``rows`` are their cache rows."""

    tokens: torch.Tensor  # [B, T]
    start: torch.Tensor  # [B] position of each row's first token
    last: torch.Tensor | None  # [B] the step whose logits are wanted; None: every step
    rows: slice


@dataclass
class StepPlan:
    """Index tensors one segment of a forward pass shares across its layers.

    ``key_len`` is how many cache positions the batched attention reads. In a decode step the
    rows longer than that (``long_rows``: row, length) are attended separately on their own row
    of the cache, so one long request does not make every short one read its length.
    """

    row_index: torch.Tensor  # [B, 1]
    positions: torch.Tensor  # [B, T]
    key_len: int
    mask: torch.Tensor | None  # [B, 1, T, key_len] allowed keys; None: plain causal prefill
    long_rows: list[tuple[int, int]]
    rows: slice  # the segment's cache rows
    cos: torch.Tensor  # [B, T, 1, 1, rot] rotary tables at ``positions``
    sin: torch.Tensor

    @property
    def tokens(self) -> int:
        return self.positions.numel()


def plan_segment(
    cos_table: torch.Tensor,
    sin_table: torch.Tensor,
    start: torch.Tensor,
    steps: int,
    rows: slice,
) -> StepPlan:
    """A segment's plan (see ``GPTJ.plan``), with rotary tables [positions, dim] taken at
    its positions as [B, T, 1, 1, dim]."""
    device = start.device
    batch = start.shape[0]
    positions = start[:, None] + torch.arange(steps, device=device)
    row_index = torch.arange(batch, device=device)[:, None]
    cos = cos_table[positions][:, :, None, None, :]  # [B, T, q|k, head, rot]
    sin = sin_table[positions][:, :, None, None, :]
    if steps > 1 and not bool(start.any()):  # prefill from position 0: plain causal
        return StepPlan(row_index, positions, steps, None, [], rows, cos, sin)
    lengths = (positions[:, -1] + 1).tolist()
    key_len, long_rows = max(lengths), []
    if steps == 1 and batch > 1:
        key_len, long_rows = split_long_rows(lengths)
    allowed = torch.arange(key_len, device=device)[None, None, :] <= positions[:, :, None]
    return StepPlan(row_index, positions, key_len, allowed[:, None], long_rows, rows, cos, sin)


def wanted_tokens(segments: list[Segment], plans: list[StepPlan]) -> torch.Tensor:
    """Indices, in a pass's flattened tokens, of the steps whose logits are wanted: each row's
    ``last``, or every step of a segment whose ``last`` is None."""
    picked, offset = [], 0
    for seg, plan in zip(segments, plans, strict=True):
        if seg.last is None:
            picked.append(torch.arange(offset, offset + plan.tokens, device=plan.positions.device))
        else:
            steps = seg.tokens.shape[1]
            picked.append(offset + plan.row_index[:, 0] * steps + seg.last)
        offset += plan.tokens
    return picked[0] if len(picked) == 1 else torch.cat(picked)


LONG_ROW_COST = 64  # a separate attention call costs about this many extra key positions
MAX_LONG_ROWS = 8


def split_long_rows(lengths: list[int]) -> tuple[int, list[tuple[int, int]]]:
    """The batched key length and the rows attended alone, for the least keys read.

    Reading ``key_len`` positions for every row costs ``rows * key_len``; each row taken out
    costs its own length plus a call. Take out the longest rows while that lowers the total.
    """
    order = sorted(range(len(lengths)), key=lengths.__getitem__, reverse=True)
    best, best_cost, alone = 0, len(lengths) * lengths[order[0]], 0
    for n in range(1, min(MAX_LONG_ROWS, len(lengths) - 1) + 1):
        alone += lengths[order[n - 1]] + LONG_ROW_COST
        cost = len(lengths) * lengths[order[n]] + alone
        if cost < best_cost:
            best, best_cost = n, cost
    return lengths[order[best]], [(row, lengths[row]) for row in order[:best]]
