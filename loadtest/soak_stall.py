"""The soak's stall check: the longest time with requests in flight and none progressing.

Issue 16's soak froze for over 100 s with 64 requests in flight before Triton's queue timeouts
released them; the accounting saw it only as timeouts afterwards. This check measures it
directly from the ledger's records: progress is a request answered in full, or a stream's first
text; time counts only while something is in flight (typists that are typing send nothing).
The bound (``--max-stall``, 5 s) is far above a healthy server's gaps: at twice saturation the
soak completes several requests a second, and an editor's pauses are 0.4-2.5 s, so 5 s without
progress is two of the longest pauses with every request left unanswered.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from loadtest.soak_cases import OK
from loadtest.soak_results import FAIL, PASS, SKIP, Check, Record


@dataclass(frozen=True)
class Stall:
    """The longest stretch of a phase with requests in flight and none progressing."""

    phase: str
    seconds: float
    at_s: float | None  # where it began (run time); None when the phase had no requests
    progress_events: int


def progress_times(records: Iterable[Record]) -> list[float]:
    """When the server visibly made progress: a request answered in full, or a stream's first
    text (an editor's request abandoned after its first token was still being served)."""
    times = []
    for r in records:
        if r.status == OK and r.latency_s is not None:
            times.append(r.started_s + r.latency_s)
        elif r.first_token_s is not None:
            times.append(r.started_s + r.first_token_s)
    return sorted(times)


def longest_stall(phase: str, records: Sequence[Record], begin: float, end: float) -> Stall:
    """The longest interval in [begin, end] between two progress events (or a phase edge),
    counting only the time during which at least one request was in flight: a pause with
    nothing sent (typists typing) is no stall, a server that answers nothing while requests
    wait is."""
    spans = sorted(
        (r.started_s, r.started_s + r.latency_s if r.latency_s is not None else end)
        for r in records
    )
    merged: list[list[float]] = []
    for start, stop in spans:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], stop)
        else:
            merged.append([start, stop])

    def busy(a: float, b: float) -> float:
        return sum(max(0.0, min(b, hi) - max(a, lo)) for lo, hi in merged if lo < b and hi > a)

    events = [t for t in progress_times(records) if begin <= t <= end]
    edges = [begin, *events, end]
    best, at = 0.0, None
    for a, b in itertools.pairwise(edges):
        length = busy(a, b)
        if length > best:
            best, at = length, a
    return Stall(phase, round(best, 2), None if at is None else round(at, 2), len(events))


def stall_check(stalls: Sequence[Stall], bound_s: float) -> Check:
    """No phase may go ``bound_s`` with requests in flight and none progressing."""
    detail = "; ".join(
        f"{s.phase}: {s.seconds:.1f} s"
        + (f" from t={s.at_s:.0f} s" if s.at_s is not None else "")
        + f" ({s.progress_events} progress events)"
        for s in stalls
    )
    worst = max((s.seconds for s in stalls), default=0.0)
    return Check(
        f"no stall over {bound_s:g} s",
        PASS if stalls and worst <= bound_s else FAIL if stalls else SKIP,
        f"longest time with requests in flight and none answered or streaming: {detail}"
        if stalls
        else "no phase measured",
    )
