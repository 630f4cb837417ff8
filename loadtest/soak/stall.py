"""The soak's stall check: the longest time with requests in flight and none progressing.

An earlier soak froze for over 100 s with 64 requests in flight before Triton's queue timeouts
released them; the accounting saw it only as timeouts afterwards. This check measures it
directly from the ledger's records: progress is a request answered in full, or a stream's first
text; time counts only while something is in flight (typists that are typing send nothing).
The bound is ``--max-stall`` (5 s: two of an editor's longest pauses with every request left
without a token), raised on a machine too slow to meet it: to :data:`STALL_FACTOR` times what
one request alone takes there, measured on the idle server just before the phase (a valid
unary request for the soak phase, a full-context editor request to its first token for the
editor phase). Under the phase's load a request shares the engine with up to about twice the
clients that saturate it, or with the other typists' full-context prefills, so a healthy
server's longest gap stays within a few lone-request times; eight of them is a stall on any
machine, and the 100 s stalls seen then fail it everywhere. A check that a slow machine fails
by construction would say nothing about the server.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from contract import metrics as names
from loadtest.soak.cases import OK
from loadtest.soak.results import FAIL, PASS, SKIP, Check, Record
from reporting.triton import read_snapshot


@dataclass(frozen=True)
class Stall:
    """The longest stretch of a phase with requests in flight and none progressing."""

    phase: str
    seconds: float
    at_s: float | None  # where it began (run time); None when the phase had no requests
    progress_events: int
    reference_s: float | None = None  # one request alone, just before the phase (None: unknown)
    bound_s: float | None = None  # the bound this phase was held to (see stall_bound)
    until_s: float | None = None  # the progress event (or phase end) that ended it
    engine: str = ""  # what the engine did meanwhile (EngineSampler.during), to tell why


STALL_FACTOR = 8


def stall_bound(max_stall_s: float, reference_s: float | None) -> float:
    """``max_stall_s``, or STALL_FACTOR lone-request times where that is longer."""
    if reference_s is None:
        return max_stall_s
    return max(max_stall_s, STALL_FACTOR * reference_s)


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


def longest_stall(
    phase: str,
    records: Sequence[Record],
    begin: float,
    end: float,
    max_stall_s: float = 5.0,
    reference_s: float | None = None,
) -> Stall:
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
    best, at, until = 0.0, None, None
    for a, b in itertools.pairwise(edges):
        length = busy(a, b)
        if length > best:
            best, at, until = length, a, b
    return Stall(
        phase,
        round(best, 2),
        None if at is None else round(at, 2),
        len(events),
        None if reference_s is None else round(reference_s, 3),
        round(stall_bound(max_stall_s, reference_s), 2),
        None if until is None else round(until, 2),
    )


def stall_check(stalls: Sequence[Stall], max_stall_s: float) -> Check:
    """No phase may go its bound with requests in flight and none progressing."""

    def line(s: Stall) -> str:
        bound = s.bound_s if s.bound_s is not None else max_stall_s
        text = f"{s.phase}: {s.seconds:.1f} s"
        text += f" from t={s.at_s:.0f} s" if s.at_s is not None else ""
        text += f" ({s.progress_events} progress events; bound {bound:g} s"
        if s.reference_s is not None:
            text += f", a request alone took {s.reference_s:.2f} s"
        return text + ")" + (f"; engine meanwhile: {s.engine}" if s.engine else "")

    over = [s for s in stalls if s.seconds > (s.bound_s if s.bound_s is not None else max_stall_s)]
    return Check(
        f"no stall over max({max_stall_s:g} s, {STALL_FACTOR} lone requests)",
        (FAIL if over else PASS) if stalls else SKIP,
        "longest time with requests in flight and none answered or streaming: "
        + "; ".join(line(s) for s in stalls)
        if stalls
        else "no phase measured",
    )


@dataclass(frozen=True)
class EngineSample:
    t_s: float
    steps: float  # codegen_engine_steps_total
    running: float  # codegen_engine_running_sequences
    pending: float  # Triton's pending requests, every model


class EngineSampler:
    """The engine's step counter and queues every ``every`` seconds, so that a stall can be
    told apart: an engine stepping with sequences running is busy (work nobody gets, or too
    much of it); one not stepping with requests pending is wedged."""

    def __init__(self, metrics_url: str, clock: Any, every: float = 1.0) -> None:
        self.metrics_url, self.clock, self.every = metrics_url, clock, every
        self.samples: list[EngineSample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-sampler", daemon=True)

    def start(self) -> EngineSampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError, ValueError):
                snapshot = read_snapshot(self.metrics_url, timeout=2.0)
                self.samples.append(
                    EngineSample(
                        round(self.clock(), 2),
                        snapshot.value(names.ENGINE_STEPS),
                        snapshot.value(names.ENGINE_RUNNING),
                        snapshot.value(names.PENDING_REQUEST_COUNT),
                    )
                )
            self._stop.wait(self.every)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def during(self, begin: float, end: float) -> str:
        """What the engine did between ``begin`` and ``end`` (run time), in a phrase."""
        inside = [s for s in self.samples if begin <= s.t_s <= end]
        if len(inside) < 2:
            return ""
        steps = inside[-1].steps - inside[0].steps
        return (
            f"{steps:.0f} steps in {inside[-1].t_s - inside[0].t_s:.0f} s, up to "
            f"{max(s.running for s in inside):.0f} sequences running and "
            f"{max(s.pending for s in inside):.0f} requests pending in Triton"
        )


def explain(stall: Stall, sampler: EngineSampler | None) -> Stall:
    """The stall with what the engine did during it."""
    if sampler is None or stall.at_s is None or stall.until_s is None:
        return stall
    return replace(stall, engine=sampler.during(stall.at_s, stall.until_s))
