"""The soak's figures and checks, drawn from the request-event table (one row per request, as
:class:`reporting.events.EventLog` keeps it; the soak's columns: ``status``, ``category``,
``case``, ``transport``, ``expected``). Pure: ``tests/test_soak.py`` checks them on tables
built by hand.

The stall check: an earlier soak froze for over 100 s with 64 requests in flight before
Triton's queue timeouts released them; the accounting saw it only as timeouts afterwards. The
stall is the longest time with requests in flight and none progressing (answered in full, or a
stream's first text); time counts only while something is in flight. Its bound is
``--max-stall`` (5 s), raised on a machine too slow to meet it to :data:`STALL_FACTOR` times
what one request alone takes there just before the phase: a healthy server's longest gap stays
within a few lone-request times, and a check a slow machine fails by construction would say
nothing about the server.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from loadtest.soak.cases import (
    ABANDONED,
    ALL_KINDS,
    CASES,
    CATEGORIES,
    INVALID,
    OK,
    REJECTED,
    UNANSWERED,
    UNCLEAR,
    VALID_KINDS,
    must_get,
)

PASS, FAIL, WARN, SKIP = "PASS", "FAIL", "WARN", "SKIP"
STALL_FACTOR = 8


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # PASS, FAIL, WARN, SKIP
    detail: str


# --- the accounting ------------------------------------------------------------------------


SOAK_COLUMNS = ("status", "category", "case", "transport", "expected")


def soak_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The event table with the soak's own columns, present even when no row has them."""
    return frame.assign(**{c: "" for c in SOAK_COLUMNS if c not in frame}).fillna(
        {c: "" for c in ("category", "case", "error")}
    )


def _expected(frame: pd.DataFrame) -> pd.Series:
    return frame["expected"].astype(str).str.lower().isin(("true", "1"))


