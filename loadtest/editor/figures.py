"""The editor profile's records and figures: every request a typist sent and how it ended, and
what a run reports, computed from them and from the engine's counters over the run.

Pure (no server): the tests feed it records and counter increases.

- Answered: the whole completion arrived within the pause. First token and latency
  percentiles are of these.
- Abandoned: the next keystroke came first, and the typist closed the request.
- Error: the server refused or failed it (the error text is kept, counted by message).

Tokens generated for abandoned requests are the engine's generated tokens over the run minus
the tokens that reached a reader: an answered request's whole completion (the server's count),
an abandoned one's pieces read before it left. Over SSE a piece is counted as one token (a piece
carries one token or more), so there the figure is an upper bound ("at most"); over gRPC each
piece says how many tokens it carries, so it is exact.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from contract import metrics as names
from loadtest.metrics import reuse_share

ANSWERED, ABANDONED, ERROR = "answered", "abandoned", "error"
OUTCOMES = (ANSWERED, ABANDONED, ERROR)
NOT_REPORTED = "not reported by this engine"


@dataclass(frozen=True)
class EditorRecord:
    """One typist's request, from the pause that sent it to its end."""

    typist: int
    t_s: float  # sent, seconds since the typists started
    outcome: str  # answered, abandoned, error
    pause_s: float  # the next keystroke came this long after sending
    prefix_tokens: int
    suffix_tokens: int
    first_token_ms: float | None
    latency_ms: float | None  # answered only
    pieces: int
    tokens_read: int
    completion_tokens: int | None  # the server's count (answered)
    error: str = ""


@dataclass(frozen=True)
class Percentiles:
    p50: float | None = None
    p95: float | None = None

    @classmethod
    def of(cls, values: Sequence[float]) -> Percentiles:
        if not values:
            return cls()
        p50, p95 = np.percentile(np.asarray(values, dtype=float), [50, 95])
        return cls(float(p50), float(p95))


@dataclass(frozen=True)
class EngineFigures:
    """From the engine's counters over the run (contract/metrics.py names)."""

    generated_tokens: float
    delivered_tokens: int
    wasted_tokens: float  # generated minus delivered: tokens no reader got
    wasted_is_upper_bound: bool
    wasted_per_abandoned: float | None
    sequences: float  # sequences the engine finished or dropped
    cancelled: float
    prompt_tokens: float  # received: every prompt the engine admitted, whole
    prompt_tokens_per_request: float | None
    reused_tokens: float | None  # None: NOT_REPORTED
    reuse_share: float | None  # reused / received: reuse_share()
    reuse_note: str


@dataclass(frozen=True)
class EditorFigures:
    requests: int
    answered: int
    abandoned: int
    errors: int
    abandoned_share: float | None  # abandoned / (answered + abandoned)
    abandoned_after_first_token: int  # abandoned while already streaming text
    first_token_ms: Percentiles
    latency_ms: Percentiles
    prompt_tokens_sent: float | None  # mean prefix + suffix tokens per request (client count)
    suffix_tokens_sent: float | None
    engine: EngineFigures | None
    error_messages: dict[str, int] = field(default_factory=dict)


def reuse_metric() -> str | None:
    """The engine's prefix-cache reuse counter, where contract/metrics.py names one (a counter
    of prompt tokens served from the cache instead of prefilled)."""
    for constant, value in sorted(vars(names).items()):
        if (
            constant.startswith("ENGINE_")
            and isinstance(value, str)
            and value.endswith("_total")
            and re.search(r"REUSE|PREFIX_CACHE|CACHED|CACHE_HIT", constant)
        ):
            return value
    return None


def engine_figures(
    increases: dict[str, float], records: Sequence[EditorRecord], exact_tokens: bool
) -> EngineFigures:
    """``increases``: each counter's increase over the run for the engine model, by its
    exposed name (plus ``_total`` where Triton's parser adds it: see loadtest.metrics)."""

    def get(metric: str) -> float:
        return increases.get(metric, increases.get(metric + "_total", 0.0))

    generated = get(names.ENGINE_GENERATED_TOKENS)
    delivered = sum(
        (r.completion_tokens if r.completion_tokens is not None else r.tokens_read)
        if r.outcome == ANSWERED
        else r.tokens_read
        for r in records
    )
    abandoned = sum(r.outcome == ABANDONED for r in records)
    sequences = get(names.ENGINE_REQUESTS)
    received = get(names.ENGINE_PROMPT_TOKENS)
    metric = reuse_metric()
    reused = None
    if metric is not None and (metric in increases or metric + "_total" in increases):
        reused = get(metric)
    wasted = generated - delivered
    return EngineFigures(
        generated_tokens=generated,
        delivered_tokens=delivered,
        wasted_tokens=wasted,
        wasted_is_upper_bound=not exact_tokens,
        wasted_per_abandoned=wasted / abandoned if abandoned else None,
        sequences=sequences,
        cancelled=get(names.ENGINE_CANCELLED),
        prompt_tokens=received,
        prompt_tokens_per_request=received / sequences if sequences else None,
        reused_tokens=reused,
        reuse_share=reuse_share(received, reused),
        reuse_note=(
            f"{metric} over the run"
            if reused is not None
            else NOT_REPORTED + (f" ({metric} is not exported)" if metric else "")
        ),
    )


def error_key(message: str) -> str:
    """One message with different numbers counts once."""
    return re.sub(r"\d+", "N", message)[:200]


def editor_figures(
    records: Sequence[EditorRecord], engine: EngineFigures | None = None
) -> EditorFigures:
    answered = [r for r in records if r.outcome == ANSWERED]
    abandoned = [r for r in records if r.outcome == ABANDONED]
    errors = [r for r in records if r.outcome == ERROR]
    ended = len(answered) + len(abandoned)
    prompt = [r.prefix_tokens + r.suffix_tokens for r in records]
    return EditorFigures(
        requests=len(records),
        answered=len(answered),
        abandoned=len(abandoned),
        errors=len(errors),
        abandoned_share=len(abandoned) / ended if ended else None,
        abandoned_after_first_token=sum(r.first_token_ms is not None for r in abandoned),
        first_token_ms=Percentiles.of(
            [r.first_token_ms for r in answered if r.first_token_ms is not None]
        ),
        latency_ms=Percentiles.of([r.latency_ms for r in answered if r.latency_ms is not None]),
        prompt_tokens_sent=float(np.mean(prompt)) if prompt else None,
        suffix_tokens_sent=float(np.mean([r.suffix_tokens for r in records])) if records else None,
        engine=engine,
        error_messages=dict(Counter(error_key(r.error) for r in errors).most_common(20)),
    )
