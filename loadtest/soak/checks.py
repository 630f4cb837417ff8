"""The soak's figures and checks, drawn from the request-event table (one row per request, as
:class:`reporting.events.EventLog` keeps it, labelled by :func:`soak_rows`). Pure: the tests
check them on tables built by hand. Why the stall bound is what it is: docs/soak.md."""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from loadtest.soak import cases as c
from reporting.events import summarize
from reporting.triton import EngineState

PASS, FAIL, WARN, SKIP = "PASS", "FAIL", "WARN", "SKIP"
STALL_FACTOR = 8
MEASURED = ("soak", "editor")
TYPISTS = "openai"  # the kind the editor profile's typists fire (loadtest.editor.figures)
RSS_CHECK = "RSS flat after warm-up"


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # PASS, FAIL, WARN, SKIP
    detail: str


def soak_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The event table with the soak's columns on every row: the typists' rows as kind
    ``editor`` (answered, abandoned, or rejected with their error's category), and whether
    each request ended as it must (``expected``, :func:`~loadtest.soak.cases.judge`)."""
    own = ("status", "category", "case", "transport", "error")
    f = frame.assign(**{col: "" for col in own if col not in frame}).fillna(dict.fromkeys(own, ""))
    typed = f["kind"] == TYPISTS
    f.loc[typed, "kind"], f.loc[typed, "transport"] = c.EDITOR, "openai-sse"
    f.loc[typed, "status"] = f.loc[typed, "outcome"].map({"ok": c.OK, "abandoned": c.ABANDONED})
    f.loc[typed & (f["outcome"] == "error"), "status"] = c.REJECTED
    failed = typed & (f["status"] == c.REJECTED)
    f.loc[failed, "category"] = f.loc[failed, "error"].map(c.classify_error)
    columns = ("kind", "case", "status", "category", "error")
    f["expected"] = [c.judge(*row) for row in zip(*(f[col] for col in columns), strict=True)]
    return f


def measured(frame: pd.DataFrame) -> pd.DataFrame:  # the rows of the soak and editor phases
    return soak_rows(frame[frame["window"].isin(MEASURED)])


def kinds(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per kind of client, then ``all``: sent, each end, rejections by category,
    unexpected ends, p50/p99 latency of the ok ones."""
    order = {kind: i for i, kind in enumerate(c.ALL_KINDS)}
    groups = sorted(frame.groupby("kind"), key=lambda g: order.get(g[0], len(order)))
    rows = []
    for kind, group in [*groups, ("all", frame)]:
        status = group["status"].value_counts()
        rejected = group.loc[group["status"] == c.REJECTED, "category"].value_counts()
        ok = pd.to_numeric(group.loc[group["status"] == c.OK, "latency_ms"]) / 1000
        p50, p99 = ok.quantile([0.5, 0.99]) if len(ok) and kind != "all" else (None, None)
        rows.append(
            {
                "kind": kind,
                "sent": len(group),
                c.OK: int(status.get(c.OK, 0)),
                "rejected": ", ".join(f"{k} {rejected[k]}" for k in c.CATEGORIES if k in rejected)
                or "0",
                "rejected_n": int(status.get(c.REJECTED, 0)),
                **{k: int(status.get(k, 0)) for k in (c.ABANDONED, c.UNANSWERED)},
                "unclear": int(rejected.get(c.UNCLEAR, 0)),
                "unexpected": int((~group["expected"].astype(bool)).sum()),
                "p50 s": p50,
                "p99 s": p99,
            }
        )
    return pd.DataFrame(rows)


def cases(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per invalid or hostile case sent: what it must get, what it got, one message
    (a wrong end's first)."""
    rows, sent = [], frame[frame["case"] != ""]
    for name in (n for n in c.CASES if n in set(sent["case"])):
        group = sent[sent["case"] == name]
        ends = zip(group["status"], group["category"], strict=True)
        outcomes = Counter(s if s != c.REJECTED else f"{s}/{k}" for s, k in ends)
        messages = [m for m in pd.concat([group[~group["expected"]], group])["error"] if m]
        rows.append(
            {
                "case": name,
                "kind": group["kind"].iloc[0],
                "sent": len(group),
                "must be": c.must_get(c.CASES[name]),
                "as expected": int(group["expected"].sum()),
                "outcomes": ", ".join(f"{k} {v}" for k, v in outcomes.items()),
                "message": messages[0][:160] if messages else "",
            }
        )
    return pd.DataFrame(
        rows, columns=["case", "kind", "sent", "must be", "as expected", "outcomes", "message"]
    )


def error_messages(frame: pd.DataFrame, limit: int = 30) -> pd.DataFrame:
    """The distinct error texts (numbers blurred: one message with other values counts once),
    most frequent first, with their category."""
    failed = frame[frame["status"].isin((c.REJECTED, c.UNANSWERED)) & (frame["error"] != "")]
    counts: Counter[tuple[str, str]] = Counter()
    example: dict[tuple[str, str], str] = {}
    for status, category, message in zip(
        *(failed[k] for k in ("status", "category", "error")), strict=True
    ):
        key = (category or status, re.sub(r"\d+", "N", message[:160]))
        counts[key] += 1
        example.setdefault(key, message[:200])
    rows = [(k, n, example[(k, m)]) for (k, m), n in counts.most_common(limit)]
    return pd.DataFrame(rows, columns=["category", "count", "message"])


def accounting_checks(table: pd.DataFrame, sent: int, ended: int) -> list[Check]:
    """The soak's books (``table``: :func:`kinds` of the measured phases; ``sent``: requests
    the clients began, ``ended``: rows they left)."""
    total, valid = table.iloc[-1], table[table["kind"].isin(c.VALID_KINDS)]
    ends = total["ok"] + total["rejected_n"] + total["abandoned"] + total["unanswered"]
    return [
        Check(
            "every request accounted for",
            PASS if sent == ended and total["sent"] == ends else FAIL,
            f"sent {sent}, ended {ended}; measured {total['sent']} = ok "
            f"{total['ok']} + rejected {total['rejected_n']} + abandoned {total['abandoned']} "
            f"+ unanswered {total['unanswered']}",
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
            PASS if not total["unclear"] else WARN,
            f"{total['unclear']} error text(s) matched no category (see the error list)",
        ),
    ]


def case_check(table: pd.DataFrame, kind: str) -> Check:
    group = table[table["kind"] == kind]
    if group.empty:
        return Check(f"{kind} requests", SKIP, "none sent (the mix gives them no weight)")
    wrong = list(group.loc[group["as expected"] != group["sent"], "case"])
    what = "" if kind == c.INVALID else ", or answered when legal"
    return Check(
        f"{kind} requests rejected naming the option{what}",
        FAIL if wrong else PASS,
        f"{group['sent'].sum()} sent over {len(group)} cases"
        + (f"; wrong: {', '.join(wrong)}" if wrong else ""),
    )


def server_checks(
    ready: str, idle: EngineState | None, after: EngineState | None, drain_s: float
) -> list[Check]:
    """Ready after the soak, the engine idle after the drain, its KV cache back to idle."""
    running, pending = (after.running, after.pending) if after else ("?", "?")
    found = [
        Check(
            "server ready after the soak",
            PASS if ready == "200" else FAIL,
            f"/v2/health/ready answered {ready}",
        ),
        Check(
            "engine idle after the drain",
            PASS if after and after.running == 0 and not after.pending else FAIL,
            f"running sequences {running}, pending requests {pending} after {drain_s:.1f}s",
        ),
    ]
    kv, base = after and after.kv_cache_bytes, (idle and idle.kv_cache_bytes) or 0.0
    return [
        *found,
        Check("KV cache back to idle", SKIP, "not exported (codegen_engine_kv_cache_bytes)")
        if kv is None
        else Check(
            "KV cache back to idle",
            PASS if kv <= base * 1.01 + 2**20 else WARN,
            f"{kv / 2**20:.1f} MiB after the drain vs {base / 2**20:.1f} MiB idle",
        ),
    ]


EDITOR_FIGURES = ("first_token_p50_ms", "first_token_p95_ms", "latency_p50_ms", "latency_p95_ms")


def editor_figures(rows: pd.DataFrame) -> dict[str, Any]:
    """The editor phase's counts, prompt size and percentiles (:func:`summarize`)."""
    found = summarize(rows, by=["kind"]).iloc[0] if len(rows) else pd.Series(dtype=float)
    prompt = rows.reindex(columns=["prefix_tokens", "suffix_tokens"]).apply(pd.to_numeric)
    status = rows["status"].value_counts()
    answered, abandoned = int(status.get(c.OK, 0)), int(status.get(c.ABANDONED, 0))
    return {
        "requests": len(rows),
        "answered": answered,
        "abandoned": abandoned,
        "errors": len(rows) - answered - abandoned,
        "prompt_tokens_sent": float(prompt.sum(axis=1).mean()) if len(rows) else None,
        **{k: None if pd.isna(found.get(k)) else float(found[k]) for k in EDITOR_FIGURES},
    }


def editor_check(phase: dict[str, Any]) -> Check:
    """The editor phase ran, and its requests were answered or abandoned: none failed, and
    some were answered (a phase whose every request was left before its answer served no one)."""
    name = "editor requests answered or abandoned"
    if not phase.get("done"):
        if "error" in phase:
            return Check(name, FAIL, f"the editor phase could not start: {phase['error']}")
        return Check(name, SKIP, str(phase.get("note", "not run")))
    f, problems = phase["figures"], list(phase["typist_failures"])
    if phase["stuck_typists"]:
        problems.append(f"{phase['stuck_typists']} typist(s) stuck")
    if f["requests"] and not f["answered"]:
        problems.append("none answered before its typist moved on")
    suffix = "" if phase["suffix"]["send"] else " (PREFIX-ONLY: the server refused the suffix)"
    return Check(
        name,
        PASS if f["errors"] == 0 and not problems else FAIL,
        f"{f['requests']} sent: {f['answered']} answered, {f['abandoned']} abandoned, "
        f"{f['errors']} failed; first token p50 {f['first_token_p50_ms'] or 0:.0f} ms"
        + suffix
        + ("; " + "; ".join(problems) if problems else ""),
    )


@dataclass(frozen=True)
class Stall:
    """The longest stretch of a phase with requests in flight and none progressing."""

    phase: str
    seconds: float
    at_s: float | None  # where it began (run time); None when the phase had no requests
    progress_events: int
    reference_s: float | None = None  # one request alone, just before the phase
    bound_s: float = 5.0
    until_s: float | None = None  # the progress event (or phase end) that ended it
    engine: str = ""  # what the engine did meanwhile, to tell why


def longest_stall(
    phase: str,
    rows: pd.DataFrame,
    begin: float,
    end: float,
    max_stall_s: float = 5.0,
    reference_s: float | None = None,
) -> Stall:
    """The longest interval in [begin, end] between two progress events (an answer in full, a
    stream's first text) or a phase edge, counting only time with a request in flight: typists
    all typing is no stall. An unanswered request is in flight to the phase's end. The bound:
    ``max_stall_s``, or STALL_FACTOR lone-request times where that is longer."""
    bound = round(max(max_stall_s, STALL_FACTOR * (reference_s or 0)), 2)
    reference = None if reference_s is None else round(reference_s, 3)
    if rows.empty:
        return Stall(phase, 0.0, None, 0, reference, bound)
    started = pd.to_numeric(rows["started_s"])
    ended = started + pd.to_numeric(rows["latency_ms"]) / 1000
    ended[rows["status"] == c.UNANSWERED] = end
    first = started + pd.to_numeric(rows["first_token_ms"]) / 1000
    progress = ended.where(rows["status"] == c.OK, first).dropna()
    merged: list[list[float]] = []
    for lo, hi in sorted(zip(started, ended, strict=True)):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])

    def busy(a: float, b: float) -> float:
        return sum(max(0.0, min(b, hi) - max(a, lo)) for lo, hi in merged if lo < b and hi > a)

    inside = sorted(t for t in progress if begin <= t <= end)
    best, at, until = 0.0, None, None
    for a, b in itertools.pairwise([begin, *inside, end]):
        if (length := busy(a, b)) > best:
            best, at, until = length, round(a, 2), round(b, 2)
    return Stall(phase, round(best, 2), at, len(inside), reference, bound, until)


def stall_line(s: Stall) -> str:
    at = f" from t={s.at_s:.0f} s" if s.at_s is not None else ""
    alone = f", a request alone took {s.reference_s:.2f} s" if s.reference_s is not None else ""
    engine = f"; engine meanwhile: {s.engine}" if s.engine else ""
    return (
        f"{s.phase}: {s.seconds:.1f} s{at} ({s.progress_events} progress events; bound "
        f"{s.bound_s:g} s{alone}){engine}"
    )


def stall_check(stalls: Sequence[Stall], max_stall_s: float) -> Check:
    """No phase may go its bound with requests in flight and none progressing."""
    name = f"no stall over max({max_stall_s:g} s, {STALL_FACTOR} lone requests)"
    if not stalls:
        return Check(name, SKIP, "no phase measured")
    return Check(
        name,
        FAIL if any(s.seconds > s.bound_s for s in stalls) else PASS,
        "longest time with requests in flight and none answered or streaming: "
        + "; ".join(stall_line(s) for s in stalls),
    )


def rss_check(samples: Sequence[int] | None, tolerance: float, strict: bool) -> Check:
    """Is the server's memory flat after warm-up (``samples``: the RSS values in time order;
    None: tritonserver's process not found)? The largest of the last third against the largest
    of the first (max, not mean: a leak raises the peaks). Growth warns, or fails if
    ``strict``."""
    if samples is None or len(samples) < 6:
        return Check(
            RSS_CHECK,
            SKIP,
            "RSS not measured: tritonserver's process not found on this machine"
            if samples is None
            else f"too few samples after warm-up ({len(samples)} < 6): run longer",
        )
    third = len(samples) // 3
    first, last = max(samples[:third]), max(samples[-third:])
    growth = last / first - 1
    flat = growth <= tolerance
    return Check(
        RSS_CHECK,
        PASS if flat else FAIL if strict else WARN,
        f"{'flat' if flat else 'growing'}: last third max {last / 2**20:,.0f} MiB vs "
        f"first third max {first / 2**20:,.0f} MiB ({growth:+.1%}, tolerance "
        f"{tolerance:.0%})",
    )