def kinds(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per kind of client, then ``all``: sent, ok, rejected by category, abandoned,
    unanswered, unexpected (ended otherwise than it must), p50/p99 latency of the ok ones."""
    order = {kind: i for i, kind in enumerate(ALL_KINDS)}
    rows = []
    groups = sorted(frame.groupby("kind"), key=lambda g: order.get(g[0], len(order)))
    for kind, group in [*groups, ("all", frame)]:
        ok = pd.to_numeric(group.loc[group["status"] == OK, "latency_ms"]) / 1000
        rejected = Counter(group.loc[group["status"] == REJECTED, "category"])
        rows.append(
            {
                "kind": kind,
                "sent": len(group),
                "ok": int((group["status"] == OK).sum()),
                "rejected": ", ".join(f"{c} {rejected[c]}" for c in CATEGORIES if rejected[c])
                or "0",
                "rejected_n": sum(rejected.values()),
                "abandoned": int((group["status"] == ABANDONED).sum()),
                "unanswered": int((group["status"] == UNANSWERED).sum()),
                "unclear": rejected[UNCLEAR],
                "unexpected": int((~_expected(group)).sum()),
                "p50 s": ok.quantile(0.5) if len(ok) and kind != "all" else None,
                "p99 s": ok.quantile(0.99) if len(ok) and kind != "all" else None,
            }
        )
    return pd.DataFrame(rows)


def cases(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per invalid or hostile case sent: what it must get, what it got, one message
    (a wrong end's first)."""
    rows = []
    sent = frame[frame["case"].fillna("") != ""]
    for name in (n for n in CASES if n in set(sent["case"])):
        group = sent[sent["case"] == name]
        outcomes = Counter(
            s if s != REJECTED else f"{s}/{c}"
            for s, c in zip(group["status"], group["category"], strict=True)
        )
        ordered = pd.concat([group[~_expected(group)], group])
        messages = [m for m in ordered["error"] if m]
        rows.append(
            {
                "case": name,
                "kind": group["kind"].iloc[0],
                "sent": len(group),
                "must be": must_get(CASES[name]),
                "as expected": int(_expected(group).sum()),
                "outcomes": ", ".join(f"{k} {v}" for k, v in outcomes.items()),
                "message": messages[0][:160] if messages else "",
            }
        )
    return pd.DataFrame(rows, columns=["case", "kind", "sent", "must be", "as expected",
                                       "outcomes", "message"])  # fmt: skip


def error_messages(frame: pd.DataFrame, limit: int = 30) -> pd.DataFrame:
    """The distinct error texts (numbers blurred, so one message with different values counts
    once), most frequent first, with their category."""
    failed = frame[frame["status"].isin((REJECTED, UNANSWERED)) & (frame["error"] != "")]
    counts: Counter[tuple[str, str]] = Counter()
    example: dict[tuple[str, str], str] = {}
    for status, category, message in zip(
        failed["status"], failed["category"], failed["error"], strict=True
    ):
        key = (category or status, re.sub(r"\d+", "N", message[:160]))
        counts[key] += 1
        example.setdefault(key, message[:200])
    rows = [(c, n, example[(c, s)]) for (c, s), n in counts.most_common(limit)]
    return pd.DataFrame(rows, columns=["category", "count", "message"])


def accounting_checks(table: pd.DataFrame, sent: int, ended: int) -> list[Check]:
    """The checks every soak makes on its own books (``table``: :func:`kinds` of the measured
    phases; ``sent``: how many requests the clients began, ``ended``: rows they left)."""
    total = table.iloc[-1]
    ends = total["ok"] + total["rejected_n"] + total["abandoned"] + total["unanswered"]
    valid = table[table["kind"].isin(VALID_KINDS)]
    unclear = total["unclear"]
    return [
        Check(
            "every request accounted for",
            PASS if sent == ended and total["sent"] == ends else FAIL,
            f"sent {sent}, ended {ended}; measured {total['sent']} = ok {total['ok']} + rejected "
            f"{total['rejected_n']} + abandoned {total['abandoned']} + unanswered "
            f"{total['unanswered']}",
        ),
        Check(
            "nothing unanswered",
            PASS if total["unanswered"] == 0 else FAIL,
            f"{total['unanswered']} request(s) had no answer within the deadline",
        ),
        Check(
            "valid requests answered",
            PASS if valid["unexpected"].sum() == 0 else FAIL,
            f"{valid['ok'].sum()} of {valid['sent'].sum()} answered; "
            f"{valid['unexpected'].sum()} refused for something other than overload",
        ),
        Check(
            "every error classified",
            PASS if not unclear else WARN,
            f"{unclear} error text(s) matched no category (see the error list)",
        ),
    ]


def case_check(table: pd.DataFrame, kind: str) -> Check:
    group = table[table["kind"] == kind]
    if group.empty:
        return Check(f"{kind} requests", SKIP, "none sent (the mix gives them no weight)")
    wrong = list(group.loc[group["as expected"] != group["sent"], "case"])
    what = (
        "rejected naming the option"
        if kind == INVALID
        else "rejected naming the option, or answered when legal"
    )
    return Check(
        f"{kind} requests {what}",
        PASS if not wrong else FAIL,
        f"{group['sent'].sum()} sent over {len(group)} cases"
        + (f"; wrong: {', '.join(wrong)}" if wrong else ""),
    )


# --- stalls --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stall:
    """The longest stretch of a phase with requests in flight and none progressing."""

    phase: str
    seconds: float
    at_s: float | None  # where it began (run time); None when the phase had no requests
    progress_events: int
    reference_s: float | None = None  # one request alone, just before the phase
    bound_s: float = 5.0  # see stall_bound
    until_s: float | None = None  # the progress event (or phase end) that ended it
    engine: str = ""  # what the engine did meanwhile, to tell why


def stall_bound(max_stall_s: float, reference_s: float | None) -> float:
    """``max_stall_s``, or STALL_FACTOR lone-request times where that is longer."""
    return max_stall_s if reference_s is None else max(max_stall_s, STALL_FACTOR * reference_s)


def longest_stall(
    phase: str,
    rows: pd.DataFrame,
    begin: float,
    end: float,
    max_stall_s: float = 5.0,
    reference_s: float | None = None,
) -> Stall:
    """The longest interval in [begin, end] between two progress events (or a phase edge),
    counting only the time during which at least one request was in flight: a pause with
    nothing sent (typists typing) is no stall, a server that answers nothing while requests
    wait is. An unanswered request is in flight to the phase's end."""
    if rows.empty:
        return Stall(phase, 0.0, None, 0, reference_s, stall_bound(max_stall_s, reference_s))
    started = pd.to_numeric(rows["started_s"]).tolist()
    latency = (pd.to_numeric(rows["latency_ms"]) / 1000).tolist()
    first = (pd.to_numeric(rows["first_token_ms"]) / 1000).tolist()
    status = rows["status"].tolist()
    spans, events = [], []
    for t, lat, ft, st in zip(started, latency, first, status, strict=True):
        spans.append((t, end if st == UNANSWERED else t + lat))
        if st == OK:
            events.append(t + lat)
        elif ft == ft and ft is not None:  # not NaN: a stream's first text
            events.append(t + ft)
    merged: list[list[float]] = []
    for lo, hi in sorted(spans):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])

    def busy(a: float, b: float) -> float:
        return sum(max(0.0, min(b, hi) - max(a, lo)) for lo, hi in merged if lo < b and hi > a)

    inside = sorted(t for t in events if begin <= t <= end)
    best, at, until = 0.0, None, None
    for a, b in itertools.pairwise([begin, *inside, end]):
        if (length := busy(a, b)) > best:
            best, at, until = length, a, b
    return Stall(
        phase,
        round(best, 2),
        None if at is None else round(at, 2),
        len(inside),
        None if reference_s is None else round(reference_s, 3),
        round(stall_bound(max_stall_s, reference_s), 2),
        None if until is None else round(until, 2),
    )


