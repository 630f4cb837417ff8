"""The report's charts (matplotlib, PNG files): throughput and latency against output length,
stage shares and batching, and each length's time series, from the per-length rows and the
event table (:mod:`loadtest.sweep.report`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from contract.tensors import ENSEMBLE_MODEL, MODEL_STAGE, POSTPROCESSING_MODEL, PREPROCESSING_MODEL
from reporting.charts import COLORS, MARKERS, latency_panel, plt, save_figure, shade_phases

PRE, POST = PREPROCESSING_MODEL, POSTPROCESSING_MODEL
RPS_LATENCY_CHART, STAGE_SHARES_CHART = "rps_latency.png", "stage_shares.png"
PHASE_COLORS = {"warm-up": "#dddddd", "measured window": "#c6dbef", "streaming": "#fdd0a2"}


def timeseries_chart(length: int) -> str:
    return f"timeseries_len_{length:04d}.png"


def _values(table: pd.DataFrame, column: str) -> list[float]:
    return pd.to_numeric(table[column], errors="coerce").fillna(0).tolist()


def draw_charts(
    out: Path, run: dict[str, Any], frame: pd.DataFrame, table: pd.DataFrame
) -> list[Path]:
    """Every chart of the run into ``out``."""
    info = run["run"]
    checkpoint = info["model"].get("checkpoint") or {}
    title = (
        f"{checkpoint.get('name') or 'model'} on {info['machine']['cores']} CPU cores, "
        f"{info['settings']['users']} {info['settings']['protocol'].upper()} users"
    )
    paths = [chart_rps_latency(table, out / RPS_LATENCY_CHART, title),
             chart_shares(table, out / STAGE_SHARES_CHART, title)]  # fmt: skip
    for (_, row), window in zip(table.iterrows(), run["windows"], strict=True):
        length = row["output_len"]
        paths.append(chart_timeseries(row, window, frame, out / timeseries_chart(length),
                                      f"Output length {length}: {title}"))  # fmt: skip
    return paths


def _length_axis(ax: Any, lengths: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.set_xlabel("output length (tokens)")
    ax.grid(True, which="major", alpha=0.3)


def chart_rps_latency(table: pd.DataFrame, path: Path, title: str) -> Path:
    lengths = [int(n) for n in table["output_len"]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    rps, tokens_per_s = _values(table, "rps"), _values(table, "tokens_per_s")
    left.plot(lengths, rps, "o-", color="#1f77b4", lw=2, label="requests/s")
    for x, y in zip(lengths, rps, strict=True):
        left.annotate(f"{y:.2f}", (x, y), textcoords="offset points", xytext=(0, 7),
                      ha="center", fontsize=9, color="#1f77b4")  # fmt: skip
    left.set_ylabel("requests/s", color="#1f77b4")
    left.set_ylim(0, max(rps or [1]) * 1.35 or 1)
    _length_axis(left, lengths)
    tokens = left.twinx()
    tokens.plot(lengths, tokens_per_s, "s--", color="#9467bd", label="generated tokens/s")
    tokens.set_ylabel("generated tokens/s", color="#9467bd")
    tokens.set_ylim(0, max(tokens_per_s or [1]) * 1.35 or 1)
    left.set_title("Throughput")
    handles = left.get_legend_handles_labels()[0] + tokens.get_legend_handles_labels()[0]
    left.legend(handles, ["requests/s", "generated tokens/s"], loc="upper right", fontsize=9)
    for key in ("mean", "p50", "p90", "p95", "p99"):
        values = pd.to_numeric(table[f"latency_{key}_ms"], errors="coerce")
        right.plot(lengths, values, "-", marker=MARKERS[key], color=COLORS[key], label=key,
                   lw=2 if key in ("mean", "p50") else 1.3)  # fmt: skip
    right.set_yscale("log")
    right.set_ylabel("response time (ms, log scale)")
    right.set_title("Latency (client side, the event table)")
    right.legend(fontsize=9)
    _length_axis(right, lengths)
    return save_figure(fig, path, title)


def _bars(ax: Any, labels: list[str], series: list[tuple[str, list[float], str]], fmt: str) -> None:
    x, width = np.arange(len(labels)), 0.8 / len(series)
    for i, (label, heights, color) in enumerate(series):
        offset = (i - (len(series) - 1) / 2) * width
        bars = ax.bar(x + offset, heights, width, label=label, color=color)
        ax.bar_label(bars, [fmt.format(h) for h in heights], fontsize=7, padding=2)
    ax.set_xticks(x, labels)
    ax.set_xlabel("output length (tokens)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.margins(y=0.15)


def chart_shares(table: pd.DataFrame, path: Path, title: str) -> Path:
    """Stage shares, queueing and batching per output length: three panels, because the
    stage shares are a few tenths of a percent where queueing can be tens of percent."""
    labels = [str(n) for n in table["output_len"]]
    fig, (shares, queue, batch) = plt.subplots(
        1, 3, figsize=(15, 4.6), gridspec_kw={"width_ratios": [1.2, 0.8, 1.4]}
    )
    percent = {k: [100 * v for v in _values(table, k)]
               for k in (f"share_{PRE}", f"share_{POST}", "queue_share")}  # fmt: skip
    stages = [("preprocessing", percent[f"share_{PRE}"], "#1f77b4"),
              ("postprocessing", percent[f"share_{POST}"], "#2ca02c")]  # fmt: skip
    _bars(shares, labels, stages, "{:.2f}%")
    shares.set_ylabel("% of the model stage's compute time")
    shares.set_title("Stage compute vs the model stage")
    shares.legend(fontsize=9)
    _bars(queue, labels, [("queue", percent["queue_share"], "#d62728")], "{:.1f}%")
    queue.set_ylabel("% of the request time")
    queue.set_title("Time spent queued")
    _bars(batch, labels, [
        ("preprocessing", _values(table, f"batch_{PRE}"), "#1f77b4"),
        ("gptj (Triton batcher)", _values(table, f"batch_{MODEL_STAGE}"), "#7f7f7f"),
        ("postprocessing", _values(table, f"batch_{POST}"), "#2ca02c"),
        ("engine running batch", _values(table, "engine_batch"), "#ff7f0e"),
    ], "{:.1f}")  # fmt: skip
    batch.set_ylabel("mean batch size")
    batch.set_title("Batching (count / exec_count; engine rows / steps)")
    batch.legend(fontsize=8)
    return save_figure(fig, path, title)


def chart_timeseries(
    row: pd.Series, window: dict[str, Any], frame: pd.DataFrame, path: Path, title: str
) -> Path:
    """Completions per second and response times of the unary requests over the length's
    run, with the warm-up, the measured window and the streaming phase shaded. Long requests
    complete in waves, so besides the per-second counts and per-request dots, a rolling rate
    and rolling percentiles over a few request times show the level at a glance."""
    rows = frame[(frame["window"] == row["output_len"]) & (frame["name"] == ENSEMBLE_MODEL)]
    latency = pd.to_numeric(rows["latency_ms"]).to_numpy(dtype=float)
    origin = window["length_start_s"]  # seconds since the users of this length started
    times = pd.to_numeric(rows["started_s"]).to_numpy(dtype=float) + latency / 1000 - origin
    failed = (rows["outcome"] != "ok").to_numpy()
    end = float(np.ceil(times.max())) + 1 if len(times) else 1.0
    typical = float(np.median(latency)) / 1000 if len(latency) else 1.0
    width = float(np.clip(3 * typical, 3.0, 30.0))  # rolling window: a few request times
    grid = np.arange(0.0, end + 0.01, 0.5)
    counts = np.bincount(np.floor(times).astype(int), minlength=int(end))
    start, stop = window["window_start_s"] - origin, window["window_end_s"] - origin
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.4), sharex=True)
    phases = [("warm-up", 0, start), ("measured window", start, stop)]
    if row["stream_requests"]:
        phases.append(("streaming", stop, end - 1))
    shade_phases((top, bottom), phases, PHASE_COLORS, label_axis=top)
    top.bar(np.arange(len(counts)) + 0.5, counts, width=1.0, color="#9ecae1",
            label="completed in each second")  # fmt: skip
    completed = [int(((times > t - width) & (times <= t)).sum()) for t in grid]
    # over the seconds elapsed so far at the start, then over the rolling window
    rate = [n / min(width, max(t, 0.5)) for n, t in zip(completed, grid, strict=True)]
    top.plot(grid, rate, color="#1f77b4", lw=2, label=f"rolling rate ({width:.0f} s)")
    mean_rps = row["rps"] if not pd.isna(row["rps"]) else 0
    top.axhline(mean_rps, color="#08306b", ls="--", lw=1, label=f"window mean {mean_rps:.2f}/s")
    if failed.any():
        fails = np.bincount(np.floor(times[failed]).astype(int), minlength=len(counts))
        top.step(np.arange(len(fails)), fails, where="post", color="#d62728", label="failures/s")
    top.set_ylabel("requests/s")
    top.grid(True, alpha=0.3)
    top.legend(loc="upper right", fontsize=8)
    labels = ("each request (at completion)", "response time (ms)",
              "seconds since the users started")  # fmt: skip
    latency_panel(bottom, times, latency, grid, width, labels)
    return save_figure(fig, path, title, dpi=100)
