"""The one result schema: every request a load profile or the bench sends is a row of a pandas
table, appended from Locust's ``request`` events (the columns Locust has no field for come in
its ``context``), written as ``events.csv``, and every report is built from that table. It
imports no Locust (the listener is duck-typed), so tools that run without Locust use it too."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

# The columns every row has, in order (docs/tooling.md, "The ledger's columns"); a profile's own
# context keys follow them.
COLUMNS = (
    "profile",
    "system",
    "window",
    "kind",
    "name",
    "started_s",
    "latency_ms",
    "first_token_ms",
    "tokens",
    "outcome",
    "error",
)
OUTCOMES = ("ok", "error", "abandoned", "shed")
PERCENTILES = (0.5, 0.95, 0.99)


class EventLog:
    """Rows from Locust's ``request`` events; thread- and greenlet-safe; ``constant`` columns
    (``profile``, ``system``...) are stamped on every row until :meth:`stamp` changes them."""

    def __init__(self, **constant: Any) -> None:
        self._rows: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._constant = dict(constant)
        self._t0, self._t0_wall = time.perf_counter(), time.time()

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
        self.record(
            kind=request_type,
            name=name,
            latency_ms=float(response_time),
            outcome=outcome,
            error="" if exception is None else str(exception) or type(exception).__name__,
            started_s=(start_time - self._t0_wall) if start_time else None,
            **extra,
        )

    def record(self, **row: Any) -> None:
        """Append a row directly (tools that measure without Locust, such as bare engines)."""
        with self._lock:
            full = {**self._constant, **row}
            if full.get("started_s") is None:  # sent latency_ms before now (None: no answer)
                full["started_s"] = (
                    time.perf_counter() - self._t0 - (row.get("latency_ms") or 0) / 1e3
                )
            self._rows.append(full)

    def __len__(self) -> int:
        return len(self._rows)

    def frame(self) -> pd.DataFrame:
        """Every row so far, the :data:`COLUMNS` first (missing ones empty)."""
        with self._lock:
            return _ordered(pd.DataFrame(list(self._rows)))

    def save(self, path: Path) -> Path:
        """Write ``events.csv`` (the table a report is rebuilt from)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.frame().to_csv(path, index=False)
        return path


def _ordered(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.assign(**{column: pd.NA for column in COLUMNS if column not in frame})
    return frame[[*COLUMNS, *(c for c in frame.columns if c not in COLUMNS)]]


def load(path: Path) -> pd.DataFrame:
    """An ``events.csv`` back as the table it was written from."""
    frame = pd.read_csv(path, keep_default_na=False, na_values=[""])
    return _ordered(frame.assign(error=frame["error"].fillna("")))


def summarize(frame: pd.DataFrame, by: Sequence[str]) -> pd.DataFrame:
    """Per group: requests, failures (outcome ``error``), abandoned, shed, RPS over the group's
    span (first send to last answer), latency and first-token p50/p95/p99 of the ``ok`` rows,
    and tokens/s."""
    rows = []
    for key, group in frame.groupby(list(by), sort=False, dropna=False):
        ok, outcomes = group[group["outcome"] == "ok"], group["outcome"].value_counts()
        started = pd.to_numeric(group["started_s"], errors="coerce")
        ended = started + pd.to_numeric(group["latency_ms"], errors="coerce") / 1e3
        span = float(ended.max() - started.min()) if started.notna().any() else 0.0
        tokens = float(pd.to_numeric(group["tokens"]).sum())
        row = dict(zip(by, key if isinstance(key, tuple) else (key,), strict=True))
        row["requests"] = len(group)
        row |= {
            name: int(outcomes.get(outcome, 0))
            for name, outcome in (
                ("failures", "error"),
                ("abandoned", "abandoned"),
                ("shed", "shed"),
            )
        }
        row |= {
            "rps": len(ok) / span if span else None,
            "tokens_per_s": tokens / span if span else None,
        }
        for column, label in (("latency_ms", "latency"), ("first_token_ms", "first_token")):
            values = pd.to_numeric(ok[column], errors="coerce").dropna()
            for q in PERCENTILES:
                value = float(values.quantile(q)) if len(values) else None
                row[f"{label}_p{round(q * 100)}_ms"] = value
        rows.append(row)
    return pd.DataFrame(rows)


def markdown(frame: pd.DataFrame, columns: Iterable[str] | None = None, digits: int = 1) -> str:
    """A Markdown table of ``frame`` (``columns`` only, when given); missing figures as "-"."""
    chosen = frame[list(columns)] if columns is not None else frame
    return chosen.to_markdown(index=False, floatfmt=f",.{digits}f", missingval="-")