def stall_line(s: Stall) -> str:
    text = f"{s.phase}: {s.seconds:.1f} s" + (
        f" from t={s.at_s:.0f} s" if s.at_s is not None else ""
    )
    text += f" ({s.progress_events} progress events; bound {s.bound_s:g} s"
    if s.reference_s is not None:
        text += f", a request alone took {s.reference_s:.2f} s"
    return text + ")" + (f"; engine meanwhile: {s.engine}" if s.engine else "")


def stall_check(stalls: Sequence[Stall], max_stall_s: float) -> Check:
    """No phase may go its bound with requests in flight and none progressing."""
    over = [s for s in stalls if s.seconds > s.bound_s]
    return Check(
        f"no stall over max({max_stall_s:g} s, {STALL_FACTOR} lone requests)",
        (FAIL if over else PASS) if stalls else SKIP,
        "longest time with requests in flight and none answered or streaming: "
        + "; ".join(stall_line(s) for s in stalls)
        if stalls
        else "no phase measured",
    )


# --- memory --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Flatness:
    """Is the server's memory flat after warm-up? The largest RSS of the last third of the
    samples against the largest of the first third (max, not mean: a leak raises the peaks)."""

    samples: int
    growth: float | None  # last / first - 1
    flat: bool | None  # None: too few samples to say
    note: str


def rss_flatness(samples: Sequence[int], tolerance: float, minimum: int = 6) -> Flatness:
    """Flatness of the RSS values of the measured phase after warm-up, in time order."""
    if len(samples) < minimum:
        note = f"too few samples after warm-up ({len(samples)} < {minimum}): run longer"
        return Flatness(len(samples), None, None, note)
    third = len(samples) // 3
    first, last = max(samples[:third]), max(samples[-third:])
    growth = last / first - 1
    flat = growth <= tolerance
    note = (
        f"{'flat' if flat else 'growing'}: last third max {last / 2**20:,.0f} MiB vs first "
        f"third max {first / 2**20:,.0f} MiB ({growth:+.1%}, tolerance {tolerance:.0%})"
    )
    return Flatness(len(samples), growth, flat, note)
