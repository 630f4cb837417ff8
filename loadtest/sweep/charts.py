"""The sweep report's charts (PNG): throughput and latency against output length, stage shares
and batching, and each length's time series, from the per-length rows and the event table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from contract.tensors import ENSEMBLE_MODEL, MODEL_STAGE, STAGES
from reporting.charts import COLORS, MARKERS, latency_panel, plt, save_figure, shade_phases

PRE, POST = STAGES[0], STAGES[-1]
RPS_LATENCY_CHART, STAGE_SHARES_CHART = "rps_latency.png", "stage_shares.png"
PHASE_COLORS = {"warm-up": "#dddddd", "measured window": "#c6dbef", "streaming": "#fdd0a2"}


def timeseries_chart(length: int) -> str:
    return f"timeseries_len_{length:04d}.png"


def draw_charts(
    out: Path, run: dict[str, Any], frame: pd.DataFrame, table: pd.DataFrame
) -> list[Path]:
    """Every chart of the run into ``out``."""
    info = run["run"]
    title = (
        f"{(info['model'].get('checkpoint') or {}).get('name') or 'model'} on "
        f"{info['machine']['cores']} CPU cores, {info['settings']['users']} "
        f"{info['settings']['protocol'].upper()} users"
    )
    table = table.apply(pd.to_numeric, errors="coerce")
    paths = [
        chart_rps_latency(table, out / RPS_LATENCY_CHART, title),
        chart_shares(table.fillna(0), out / STAGE_SHARES_CHART, title),
    ]
    for (_, row), window in zip(table.iterrows(), run["windows"], strict=True):
        length = int(row["output_len"])
        paths.append(
            chart_timeseries(
                row,
                window,
                frame,
                out / timeseries_chart(length),
                f"Output length {length}: {title}",
            )
        )
    return paths


def _length_axis(ax: Any, lengths: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.set_xlabel("output length (tokens)")
    ax.grid(True, which="major", alpha=0.3)


def chart_rps_latency(table: pd.DataFrame, path: Path, title: str) -> Path:
    lengths = [int(n) for n in table["output_len"]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    tokens = left.twinx()
    for ax, column, style, color, label in (
        (left, "rps", "o-", "#1f77b4", "requests/s"),
        (tokens, "tokens_per_s", "s--", "#9467bd", "generated tokens/s"),
    ):
        values = table[column].fillna(0)
        ax.plot(lengths, values, style, color=color, lw=2, label=label)
        ax.set_ylabel(label, color=color)
        ax.set_ylim(0, max(values.max(), 0) * 1.35 or 1)
    for x, y in zip(lengths, table["rps"].fillna(0), strict=True):
        left.annotate(
            f"{y:.2f}",
            (x, y),
            textcoords="offset points",
            xytext=(0, 7),
            ha="center",
            fontsize=9,
            color="#1f77b4",
        )
    _length_axis(left, lengths)
    left.set_title("Throughput")
    left.legend(handles=left.get_lines() + tokens.get_lines(), loc="upper right", fontsize=9)
    for key in ("mean", "p50", "p90", "p95", "p99"):
        right.plot(
            lengths,
            table[f"latency_{key}_ms"],
            "-",
            marker=MARKERS[key],
            label=key,
            color=COLORS[key],
            lw=2 if key in ("mean", "p50") else 1.3,
        )
    right.set(
        yscale="log",
        ylabel="response time (ms, log scale)",
        title="Latency (client side, the event table)",
    )
    right.legend(fontsize=9)
    _length_axis(right, lengths)
    return save_figure(fig, path, title)


def _bars(ax: Any, frame: pd.DataFrame, colors: list[str], fmt: str, title: str, ylabel: str):
    """One group of bars per output length (the frame's index), labelled with their heights."""
    frame.plot.bar(ax=ax, color=colors, width=0.8, rot=0, legend=len(frame.columns) > 1)
    for bars in ax.containers:
        ax.bar_label(bars, [fmt.format(h) for h in bars.datavalues], fontsize=7, padding=2)
    ax.set(xlabel="output length (tokens)", ylabel=ylabel, title=title)
    ax.grid(True, axis="y", alpha=0.3)
    ax.margins(y=0.15)


def chart_shares(table: pd.DataFrame, path: Path, title: str) -> Path:
    """Stage shares, queueing and batching per output length: three panels, because the stage
    shares are a few tenths of a percent where queueing can be tens of percent."""
    t = table.set_index(table["output_len"].astype(int).rename(None))
    fig, (shares, queue, batch) = plt.subplots(
        1, 3, figsize=(15, 4.6), gridspec_kw={"width_ratios": [1.2, 0.8, 1.4]}
    )
    percent = 100 * t[[f"share_{PRE}", f"share_{POST}"]].set_axis(
        ["preprocessing", "postprocessing"], axis=1
    )
    _bars(
        shares,
        percent,
        ["#1f77b4", "#2ca02c"],
        "{:.2f}%",
        "Stage compute vs the model stage",
        "% of the model stage's compute time",
    )
    _bars(
        queue,
        100 * t[["queue_share"]].set_axis(["queue"], axis=1),
        ["#d62728"],
        "{:.1f}%",
        "Time spent queued",
        "% of the request time",
    )
    batches = t[[f"batch_{PRE}", f"batch_{MODEL_STAGE}", f"batch_{POST}", "engine_batch"]]
    batches.columns = [
        "preprocessing",
        "gptj (Triton batcher)",
        "postprocessing",
        "engine running batch",
    ]
    _bars(
        batch,
        batches,
        ["#1f77b4", "#7f7f7f", "#2ca02c", "#ff7f0e"],
        "{:.1f}",
        "Batching (count / exec_count; engine rows / steps)",
        "mean batch size",
    )
    return save_figure(fig, path, title)


def chart_timeseries(
    row: pd.Series, window: dict[str, Any], frame: pd.DataFrame, path: Path, title: str
) -> Path:
    """Completions per second and response times of the unary requests over the length's run,
    the warm-up, the measured window and the streaming phase shaded. Long requests complete in
    waves, so a rolling rate and rolling percentiles over a few request times show the level."""
    rows = frame[(frame["window"] == row["output_len"]) & (frame["name"] == ENSEMBLE_MODEL)]
    latency = pd.to_numeric(rows["latency_ms"]).to_numpy(dtype=float)
    origin = window["length_start_s"]  # seconds since the users of this length started
    times = pd.to_numeric(rows["started_s"]).to_numpy(dtype=float) + latency / 1000 - origin
    failed = (rows["outcome"] != "ok").to_numpy()
    end = float(np.ceil(times.max())) + 1 if len(times) else 1.0
    width = float(np.clip(3 * np.median(latency) / 1000, 3.0, 30.0)) if len(latency) else 3.0
    grid = np.arange(0.0, end + 0.01, 0.5)
    counts = np.bincount(np.floor(times).astype(int), minlength=int(end))
    start, stop = window["window_start_s"] - origin, window["window_end_s"] - origin
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.4), sharex=True)
    phases = [("warm-up", 0, start), ("measured window", start, stop)]
    if row["stream_requests"]:
        phases.append(("streaming", stop, end - 1))
    shade_phases((top, bottom), phases, PHASE_COLORS, label_axis=top)
    top.bar(
        np.arange(len(counts)) + 0.5,
        counts,
        width=1.0,
        color="#9ecae1",
        label="completed in each second",
    )
    # over the seconds elapsed so far at the start, then over the rolling window
    rate = [((times > t - width) & (times <= t)).sum() / min(width, max(t, 0.5)) for t in grid]
    top.plot(grid, rate, color="#1f77b4", lw=2, label=f"rolling rate ({width:.0f} s)")
    mean_rps = 0 if pd.isna(row["rps"]) else row["rps"]
    top.axhline(mean_rps, color="#08306b", ls="--", lw=1, label=f"window mean {mean_rps:.2f}/s")
    if failed.any():
        fails = np.bincount(np.floor(times[failed]).astype(int), minlength=len(counts))
        top.step(np.arange(len(fails)), fails, where="post", color="#d62728", label="failures/s")
    top.set_ylabel("requests/s")
    top.grid(True, alpha=0.3)
    top.legend(loc="upper right", fontsize=8)
    labels = (
        "each request (at completion)",
        "response time (ms)",
        "seconds since the users started",
    )
    latency_panel(bottom, times, latency, grid, width, labels)
    return save_figure(fig, path, title, dpi=100)
