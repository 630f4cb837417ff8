"""Token selection for a whole batch at once, every row with its own sampling settings.

Semantics follow FasterTransformer's, which existing clients of the ensemble expect:
``top_k == 0 and top_p == 0`` (or ``top_k == 1``, or ``temperature == 0``) is greedy search;
``top_k > 0`` samples among the k most likely tokens; ``top_p > 0`` samples from the smallest set
whose probability reaches p; both together apply top-k first (p is then a share of the top-k
mass). The repetition penalty is the CTRL/transformers one (divide positive logits, multiply
negative ones, for every token already in the sequence, prompt included). Log-probabilities are
those of the distribution the token was drawn from after the penalties and temperature, before
top-k/top-p truncation.

Every per-row setting is a tensor row, so a step is a fixed handful of batched tensor operations
whatever the mix of settings. Randomness is counter-based: a row's uniform at its n-th generated
token is a hash of (seed, n), so the same request and seed give the same text whatever else is in
the batch, and no per-row generator is stepped. A row whose settings leave no token to draw (every
token banned) gets a NaN log-prob and no other row notices.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from contract.healing import ORIGINAL_BIAS
from contract.options import SamplingParams

MASK32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B9  # odd step between consecutive counters of a row
NUCLEUS_GUESS = 256  # candidates tried first for a nucleus without top-k; 16x more if short
MIN_TEMPERATURE = 1e-5  # below this logits / T overflows; such rows are greedy in effect anyway


def mix32(x):
    """A 32-bit integer hash (xorshift-multiply rounds) for Python ints and int64 tensors alike.

    Multipliers are below 2**31, so every product of a 32-bit value stays inside int64.
    """
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & MASK32
    x = x ^ (x >> 15)
    x = (x * 0x1B873593) & MASK32
    return x ^ (x >> 16)


def seed_key(seed: int) -> int:
    """The 32-bit key of a 64-bit seed; a row's stream of uniforms depends only on it."""
    return mix32(mix32((seed & MASK32) ^ GOLDEN) ^ (seed >> 32))


