"""The soak's bookkeeping: every request from sent to its end, the summaries and checks drawn
from them, and the run folder (:mod:`loadtest.soak.report`).

Everything here is pure (no server), so ``tests/test_soak.py`` checks that the accounting adds
up, that the flatness check and the verdicts say what they should, and that the report is
written.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loadtest.soak.cases import (
    ABANDONED,
    ALL_KINDS,
    CANCELLED,
    CASES,
    EDITOR,
    INVALID,
    OK,
    QUEUE_FULL,
    REJECTED,
    TIMEOUT,
    UNANSWERED,
    UNCLEAR,
    VALID_KINDS,
    VALIDATION,
    VANISH_KINDS,
    names_any,
)
from loadtest.soak.server import Flatness

MESSAGE_CHARS = 400  # of each error text kept per request
PASS, FAIL, WARN, SKIP = "PASS", "FAIL", "WARN", "SKIP"

# --- one request ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """One request from the moment it was sent to its end."""

    kind: str
    case: str  # the invalid/hostile case's name; "" for the other kinds
    transport: str  # grpc, http, stream-grpc, stream-http, raw-http
    phase: str  # ramp, soak, drill
    started_s: float  # seconds since the run began
    latency_s: float | None  # to the answer, the rejection or the client leaving
    status: str  # ok, rejected, abandoned, unanswered
    category: str = ""  # the error category of a rejection
    message: str = ""  # the error text
    expected: bool = True  # whether this end is what the kind or case must get
    first_token_s: float | None = None  # a stream's first text, seconds after it was sent


def judge(kind: str, case: str, status: str, category: str, message: str) -> bool:
    """Whether a request ended as it must.

    Valid requests must be answered, or turned away for overload (queue full, queue timeout).
    Vanishing clients may finish or leave. An invalid case, and a hostile case that expects a
    rejection, must be rejected by a validation error naming the option; a legal hostile case
    must be answered. An editor's request is answered or abandoned at the next keystroke.
    Nothing may go unanswered.
    """
    if status == UNANSWERED:
        return False
    if kind == EDITOR:
        return status in (OK, ABANDONED)
    if case:
        spec = CASES[case]
        if spec.must_reject:
            return status == REJECTED and category == VALIDATION and names_any(message, spec.expect)
        refused_by_name = status == REJECTED and category == VALIDATION and spec.may_refuse
        return status == OK or bool(refused_by_name and names_any(message, spec.may_refuse))
    if kind in VANISH_KINDS:
        return status in (OK, ABANDONED) or category in (CANCELLED, TIMEOUT)
    return status == OK or category in (QUEUE_FULL, TIMEOUT)


def _must_get(spec) -> str:
    if spec.expect:
        return f"rejected naming {'|'.join(spec.expect)}"
    if spec.may_refuse:
        return f"answered, or refused naming {'|'.join(spec.may_refuse)}"
    return "answered"


class Ledger:
    """Thread-safe accounting of every request: sent ones are in flight until they end, and
    whatever is still in flight when the soak gives up waiting is counted unanswered."""

    def __init__(self, started: float | None = None) -> None:
        self.started = time.monotonic() if started is None else started
        self.lock = threading.Lock()
        self.records: list[Record] = []
        self.in_flight: dict[int, tuple[str, str, str, str, float]] = {}
        self._next = 0

    def now(self) -> float:
        return time.monotonic() - self.started

    def begin(self, kind: str, case: str, transport: str, phase: str) -> int:
        with self.lock:
            ticket = self._next
            self._next += 1
            self.in_flight[ticket] = (kind, case, transport, phase, self.now())
            return ticket

    def end(
        self,
        ticket: int,
        status: str,
        category: str = "",
        message: str = "",
        first_token_s: float | None = None,
    ) -> Record:
        """Record how a request ended (a second end of the same ticket is ignored)."""
        with self.lock:
            entry = self.in_flight.pop(ticket, None)
            if entry is None:
                return self.records[-1]
            kind, case, transport, phase, started = entry
            latency = None if status == UNANSWERED else self.now() - started
            record = Record(
                kind,
                case,
                transport,
                phase,
                round(started, 3),
                None if latency is None else round(latency, 4),
                status,
                category,
                message[:MESSAGE_CHARS],
                judge(kind, case, status, category, message),
                None if first_token_s is None else round(first_token_s, 4),
            )
            self.records.append(record)
            return record

    def close(self, reason: str) -> int:
        """Count everything still in flight as unanswered; how many there were."""
        with self.lock:
            tickets = list(self.in_flight)
        for ticket in tickets:
            self.end(ticket, UNANSWERED, "", reason)
        return len(tickets)

    def snapshot(self) -> tuple[list[Record], int]:
        with self.lock:
            return list(self.records), len(self.in_flight)

    @property
    def sent(self) -> int:
        with self.lock:
            return self._next


# --- summaries -----------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else None


@dataclass(frozen=True)
class KindSummary:
    """One kind of client over a phase: every request accounted for."""

    kind: str
    sent: int
    ok: int
    rejected: dict[str, int]  # by error category
    abandoned: int
    unanswered: int
    unexpected: int  # ended otherwise than the kind must (see judge)
    p50_s: float | None  # latency of the accepted (ok) requests
    p99_s: float | None

    @property
    def accounted(self) -> bool:
        return self.sent == self.ok + sum(self.rejected.values()) + self.abandoned + self.unanswered


def kind_summaries(records: Iterable[Record]) -> list[KindSummary]:
    by_kind: dict[str, list[Record]] = {}
    for record in records:
        by_kind.setdefault(record.kind, []).append(record)
    rows = []
    order = {kind: i for i, kind in enumerate(ALL_KINDS)}
    for kind in sorted(by_kind, key=lambda k: order.get(k, len(order))):
        group = by_kind[kind]
        status = Counter(r.status for r in group)
        latencies = [r.latency_s for r in group if r.status == OK and r.latency_s is not None]
        rows.append(
            KindSummary(
                kind=kind,
                sent=len(group),
                ok=status[OK],
                rejected=dict(Counter(r.category for r in group if r.status == REJECTED)),
                abandoned=status[ABANDONED],
                unanswered=status[UNANSWERED],
                unexpected=sum(not r.expected for r in group),
                p50_s=percentile(latencies, 50),
                p99_s=percentile(latencies, 99),
            )
        )
    return rows


def total_summary(rows: Sequence[KindSummary]) -> KindSummary:
    rejected: Counter[str] = Counter()
    for row in rows:
        rejected.update(row.rejected)
    return KindSummary(
        kind="all",
        sent=sum(r.sent for r in rows),
        ok=sum(r.ok for r in rows),
        rejected=dict(rejected),
        abandoned=sum(r.abandoned for r in rows),
        unanswered=sum(r.unanswered for r in rows),
        unexpected=sum(r.unexpected for r in rows),
        p50_s=None,
        p99_s=None,
    )


@dataclass(frozen=True)
class CaseSummary:
    """One invalid or hostile case: what it must get, what it got, and one message."""

    case: str
    kind: str
    description: str
    expect: str  # "answered", or "rejected naming X|Y"
    sent: int
    as_expected: int
    outcomes: dict[str, int]  # "ok", "rejected/validation", ...
    transports: list[str]
    sample_message: str

    @property
    def passed(self) -> bool:
        return self.sent > 0 and self.as_expected == self.sent


def case_summaries(records: Iterable[Record]) -> list[CaseSummary]:
    by_case: dict[str, list[Record]] = {}
    for record in records:
        if record.case:
            by_case.setdefault(record.case, []).append(record)
    rows = []
    for name in (n for n in CASES if n in by_case):
        group, spec = by_case[name], CASES[name]
        outcomes = Counter(
            r.status if r.status != REJECTED else f"{r.status}/{r.category}" for r in group
        )
        wrong = [r for r in group if not r.expected]
        sample = next((r.message for r in (*wrong, *group) if r.message), "")
        rows.append(
            CaseSummary(
                case=name,
                kind=group[0].kind,
                description=spec.description,
                expect=_must_get(spec),
                sent=len(group),
                as_expected=sum(r.expected for r in group),
                outcomes=dict(outcomes),
                transports=sorted({r.transport for r in group}),
                sample_message=sample,
            )
        )
    return rows


def error_messages(records: Iterable[Record], limit: int = 30) -> list[dict[str, Any]]:
    """The distinct error texts (numbers blurred so that one message with different values
    counts once), most frequent first, with their category."""
    import re

    counts: Counter[tuple[str, str]] = Counter()
    example: dict[tuple[str, str], str] = {}
    for record in records:
        if record.status in (REJECTED, UNANSWERED) and record.message:
            key = (record.category or record.status, re.sub(r"\d+", "N", record.message[:160]))
            counts[key] += 1
            example.setdefault(key, record.message)
    return [
        {"category": category, "count": count, "message": example[(category, shape)]}
        for (category, shape), count in counts.most_common(limit)
    ]


# --- the whole run -------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # PASS, FAIL, WARN, SKIP
    detail: str


@dataclass
class SoakResult:
    """Everything summary.json holds; report.md and the console table are drawn from it."""

    settings: dict[str, Any]
    server: dict[str, Any]
    saturation: dict[str, Any]
    kinds: list[KindSummary]
    total: KindSummary
    cases: list[CaseSummary]
    errors: list[dict[str, Any]]
    rss: Flatness | None
    rss_note: str
    drain: dict[str, Any]
    engine: dict[str, Any]
    drill: dict[str, Any]
    checks: list[Check] = field(default_factory=list)
    started_at: str = ""
    wall_s: float = 0.0
    editor: dict[str, Any] = field(default_factory=dict)  # loadtest.soak.editor_phase
    stalls: list[Any] = field(default_factory=list)  # loadtest.soak.stall.Stall per phase

    @property
    def failed(self) -> bool:
        return any(c.status == FAIL for c in self.checks)


def accounting_checks(total: KindSummary, kinds: Sequence[KindSummary]) -> list[Check]:
    """The checks every soak makes on its own books."""
    checks = [
        Check(
            "every request accounted for",
            PASS if total.accounted and all(k.accounted for k in kinds) else FAIL,
            f"sent {total.sent} = ok {total.ok} + rejected {sum(total.rejected.values())} + "
            f"abandoned {total.abandoned} + unanswered {total.unanswered}",
        ),
        Check(
            "nothing unanswered",
            PASS if total.unanswered == 0 else FAIL,
            f"{total.unanswered} request(s) had no answer within the deadline",
        ),
    ]
    valid = [k for k in kinds if k.kind in VALID_KINDS]
    bad_valid = sum(k.unexpected for k in valid)
    checks.append(
        Check(
            "valid requests answered",
            PASS if bad_valid == 0 else FAIL,
            f"{sum(k.ok for k in valid)} of {sum(k.sent for k in valid)} answered; "
            f"{bad_valid} refused for something other than overload",
        )
    )
    unclear = total.rejected.get(UNCLEAR, 0)
    checks.append(
        Check(
            "every error classified",
            PASS if unclear == 0 else WARN,
            f"{unclear} error text(s) matched no category (see the error list)",
        )
    )
    return checks


def case_check(cases: Sequence[CaseSummary], kind: str) -> Check:
    group = [c for c in cases if c.kind == kind]
    if not group:
        return Check(f"{kind} requests", SKIP, "none sent (the mix gives them no weight)")
    wrong = [c.case for c in group if not c.passed]
    sent = sum(c.sent for c in group)
    what = (
        "rejected naming the option"
        if kind == INVALID
        else "rejected naming the option, or answered when legal"
    )
    return Check(
        f"{kind} requests {what}",
        PASS if not wrong else FAIL,
        f"{sent} sent over {len(group)} cases" + (f"; wrong: {', '.join(wrong)}" if wrong else ""),
    )
