"""The one result schema: every request a load profile or the bench sends is a row of a pandas
table, appended from Locust's ``request`` events, and every report is built from that table.

A profile fires Locust's event as usual and puts the columns Locust has no field for into its
``context`` (``first_token_ms``, ``tokens``, ``outcome``...). :class:`EventLog` turns each event
into a row and writes ``events.csv``; :func:`load` reads it back, :func:`summarize` gives the
per-group figures and :func:`markdown` lays a frame out. It imports no Locust (the listener is
duck-typed), so tools that run without Locust use it too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

# The columns every row has, in order; a profile's own context keys follow them.
COLUMNS: dict[str, str] = {
    "profile": "which tool sent it: sweep, editor, soak, stress, bench",
    "system": "the server measured: openvino, torch, llama.cpp, cache-off...",
    "window": "the measured window or phase it belongs to (a length, a client count, a phase)",
    "kind": "Locust's request_type: the protocol (http, grpc, stream, openai)",
    "name": "Locust's request name: what was asked (a length, one-line, drill...)",
    "started_s": "seconds since the log started when the request was sent",
    "latency_ms": "Locust's response_time: send to last byte, or to abandonment",
    "first_token_ms": "send to the first generated piece; empty for unary requests",
    "tokens": "completion tokens received",
    "outcome": "ok, error, abandoned (the client left on purpose) or shed (a clear refusal)",
    "error": "the error's text; empty when none",
}
OUTCOMES = ("ok", "error", "abandoned", "shed")
PERCENTILES = (0.5, 0.95, 0.99)


class EventLog:
    """Rows from Locust's ``request`` events; thread- and greenlet-safe; ``constant`` columns
    (``profile``, ``system``...) are stamped on every row until :meth:`stamp` changes them."""

    def __init__(self, **constant: Any) -> None:
        self._rows: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._constant = dict(constant)
        self._t0 = time.perf_counter()
        self._t0_wall = time.time()

    def stamp(self, **constant: Any) -> None:
        """Change the columns stamped on the rows from now on (a new window, a new system)."""
        with self._lock:
            self._constant.update(constant)

    def attach(self, environment: Any) -> EventLog:
        """Listen to a Locust environment's ``request`` event; returns self."""
        environment.events.request.add_listener(self.on_request)
        return self

    def on_request(
        self,
        request_type: str,
        name: str,
        response_time: float,
        response_length: int = 0,
        exception: BaseException | None = None,
        context: dict[str, Any] | None = None,
        start_time: float | None = None,
        **_: Any,
    ) -> None:
        """Locust's ``request`` listener signature; the context's keys become columns."""
        extra = dict(context or {})
        outcome = extra.pop("outcome", None) or ("error" if exception else "ok")
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome {outcome!r}: one of {', '.join(OUTCOMES)}")
        started = (start_time - self._t0_wall) if start_time else None
        self.record(
            kind=request_type,
            name=name,
            latency_ms=float(response_time),
            outcome=outcome,
            error="" if exception is None else str(exception) or type(exception).__name__,
            started_s=started,
            **extra,
        )

    def record(self, **row: Any) -> None:
        """Append a row directly (tools that measure without Locust, such as bare engines)."""
        with self._lock:
            full = {**self._constant, **row}
            if full.get("started_s") is None:
                elapsed_ms = row.get("latency_ms") or 0.0  # None: never answered
                full["started_s"] = time.perf_counter() - self._t0 - elapsed_ms / 1e3
            self._rows.append(full)

    def __len__(self) -> int:
        return len(self._rows)

    def frame(self) -> pd.DataFrame:
        """Every row so far, the :data:`COLUMNS` first (missing ones empty)."""
        with self._lock:
            rows = list(self._rows)
        return _ordered(pd.DataFrame(rows))

    def save(self, path: Path) -> Path:
        """Write ``events.csv`` (the table a report is rebuilt from)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.frame().to_csv(path, index=False)
        return path


def _ordered(frame: pd.DataFrame) -> pd.DataFrame:
    for column in COLUMNS:
        if column not in frame:
            frame[column] = pd.NA
    extra = [c for c in frame.columns if c not in COLUMNS]
    return frame[[*COLUMNS, *extra]]


def load(path: Path) -> pd.DataFrame:
    """An ``events.csv`` back as the table it was written from."""
    frame = pd.read_csv(path, keep_default_na=False, na_values=[""])
    frame["error"] = frame["error"].fillna("")
    return _ordered(frame)


def summarize(frame: pd.DataFrame, by: Sequence[str]) -> pd.DataFrame:
    """Per group: requests, failures (outcome ``error``), abandoned, shed, RPS over the group's
    span, latency and first-token p50/p95/p99 of the ``ok`` rows, and tokens/s."""
    rows = []
    for key, group in frame.groupby(list(by), sort=False, dropna=False):
        ok = group[group["outcome"] == "ok"]
        span = _span_s(group)
        row = dict(zip(by, key if isinstance(key, tuple) else (key,), strict=True))
        row.update(
            requests=len(group),
            failures=int((group["outcome"] == "error").sum()),
            abandoned=int((group["outcome"] == "abandoned").sum()),
            shed=int((group["outcome"] == "shed").sum()),
            rps=len(ok) / span if span else None,
            tokens_per_s=float(pd.to_numeric(group["tokens"]).sum()) / span if span else None,
        )
        for column, label in (("latency_ms", "latency"), ("first_token_ms", "first_token")):
            values = pd.to_numeric(ok[column], errors="coerce").dropna()
            for q in PERCENTILES:
                row[f"{label}_p{round(q * 100)}_ms"] = (
                    float(values.quantile(q)) if len(values) else None
                )
        rows.append(row)
    return pd.DataFrame(rows)


def _span_s(group: pd.DataFrame) -> float:
    """From the first send to the last answer, in seconds."""
    started = pd.to_numeric(group["started_s"], errors="coerce")
    ended = started + pd.to_numeric(group["latency_ms"], errors="coerce") / 1e3
    return float(ended.max() - started.min()) if len(group) and started.notna().any() else 0.0


def markdown(frame: pd.DataFrame, columns: Iterable[str] | None = None, digits: int = 1) -> str:
    """A Markdown table of ``frame`` (``columns`` only, when given); missing figures as "-"."""
    chosen = frame[list(columns)] if columns is not None else frame
    return chosen.to_markdown(index=False, floatfmt=f",.{digits}f", missingval="-")
