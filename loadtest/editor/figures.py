"""The editor profile's figures, from the event table (:mod:`reporting.events`, the editor's
columns in it) and one row per window of each system's own counters and CPU. Pure.

Answered (``ok``): the whole completion arrived within the pause; first token and latency
percentiles are of these. Abandoned: the next keystroke came first. Tokens generated for
abandoned requests: the server's generated-tokens counter minus the tokens readers got (an
answered request's whole completion, an abandoned one's pieces read), per abandoned request;
over SSE a piece counts as one token: an upper bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from loadtest.editor.systems import (
    CANCELLED,
    COUNTERS,
    GENERATED,
    PAST_STOP,
    PROMPT,
    REUSED,
    SEQUENCES,
    STOPS,
)
from loadtest.metrics import reuse_share
from reporting.events import summarize

RESENT = "resent"  # the resend probe's rows (loadtest.editor.drill), apart from the typists'
ANSWERED, ABANDONED, ERROR = "answered", "abandoned", "error"


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


def request_event(record: EditorRecord, protocol: str, one_line: bool, wall: float) -> dict:
    """One request as the arguments of Locust's ``request`` event, the editor's own columns
    in its context."""
    outcome = {ANSWERED: "ok", ABANDONED: "abandoned"}.get(record.outcome, "error")
    delivered = record.tokens_read  # an abandoned request: the pieces read before leaving
    if outcome == "ok" and record.completion_tokens is not None:
        delivered = record.completion_tokens  # the server's count of the whole answer
    return dict(
        request_type=protocol, name="one-line" if one_line else "completion",
        response_time=record.latency_ms or record.pause_s * 1000,
        response_length=record.tokens_read, start_time=wall,
        exception=RuntimeError(record.error) if outcome == "error" else None,
        context={
            "outcome": outcome, "first_token_ms": record.first_token_ms, "tokens": delivered,
            "typist": record.typist, "pause_s": record.pause_s, "one_line": one_line,
            "prefix_tokens": record.prefix_tokens, "suffix_tokens": record.suffix_tokens,
            "pieces": record.pieces, "tokens_read": record.tokens_read,
        },
    )  # fmt: skip


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or not b or pd.isna(a) or pd.isna(b) else a / b


def _by_system(events: pd.DataFrame) -> dict[str, dict]:
    """:func:`reporting.events.summarize` per system, missing figures as None."""
    if not len(events):
        return {}
    table = summarize(events, by=["system"]).set_index("system").astype(object)
    return table.where(table.notna(), None).to_dict("index")


def system_figures(events: pd.DataFrame, windows: pd.DataFrame) -> dict[str, dict]:
    """Per system (in the order the systems first typed): the figures the report prints."""
    figures: dict[str, dict] = {}
    resent = events[events["name"] == RESENT] if len(events) else events
    events = events[events["name"] != RESENT] if len(events) else events
    typed, warm = _by_system(events), _by_system(resent)
    for system in dict.fromkeys([*windows["system"], *events.get("system", [])]):
        rows = events[events["system"] == system] if len(events) else events
        ours, s, w = windows[windows["system"] == system], typed.get(system, {}), warm.get(system)
        ok, abandoned = rows[rows["outcome"] == "ok"], rows[rows["outcome"] == "abandoned"]
        counted = {n: float(ours[n].sum()) for n in COUNTERS if n in ours and ours[n].notna().all()}
        seconds, generated = float(ours["seconds"].sum()), counted.get(GENERATED)
        delivered = float(pd.to_numeric(rows["tokens"], errors="coerce").fillna(0).sum())
        cpu = None if ours["cpu_s"].isna().any() else float(ours["cpu_s"].sum())
        wasted = None if generated is None else generated - delivered
        prompt = rows.get("prefix_tokens", pd.Series()) + rows.get("suffix_tokens", 0)
        figures[system] = {
            "requests": len(rows), "answered": len(ok), "abandoned": len(abandoned),
            "errors": int((rows["outcome"] == "error").sum()),
            "abandoned share": _ratio(len(abandoned), len(ok) + len(abandoned)),
            "abandoned while streaming": int(abandoned["first_token_ms"].notna().sum()),
            **{f"{f} {p} ms": s.get(f"{f.replace(' ', '_')}_{p}_ms") for f in
               ("first token", "latency") for p in ("p50", "p95")},
            "prompt tokens sent / request": float(prompt.mean()) if len(prompt) else None,
            "seconds of typing": seconds,
            "tokens delivered / s": delivered / seconds if seconds else None,
            "CPU seconds": cpu,
            "CPU ms / answered request": _ratio(None if cpu is None else 1000 * cpu, len(ok)),
            "tokens generated": generated,
            "tokens delivered": delivered,
            "generated for abandoned, unread (at most)": wasted,
            "... per abandoned request (at most)": _ratio(wasted, len(abandoned)),
            "sequences": counted.get(SEQUENCES),
            "of them cancelled": counted.get(CANCELLED),
            "prompt tokens received / request": _ratio(counted.get(PROMPT), len(rows)),
            "prompt-cache reuse share (at most)": reuse_share(
                counted.get(PROMPT, 0.0), counted.get(REUSED)),
            "editor stops": counted.get(STOPS),
            "tokens generated past a stop": counted.get(PAST_STOP),
            **{f"resent +3 chars: {f} ms": (w or {}).get(f"{f.replace(' ', '_')}_ms") for f in
               ("first token p50", "latency p50", "latency p95")},
        }  # fmt: skip
    return figures
