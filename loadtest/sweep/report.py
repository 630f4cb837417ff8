"""A run folder's report, from two files: ``events.csv`` (every request, the one result
schema of :mod:`reporting.events`) and ``run.json`` (the run's settings, machine and model,
and each length's window record from :mod:`loadtest.sweep.driver`: its times, Triton's
counter increases and their source). :func:`length_row` joins them into one row per output
length; :mod:`loadtest.sweep.charts` and :mod:`loadtest.sweep.markdown` draw from those rows.

A report can be redrawn without rerunning the load: ``python -m loadtest.sweep.report <run>``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from contract.tensors import ENSEMBLE_MODEL
from loadtest.metrics import Deltas, window_figures
from loadtest.sweep import ITL_NAME, STREAM_NAME, markdown
from loadtest.sweep.charts import draw_charts
from reporting import events

EVENTS, RUN = "events.csv", "run.json"


def _numbers(frame: pd.DataFrame, column: str) -> pd.Series:
    return pd.to_numeric(frame[column], errors="coerce").dropna()


def length_row(frame: pd.DataFrame, window: dict[str, Any]) -> dict[str, Any]:
    """One output length's figures: the client's from the event table's rows of its measured
    window (``phase`` ``measure``) and streaming phase, Triton's from the window's increases."""
    frame = frame.assign(**{c: pd.NA for c in ("window", "phase") if c not in frame})
    rows = frame[frame["window"] == window["output_len"]]
    measured = rows[(rows["phase"] == "measure") & (rows["name"] == ENSEMBLE_MODEL)]
    summary = events.summarize(measured, by=["window"])
    first = summary.iloc[0] if len(summary) else pd.Series(dtype=object)
    ok = _numbers(measured[measured["outcome"] == "ok"], "latency_ms")
    seconds = window["client_window_s"]
    failed = measured[measured["outcome"] != "ok"]
    stream = rows[rows["phase"] == "stream"]
    ttft = _numbers(stream[stream["name"] == STREAM_NAME], "first_token_ms")
    gaps = _numbers(stream[stream["name"] == ITL_NAME], "latency_ms")
    row = {
        **{key: window[key] for key in ("output_len", "source", "client_window_s", "drained")},
        "requests": len(measured),
        "failures": len(failed),
        "rps": len(measured) / seconds if seconds > 0 else None,
        "errors": failed["error"].value_counts().to_dict(),
        "latency_mean_ms": ok.mean() if len(ok) else None,
        "latency_p90_ms": ok.quantile(0.9) if len(ok) else None,
        "latency_max_ms": ok.max() if len(ok) else None,
        **{f"latency_p{q}_ms": first.get(f"latency_p{q}_ms") for q in (50, 95, 99)},
        "stream_requests": int((stream["name"] == STREAM_NAME).sum()),
        "ttft_mean_ms": ttft.mean() if len(ttft) else None,
        "ttft_p95_ms": ttft.quantile(0.95) if len(ttft) else None,
        "itl_mean_ms": gaps.mean() if len(gaps) else None,
        "itl_p95_ms": gaps.quantile(0.95) if len(gaps) else None,
        "gaps": len(gaps),
    }
    row |= {f"busy_{stage}": share for stage, share in window["busy_share"].items()}
    return row | window_figures(Deltas.from_dict(window["deltas"], window["window_s"]))


def load_run(out: Path) -> tuple[dict[str, Any], pd.DataFrame, pd.DataFrame]:
    """A run folder's run.json, its event table and one row per output length."""
    run = json.loads((out / RUN).read_text())
    frame = events.load(out / EVENTS)
    table = pd.DataFrame([length_row(frame, window) for window in run["windows"]])
    return run, frame, table


def write_report(out: Path) -> list[Path]:
    """The charts and report.md into ``out``, from its events.csv and run.json."""
    run, frame, table = load_run(Path(out))
    report = Path(out) / "report.md"
    report.write_text(markdown.render(run, table))
    return [*draw_charts(Path(out), run, frame, table), report]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Redraw a load test report from its folder.")
    parser.add_argument("run", type=Path, help="loadtest/results/<run>")
    for path in write_report(parser.parse_args(argv).run):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