def uniforms(keys: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """One float32 in [0, 1) per row for its ``steps``-th token: a hash of (key, step)."""
    bits = mix32(mix32((keys + steps * GOLDEN) & MASK32) ^ keys)
    return (bits >> 8).float() * (1.0 / (1 << 24))


_PER_ROW = {  # name: dtype of the [capacity] tensors
    "temperature": torch.float32,
    "top_k": torch.long,
    "top_p": torch.float32,
    "penalty": torch.float32,
    "keys": torch.long,  # seed_key of the row's seed
    "steps": torch.long,  # tokens the row has taken so far
}
_MASKS = ("presence", "banned")  # [capacity, V] bool, created when a row first needs one
_LISTS = ("params", "tokens", "generated_from", "multi_bad", "bans", "heals")


@dataclass(frozen=True)
class _Plan:
    """What a step over a given row range needs to know, recomputed only when rows change."""

    sampled: torch.Tensor | None  # offsets of non-greedy rows, None when all are
    count: int  # number of non-greedy rows
    candidates: int  # how many top tokens to consider (the largest top_k; vocab when unbounded)
    may_grow: bool  # some row's nucleus (without top-k) may reach past the candidates
    multi_bad: list[tuple[int, tuple[tuple[int, ...], int]]]  # (offset, (prefix, last token))


class Sampler:
    """Sampling settings and history of the running rows, as tensors aligned with cache rows.

    Rows are appended with :meth:`add` and removed with :meth:`remove` (which moves the last row
    into the hole, as the engine does with the KV cache).
    """

    def __init__(self, vocab_size: int, device: torch.device | str = "cpu", rows: int = 8):
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self.rows = 0
        self.params: list[SamplingParams] = []
        self.tokens: list[list[int]] = []  # each row's tokens, shared with (extended by) the engine
        self.generated_from: list[int] = []
        self.multi_bad: list[list[tuple[tuple[int, ...], int]]] = []  # (prefix, last token)
        self.bans: list[bool] = []  # the row has single-token bad words
        # token healing: the ids the row's first token may be (the held-back one first)
        self.heals: list[torch.Tensor | None] = []
        self._healing = 0  # rows whose first token is still to be healed
        self._penalized = 0  # rows with a repetition penalty
        self._banning = 0  # rows with single-token bad words
        self._plans: dict[tuple[int, int], _Plan] = {}
        for name, dtype in _PER_ROW.items():
            setattr(self, name, torch.zeros(rows, dtype=dtype, device=self.device))
        self.presence: torch.Tensor | None = None  # tokens seen; valid for penalized rows only
        self.banned: torch.Tensor | None = None  # single-token bad words

    @property
    def capacity(self) -> int:
        return self.temperature.shape[0]

    def _grow(self) -> None:
        for name in (*_PER_ROW, *_MASKS):
            old = getattr(self, name)
            if old is not None:
                new = old.new_zeros((2 * old.shape[0], *old.shape[1:]))
                new[: old.shape[0]] = old
                setattr(self, name, new)

    def _mask(self, name: str) -> torch.Tensor:
        mask = getattr(self, name)
        if mask is None:
            shape = (self.capacity, self.vocab_size)
            mask = torch.zeros(shape, dtype=torch.bool, device=self.device)
            setattr(self, name, mask)
        return mask

    # -- rows ----------------------------------------------------------------------------------

    def add(
        self,
        params: SamplingParams,
        tokens: list[int],
        bad_words: Sequence[Sequence[int]] = (),
        heal: Sequence[int] = (),
    ) -> None:
        """Append a row; ``tokens`` is its prompt, a list the caller extends as tokens come.
        ``heal`` (token healing): the ids its first token may be, the held-back token first."""
        row = self.rows
        if row == self.capacity:
            self._grow()
        seed = params.seed if params.seed is not None else secrets.randbits(64)
        temperature = params.temperature if params.temperature > 0 else 1.0
        self.temperature[row] = max(temperature, MIN_TEMPERATURE)
        self.top_k[row] = min(params.top_k, self.vocab_size)
        self.top_p[row] = params.top_p
        self.penalty[row] = params.repetition_penalty
        self.keys[row] = seed_key(seed)
        self.steps[row] = 0
        if params.repetition_penalty != 1.0:
            presence = self._mask("presence")
            presence[row] = False
            presence[row, torch.tensor(tokens, device=self.device)] = True
            self._penalized += 1
        single = [w[0] for w in bad_words if len(w) == 1]
        if single or self.banned is not None:  # a previous row's bans may still be there
            banned = self._mask("banned")
            banned[row] = False
            banned[row, torch.tensor(single, dtype=torch.long, device=self.device)] = True
        self._banning += bool(single)
        self.params.append(params)
        self.tokens.append(tokens)
        self.generated_from.append(len(tokens))
        self.multi_bad.append([(tuple(w[:-1]), w[-1]) for w in bad_words if len(w) > 1])
        self.bans.append(bool(single))
        self.heals.append(torch.tensor(heal, device=self.device) if heal else None)
        self._healing += bool(heal)
        self.rows += 1
        self._plans.clear()

    def remove(self, row: int) -> None:
        """Drop ``row``, moving the last row into its place (as the engine does with the cache)."""
        last = self.rows - 1
        self._penalized -= self.params[row].repetition_penalty != 1.0
        self._banning -= self.bans[row]
        self._healing -= self.heals[row] is not None
        if row != last:
            for name in (*_PER_ROW, *_MASKS):
                tensor = getattr(self, name)
                if tensor is not None:
                    tensor[row] = tensor[last]
            for name in _LISTS:
                values = getattr(self, name)
                values[row] = values[last]
        for name in _LISTS:
            getattr(self, name).pop()
        self.rows -= 1
        self._plans.clear()

    # -- steps ---------------------------------------------------------------------------------

    def _plan(self, rows: slice) -> _Plan:
        key = (rows.start, rows.stop)
        plan = self._plans.get(key)
        if plan is None:
            params = self.params[rows]
            sampled = [i for i, p in enumerate(params) if not p.greedy]
            top_ks = [params[i].top_k for i in sampled if params[i].top_k > 0]
            nucleus_only = [params[i].top_p for i in sampled if params[i].top_k == 0]
            if any(not 0 < p < 1 for p in nucleus_only):  # plain sampling: the whole vocab
                candidates = self.vocab_size
            else:
                guess = [NUCLEUS_GUESS] if nucleus_only else []
                candidates = min(max(top_ks + guess, default=1), self.vocab_size)
            plan = _Plan(
                sampled=None
                if len(sampled) == len(params)
                else torch.tensor(sampled, dtype=torch.long, device=self.device),
                count=len(sampled),
                candidates=candidates,
                may_grow=bool(nucleus_only) and candidates < self.vocab_size,
                multi_bad=[
                    (i, word) for i, words in enumerate(self.multi_bad[rows]) for word in words
                ],
            )
            self._plans[key] = plan
        return plan

    def select(self, logits: torch.Tensor, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """The next token of every row in ``rows`` and its log-prob, from ``logits`` [B, V].

        ``logits`` (float32, one row per row of the slice) is modified in place.
        """
        logits, norm = self.process(logits, rows)
        return self.choose(logits, norm, rows)

    def process(self, logits: torch.Tensor, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """Penalties, bans and temperature applied to ``logits`` [B, V] (in place where it
        can), and each row's log normaliser: ``logits - norm[:, None]`` are the log-probs of
        the distribution a row draws from (beam search reads them whole)."""
        plan = self._plan(rows)
        if self._penalized:
            penalty = self.penalty[rows, None]
            penalized = torch.where(logits < 0, logits * penalty, logits / penalty)
            logits = torch.where(self.presence[rows], penalized, logits)
        if self._banning:
            logits.masked_fill_(self.banned[rows], float("-inf"))
        for offset, (prefix, last) in plan.multi_bad:
            row = rows.start + offset
            tokens = self.tokens[row]
            n = len(prefix)
            if len(tokens) - self.generated_from[row] >= n and tuple(tokens[-n:]) == prefix:
                logits[offset, last] = float("-inf")
        if self._healing:
            self._heal(logits, rows)
        logits /= self.temperature[rows, None]
        return logits, torch.logsumexp(logits, dim=-1)

    def _heal(self, logits: torch.Tensor, rows: slice) -> None:
        """A healed row's first token: only the tokens whose text starts with the held-back
        token's, that one favoured by ORIGINAL_BIAS (transformers' heal_tokens does the same)."""
        for offset, allowed in enumerate(self.heals[rows]):
            if allowed is None:
                continue
            kept = logits[offset, allowed]
            kept[0] += ORIGINAL_BIAS
            logits[offset] = float("-inf")
            logits[offset, allowed] = kept

    def choose(
        self, logits: torch.Tensor, norm: torch.Tensor, rows: slice
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's token (greedy or drawn) and its log-prob, from :meth:`process`'s output."""
        plan = self._plan(rows)
        if plan.count == 0:
            chosen = logits.argmax(dim=-1)
        elif plan.sampled is None:
            chosen = self._draw(logits, norm, rows, plan)
        else:
            chosen = logits.argmax(dim=-1)
            chosen.index_copy_(0, plan.sampled, self._draw(logits, norm, rows, plan))
        log_probs = logits.gather(1, chosen[:, None])[:, 0] - norm
        return chosen, log_probs

    def _draw(
        self, logits: torch.Tensor, norm: torch.Tensor, rows: slice, plan: _Plan
    ) -> torch.Tensor:
        """Inverse-CDF sampling over each sampled row's top-k / nucleus candidates."""
        idx = plan.sampled
        pick = (lambda t: t) if idx is None else (lambda t: t.index_select(0, idx))
        logits, norm = pick(logits), pick(norm)
        top_k, top_p = pick(self.top_k[rows]), pick(self.top_p[rows])
        u = uniforms(pick(self.keys[rows]), pick(self.steps[rows]))
        count = plan.candidates
        while True:
            if count >= self.vocab_size:
                values, order = torch.sort(logits, dim=-1, descending=True)
            else:
                values, order = torch.topk(logits, count, dim=-1)
            best = values[:, :1]
            weights = torch.exp(values - best)  # relative to the row's best token: K-independent
            limit = torch.where(top_k > 0, top_k, count)
            ranks = torch.arange(count, device=logits.device)
            weights.masked_fill_(ranks >= limit[:, None], 0.0)
            cumulative = weights.cumsum(dim=-1)
            # top-p is a share of the top-k mass, or of the whole distribution without top-k
            mass = torch.where(
                top_k > 0,
                cumulative.gather(1, (limit - 1)[:, None])[:, 0],
                torch.exp(norm - best[:, 0]),
            )
            nucleus = torch.where((top_p > 0) & (top_p < 1), top_p, float("inf")) * mass
            if plan.may_grow and count < self.vocab_size:
                short = (top_k == 0) & (cumulative[:, -1] < nucleus)
                if bool(short.any()):  # some nucleus reaches past the candidates: take more
                    count = min(16 * count, self.vocab_size)
                    continue
            break
        kept = (weights > 0) & (cumulative - weights < nucleus[:, None])  # a prefix of each row
        last = (kept.sum(dim=-1) - 1).clamp_(min=0)
        target = u * cumulative.gather(1, last[:, None])[:, 0]
        index = torch.searchsorted(cumulative, target[:, None], right=True)
        index = torch.minimum(index, last[:, None])
        # a row with nothing to draw from (every token banned) still gets a valid index here;
        # its log-prob comes out NaN, which is how the engine tells it apart
        return order.gather(1, index)[:, 0]

    def reorder(self, dst: list[int], src: list[int]) -> None:
        """Row ``dst[i]`` takes row ``src[i]``'s state (beams continuing another beam); all
        rows are read before any is written. The caller sets the rows' token lists."""
        moved = [(d, s) for d, s in zip(dst, src, strict=True) if d != s]
        if not moved:
            return
        to = torch.tensor([d for d, _ in moved], device=self.device)
        source = torch.tensor([s for _, s in moved], device=self.device)
        for name in (*_PER_ROW, *_MASKS):
            tensor = getattr(self, name)
            if tensor is not None:
                tensor[to] = tensor[source]
        for name in ("params", "generated_from", "multi_bad", "bans"):
            values = getattr(self, name)
            copied = [values[s] for _, s in moved]
            for (d, _), value in zip(moved, copied, strict=True):
                values[d] = value

    def advance(self, chosen: torch.Tensor, rows: slice) -> None:
        """Record that every row in ``rows`` took its ``chosen`` token."""
        self.steps[rows] += 1
        if self._healing:  # every row of the span has taken its first token
            for row in range(rows.start, rows.stop):
                if self.heals[row] is not None:
                    self.heals[row] = None
                    self._healing -= 1
        if self._penalized:
            self.presence[rows].scatter_(1, chosen[:, None], True)
