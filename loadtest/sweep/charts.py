"""The report's charts (matplotlib, PNG files): throughput and latency against output length,
stage shares and batching, and each length's time series. They read typed results only."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from contract.tensors import ENSEMBLE_MODEL, MODEL_STAGE, POSTPROCESSING_MODEL, PREPROCESSING_MODEL
from loadtest.results import (
    PERCENTILES,
    RPS_LATENCY_CHART,
    STAGE_SHARES_CHART,
    LengthResult,
    RequestRecord,
    RunResult,
    length_file,
    read_request_log,
    timeseries_chart,
)
from reporting.charts import COLORS, MARKERS, latency_panel, plt, save_figure

PRE, POST = PREPROCESSING_MODEL, POSTPROCESSING_MODEL


def draw_charts(out: Path, result: RunResult) -> list[Path]:
    """Every chart of the run into ``out``, from the results and the request logs there."""
    run = result.run
    checkpoint = run.model.checkpoint
    title = (
        f"{checkpoint.name if checkpoint else 'model'} on {run.machine.cores} CPU cores, "
        f"{run.settings.users} {run.settings.protocol.upper()} users"
    )
    paths = [
        chart_rps_latency(result.rows, out / RPS_LATENCY_CHART, title),
        chart_shares(result.rows, out / STAGE_SHARES_CHART, title),
    ]
    for row in result.rows:
        log = out / length_file(row.output_len, "_requests.csv")
        records = read_request_log(log) if log.exists() else []
        paths.append(
            chart_timeseries(
                row,
                [r for r in records if r.name == ENSEMBLE_MODEL],
                out / timeseries_chart(row.output_len),
                f"Output length {row.output_len}: {title}",
            )
        )
    return paths


def _length_axis(ax: Any, lengths: Sequence[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths)
    ax.set_xticklabels([str(n) for n in lengths])
    ax.set_xlabel("output length (tokens)")
    ax.grid(True, which="major", alpha=0.3)


def chart_rps_latency(rows: Sequence[LengthResult], path: Path, title: str) -> Path:
    lengths = [r.output_len for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    rps = [r.rps or 0 for r in rows]
    left.plot(lengths, rps, "o-", color="#1f77b4", lw=2, label="requests/s")
    for x, y in zip(lengths, rps, strict=True):
        left.annotate(
            f"{y:.2f}",
            (x, y),
            textcoords="offset points",
            xytext=(0, 7),
            ha="center",
            fontsize=9,
            color="#1f77b4",
        )
    left.set_ylabel("requests/s", color="#1f77b4")
    left.set_ylim(0, max(rps or [1]) * 1.35)
    _length_axis(left, lengths)
    tokens = left.twinx()
    tokens_per_s = [r.tokens_per_s or 0 for r in rows]
    tokens.plot(lengths, tokens_per_s, "s--", color="#9467bd", label="generated tokens/s")
    tokens.set_ylabel("generated tokens/s", color="#9467bd")
    tokens.set_ylim(0, max(tokens_per_s or [1]) * 1.35)
    left.set_title("Throughput")
    handles = left.get_legend_handles_labels()[0] + tokens.get_legend_handles_labels()[0]
    left.legend(handles, ["requests/s", "generated tokens/s"], loc="upper right", fontsize=9)

    for key in ("mean", *PERCENTILES):
        values = [getattr(r.latency_ms, key) for r in rows]
        right.plot(
            lengths,
            [np.nan if v is None else v for v in values],
            "-",
            marker=MARKERS[key],
            color=COLORS[key],
            label=key,
            lw=2 if key in ("mean", "p50") else 1.3,
        )
    right.set_yscale("log")
    right.set_ylabel("response time (ms, log scale)")
    right.set_title("Latency (client side, Locust)")
    right.legend(fontsize=9)
    _length_axis(right, lengths)
    return save_figure(fig, path, title)


def _bars(
    ax: Any, x: np.ndarray, series: Sequence[tuple[str, list[float | None], str]], fmt: str
) -> None:
    width = 0.8 / len(series)
    for i, (label, values, color) in enumerate(series):
        heights = [v or 0 for v in values]
        offset = (i - (len(series) - 1) / 2) * width
        bars = ax.bar(x + offset, heights, width, label=label, color=color)
        ax.bar_label(bars, [fmt.format(h) for h in heights], fontsize=7, padding=2)
    ax.set_xlabel("output length (tokens)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.margins(y=0.15)


def chart_shares(rows: Sequence[LengthResult], path: Path, title: str) -> Path:
    """Stage shares, queueing and batching per output length: three panels, because the
    stage shares are a few tenths of a percent where queueing can be tens of percent."""
    lengths = [str(r.output_len) for r in rows]
    x = np.arange(len(rows))
    fig, (shares, queue, batch) = plt.subplots(
        1, 3, figsize=(15, 4.6), gridspec_kw={"width_ratios": [1.2, 0.8, 1.4]}
    )
    _bars(
        shares,
        x,
        [
            ("preprocessing", [100 * (r.stage_share[PRE] or 0) for r in rows], "#1f77b4"),
            ("postprocessing", [100 * (r.stage_share[POST] or 0) for r in rows], "#2ca02c"),
        ],
        "{:.2f}%",
    )
    shares.set_xticks(x, lengths)
    shares.set_ylabel("% of the model stage's compute time")
    shares.set_title("Stage compute vs the model stage")
    shares.legend(fontsize=9)

    _bars(queue, x, [("queue", [100 * (r.queue_share or 0) for r in rows], "#d62728")], "{:.1f}%")
    queue.set_xticks(x, lengths)
    queue.set_ylabel("% of the request time")
    queue.set_title("Time spent queued")

    _bars(
        batch,
        x,
        [
            ("preprocessing", [r.batch_size[PRE] for r in rows], "#1f77b4"),
            ("gptj (Triton batcher)", [r.batch_size[MODEL_STAGE] for r in rows], "#7f7f7f"),
            ("postprocessing", [r.batch_size[POST] for r in rows], "#2ca02c"),
            ("engine running batch", [r.engine_batch_size for r in rows], "#ff7f0e"),
        ],
        "{:.1f}",
    )
    batch.set_xticks(x, lengths)
    batch.set_ylabel("mean batch size")
    batch.set_title("Batching (count / exec_count; engine rows / steps)")
    batch.legend(fontsize=8)
    return save_figure(fig, path, title)


def chart_timeseries(
    row: LengthResult, records: Sequence[RequestRecord], path: Path, title: str
) -> Path:
    """Completions per second and response times over the run, with the warm-up, the measured
    window and the streaming phase marked. Long requests complete in waves, so besides the raw
    per-second counts and per-request dots, a rolling rate and rolling percentiles over a few
    request times show the level at a glance."""
    times = np.array([r.t_s for r in records], dtype=float)
    latency = np.array([r.response_time_ms for r in records], dtype=float)
    failed = np.array([r.failed for r in records], dtype=bool)
    end = float(np.ceil(times.max())) + 1 if len(times) else 1.0
    typical = float(np.median(latency)) / 1000 if len(latency) else 1.0
    width = float(np.clip(3 * typical, 3.0, 30.0))  # rolling window: a few request times
    grid = np.arange(0.0, end + 0.01, 0.5)
    counts = np.bincount(np.floor(times).astype(int), minlength=int(end))

    start, stop = row.timeline.window_start_s, row.timeline.window_end_s
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.4), sharex=True)
    for ax in (top, bottom):
        ax.axvspan(0, start, color="#bbbbbb", alpha=0.35, lw=0)
        ax.axvspan(start, stop, color="#9ecae1", alpha=0.25, lw=0)
        if stop < end - 1:
            ax.axvspan(stop, end - 1, color="#fdd0a2", alpha=0.35, lw=0)
        ax.grid(True, alpha=0.3)
    phases = [(start / 2, "warm-up", "#555555"), ((start + stop) / 2, "measured window", "#08519c")]
    if stop < end - 1:
        phases.append(((stop + end - 1) / 2, "streaming phase", "#a63603"))
    for x, label, color in phases:
        top.text(
            x,
            1.01,
            label,
            transform=top.get_xaxis_transform(),
            ha="center",
            va="bottom",
            fontsize=8,
            color=color,
        )

    top.bar(
        np.arange(len(counts)) + 0.5,
        counts,
        width=1.0,
        color="#c6dbef",
        label="completed in each second",
    )
    completed = [int(((times > t - width) & (times <= t)).sum()) for t in grid]
    # over the seconds elapsed so far at the start, then over the rolling window
    rate = [n / min(width, max(t, 0.5)) for n, t in zip(completed, grid, strict=True)]
    top.plot(grid, rate, color="#1f77b4", lw=2, label=f"rolling rate ({width:.0f} s)")
    top.axhline(
        row.rps or 0,
        color="#08306b",
        ls="--",
        lw=1,
        label=f"window mean {row.rps or 0:.2f}/s",
    )
    if failed.any():
        fails = np.bincount(np.floor(times[failed]).astype(int), minlength=len(counts))
        top.step(np.arange(len(fails)), fails, where="post", color="#d62728", label="failures/s")
    top.set_ylabel("requests/s")
    top.legend(loc="upper right", fontsize=8)

    labels = ("each request (at completion)", "response time (ms)",
              "seconds since the users started")  # fmt: skip
    latency_panel(bottom, times, latency, grid, width, labels)
    return save_figure(fig, path, title, dpi=100)
