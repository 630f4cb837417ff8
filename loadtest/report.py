"""The sweep's report: summary.json, report.md (the original load test's format) and charts.

Everything is rendered from the run folder alone (summary.json and the per-request CSVs), so a
report can be redrawn without rerunning the load: ``python -m loadtest.report <run folder>``.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server
import matplotlib.pyplot as plt
import numpy as np

from contract import metrics as names
from contract.tensors import ENSEMBLE_MODEL, MODEL_STAGE, STAGES
from loadtest.metrics import sample_name

PRE, POST = STAGES[0], STAGES[-1]
MODELS = (ENSEMBLE_MODEL, *STAGES)
PERCENTILES = ("p50", "p90", "p95", "p99")
MARKERS = {"mean": "o", "p50": "s", "p90": "^", "p95": "v", "p99": "D"}
COLORS = {"mean": "#444444", "p50": "#1f77b4", "p90": "#2ca02c", "p95": "#ff7f0e", "p99": "#d62728"}


def _f(value: float | None, digits: int = 1, unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}{unit}"


def _pct(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{100 * value:.{digits}f}%"


# --- charts ----------------------------------------------------------------------------------


def _length_axis(ax: Any, lengths: Sequence[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths)
    ax.set_xticklabels([str(n) for n in lengths])
    ax.set_xlabel("output length (tokens)")
    ax.grid(True, which="major", alpha=0.3)


def chart_rps_latency(rows: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    lengths = [r["output_len"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    rps = [r["rps"] or 0 for r in rows]
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
    tokens.plot(
        lengths,
        [r["tokens_per_s"] or 0 for r in rows],
        "s--",
        color="#9467bd",
        label="generated tokens/s",
    )
    tokens.set_ylabel("generated tokens/s", color="#9467bd")
    tokens.set_ylim(0, max([r["tokens_per_s"] or 0 for r in rows] or [1]) * 1.35)
    left.set_title("Throughput")
    handles = left.get_legend_handles_labels()[0] + tokens.get_legend_handles_labels()[0]
    left.legend(handles, ["requests/s", "generated tokens/s"], loc="upper right", fontsize=9)

    for key in ("mean", *PERCENTILES):
        values = [r["latency_ms"][key] for r in rows]
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
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _bars(ax: Any, x: np.ndarray, series: Sequence[tuple[str, list, str]], fmt: str) -> None:
    width = 0.8 / len(series)
    for i, (label, values, color) in enumerate(series):
        heights = [v or 0 for v in values]
        offset = (i - (len(series) - 1) / 2) * width
        bars = ax.bar(x + offset, heights, width, label=label, color=color)
        ax.bar_label(bars, [fmt.format(h) for h in heights], fontsize=7, padding=2)
    ax.set_xlabel("output length (tokens)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.margins(y=0.15)


def chart_shares(rows: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """Stage shares, queueing and batching per output length: three panels, because the
    stage shares are a few tenths of a percent where queueing can be tens of percent."""
    lengths = [str(r["output_len"]) for r in rows]
    x = np.arange(len(rows))
    fig, (shares, queue, batch) = plt.subplots(
        1, 3, figsize=(15, 4.6), gridspec_kw={"width_ratios": [1.2, 0.8, 1.4]}
    )
    _bars(
        shares,
        x,
        [
            ("preprocessing", [100 * (r["stage_share"][PRE] or 0) for r in rows], "#1f77b4"),
            ("postprocessing", [100 * (r["stage_share"][POST] or 0) for r in rows], "#2ca02c"),
        ],
        "{:.2f}%",
    )
    shares.set_xticks(x, lengths)
    shares.set_ylabel("% of the model stage's compute time")
    shares.set_title("Stage compute vs the model stage")
    shares.legend(fontsize=9)

    _bars(
        queue, x, [("queue", [100 * (r["queue_share"] or 0) for r in rows], "#d62728")], "{:.1f}%"
    )
    queue.set_xticks(x, lengths)
    queue.set_ylabel("% of the request time")
    queue.set_title("Time spent queued")

    _bars(
        batch,
        x,
        [
            ("preprocessing", [r["batch_size"][PRE] for r in rows], "#1f77b4"),
            ("gptj (Triton batcher)", [r["batch_size"][MODEL_STAGE] for r in rows], "#7f7f7f"),
            ("postprocessing", [r["batch_size"][POST] for r in rows], "#2ca02c"),
            ("engine running batch", [r["engine_batch_size"] for r in rows], "#ff7f0e"),
        ],
        "{:.1f}",
    )
    batch.set_xticks(x, lengths)
    batch.set_ylabel("mean batch size")
    batch.set_title("Batching (count / exec_count; engine rows / steps)")
    batch.legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def read_requests(path: Path) -> list[tuple[float, str, float, bool]]:
    with open(path, newline="") as handle:
        return [
            (float(r["t_s"]), r["name"], float(r["response_time_ms"]), r["failed"] == "1")
            for r in csv.DictReader(handle)
        ]


def _rolling(times: np.ndarray, values: np.ndarray, grid: np.ndarray, width: float, how) -> list:
    """``how`` (e.g. a percentile) of the values whose times lie in the ``width`` seconds
    before each grid point; NaN where there are none."""
    out = []
    for t in grid:
        chosen = values[(times > t - width) & (times <= t)]
        out.append(how(chosen) if len(chosen) else np.nan)
    return out


def chart_timeseries(
    row: dict[str, Any], records: Iterable[tuple[float, str, float, bool]], path: Path, title: str
) -> Path:
    """Completions per second and response times over the run, with the warm-up, the measured
    window and the streaming phase marked. Long requests complete in waves, so besides the raw
    per-second counts and per-request dots, a rolling rate and rolling percentiles over a few
    request times show the level at a glance."""
    records = list(records)
    times = np.array([r[0] for r in records], dtype=float)
    latency = np.array([r[2] for r in records], dtype=float)
    failed = np.array([r[3] for r in records], dtype=bool)
    end = float(np.ceil(times.max())) + 1 if len(times) else 1.0
    typical = float(np.median(latency)) / 1000 if len(latency) else 1.0
    width = float(np.clip(3 * typical, 3.0, 30.0))  # rolling window: a few request times
    grid = np.arange(0.0, end + 0.01, 0.5)
    counts = np.bincount(np.floor(times).astype(int), minlength=int(end))

    start, stop = row["timeline"]["window_start_s"], row["timeline"]["window_end_s"]
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
        row["rps"] or 0,
        color="#08306b",
        ls="--",
        lw=1,
        label=f"window mean {row['rps'] or 0:.2f}/s",
    )
    if failed.any():
        fails = np.bincount(np.floor(times[failed]).astype(int), minlength=len(counts))
        top.step(np.arange(len(fails)), fails, where="post", color="#d62728", label="failures/s")
    top.set_ylabel("requests/s")
    top.legend(loc="upper right", fontsize=8)

    bottom.plot(
        times,
        latency,
        ".",
        ms=2.5,
        color="#9e9ac8",
        alpha=0.5,
        label="each request (at completion)",
    )
    for key, q in (("p50", 50), ("p95", 95)):
        bottom.plot(
            grid,
            _rolling(times, latency, grid, width, lambda v, q=q: np.percentile(v, q)),
            color=COLORS[key],
            lw=1.8,
            label=f"rolling {key}",
        )
    bottom.set_ylabel("response time (ms)")
    bottom.set_xlabel("seconds since the users started")
    bottom.set_ylim(bottom=0)
    bottom.legend(loc="upper right", fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# --- report.md -------------------------------------------------------------------------------


def _machine_lines(run: dict[str, Any]) -> list[str]:
    m, model = run.get("machine", {}), run.get("model", {})
    lines = [
        f"- CPU: {m.get('cpu')} ({m.get('cores')} cores)",
        f"- GPU: {m.get('gpu', 'none')}",
        f"- RAM: {m.get('memory_gib')} GiB",
        f"- OS: {m.get('os')}; Python {m.get('python')}, torch {m.get('torch')}, "
        f"Locust {m.get('locust')}, tritonclient {m.get('tritonclient')}",
        f"- Triton Inference Server {model.get('triton_version', '?')} (CPU only)",
    ]
    checkpoint = model.get("checkpoint")
    if checkpoint:
        lines.append(
            f"- Model: `{checkpoint.get('name')}` GPT-J, {checkpoint.get('layers')} layers x "
            f"{checkpoint.get('width')} wide, {checkpoint.get('heads')} heads, context "
            f"{checkpoint.get('context')}, vocabulary {checkpoint.get('vocab')}, "
            f"{(checkpoint.get('parameters') or 0) / 1e6:.2f}M parameters "
            f"(held-out loss {checkpoint.get('held_out_loss')})"
        )
    params = model.get("stage_parameters") or {}
    if params:
        lines.append(
            "- Model stage `gptj`: continuous-batching engine, "
            + ", ".join(f"{k}={v}" for k, v in sorted(params.items()) if k != "checkpoint_path")
        )
    return lines


def _settings_lines(run: dict[str, Any]) -> list[str]:
    s = run["settings"]
    stream = (
        f"- Streaming phase: {s['stream_users']} gRPC streaming user(s) for "
        f"{s['stream_duration_s']:.0f} s after each window, beside the same load"
        if s.get("stream_users")
        else "- Streaming phase: none"
    )
    return [
        "- Single Triton instance; unary `ensemble` (preprocessing -> gptj -> postprocessing).",
        f"- {s['users']} concurrent Locust users over {s['protocol'].upper()}, closed loop "
        "(each sends its next request when the last one returns).",
        f"- Per output length: {s['warmup_s']:.0f} s warm-up, then a {s['duration_s']:.0f} s "
        "measured window.",
        f"- Prompts: {s['prompts']} distinct code prompts cut from the Python standard library "
        f"(seed {s['prompt_seed']}); sampling {s['sampling']}, the same for every request.",
        stream,
        f"- Metrics: Triton's metrics port read at both ends of each window; {run['prometheus']}.",
        f"- Output length: {' vs '.join(str(n) for n in s['lengths'])}",
    ]


def _summary_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    head = (
        "| output len | requests | RPS | mean ms | p50 | p90 | p95 | p99 | failures | tokens/s "
        "| tokens/req | batch pre / gptj / post | engine batch | pre % of model | post % of model "
        "| queue share |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lat, b, s = r["latency_ms"], r["batch_size"], r["stage_share"]
        lines.append(
            f"| {r['output_len']} | {r['requests']} | {_f(r['rps'], 2)} | {_f(lat['mean'], 0)} "
            f"| {_f(lat['p50'], 0)} | {_f(lat['p90'], 0)} | {_f(lat['p95'], 0)} "
            f"| {_f(lat['p99'], 0)} | {r['failures']} | {_f(r['tokens_per_s'], 0)} "
            f"| {_f(r['tokens_per_request'], 1)} | {_f(b[PRE], 2)} / {_f(b[MODEL_STAGE], 2)} / "
            f"{_f(b[POST], 2)} | {_f(r['engine_batch_size'], 1)} | {_pct(s[PRE])} "
            f"| {_pct(s[POST])} | {_pct(r['queue_share'])} |"
        )
    return lines


def _metrics_block(row: dict[str, Any]) -> list[str]:
    """The seed's metric listing, as increases over the measured window."""
    deltas = row["triton_deltas"]
    lines = ["```bash", "# metrics: increase over the measured window"]
    for metric in (names.INFERENCE_COUNT, names.EXEC_COUNT, names.COMPUTE_INFER_DURATION_US):
        for model in MODELS:
            value = deltas.get(sample_name(metric), {}).get(model, 0)
            lines.append(f'{metric}{{model="{model}"}} {value:.0f}')
        lines.append("")
    for metric in (
        names.ENGINE_COMPUTE_DURATION_US,
        names.ENGINE_STEPS,
        names.ENGINE_STEP_ROWS,
        names.ENGINE_GENERATED_TOKENS,
    ):
        value = deltas.get(sample_name(metric), {}).get(MODEL_STAGE, 0)
        lines.append(f'{metric}{{model="{MODEL_STAGE}"}} {value:.0f}')
    lines.append("```")
    return lines


def _busy(row: dict[str, Any], stage: str) -> str:
    share = (row.get("busy_share") or {}).get(stage)
    if share is None:
        return ""
    return f" ({_pct(share)} counting each of its executions once)"


def _length_section(row: dict[str, Any], chart: str) -> list[str]:
    lat, t, s = row["latency_ms"], row["triton"], row["stage_share"]
    counts = t["counts"]
    exec_counts = {m: (counts[m] / b if b else 0) for m, b in t["batch_size"].items()}
    agree = ((row.get("prometheus") or {}).get("agreement")) or {}
    lines = [f"### Output Length: {row['output_len']}", "", f"![]({chart})", ""]
    lines += _metrics_block(row)
    lines += [
        "",
        f"- RPS (responses per second) reaches around {_f(row['rps'], 2)} "
        f"({row['requests']} requests in {_f(row['window_s'], 1)} s; Triton counted "
        f"{counts[ENSEMBLE_MODEL]:.0f}).",
        f"- The average response time is {_f(lat['mean'], 0)} ms (p50 {_f(lat['p50'], 0)}, "
        f"p95 {_f(lat['p95'], 0)}, p99 {_f(lat['p99'], 0)} ms); Triton's own mean for the "
        f"ensemble is {_f(t['mean_request_ms'], 0)} ms.",
        f"- {_f(row['tokens_per_s'], 0)} generated tokens/s, "
        f"{_f(row['tokens_per_request'], 1)} tokens per request.",
        f"- Batching: `nv_inference_count` / `nv_inference_exec_count` is "
        f"{_f(t['batch_size'][PRE], 2)} for preprocessing, {_f(t['batch_size'][MODEL_STAGE], 2)} "
        f"for gptj ({counts[MODEL_STAGE]:.0f} requests in {exec_counts[MODEL_STAGE]:.0f} "
        f"executions of its dynamic batcher), {_f(t['batch_size'][POST], 2)} for "
        f"postprocessing; the engine ran {_f(row['engine_batch_size'], 1)} sequences per "
        f"forward pass on average.",
        f"- Preprocessing spends {_pct(s[PRE])} of the model inference time{_busy(row, PRE)}.",
        f"- Postprocessing spends {_pct(s[POST])} of the model inference time{_busy(row, POST)}.",
        f"- Queueing is {_pct(row['queue_share'])} of the request time; the engine was busy "
        f"{_pct(t['engine_busy'], 0)} of the window.",
    ]
    if row["failures"]:
        lines.append(f"- {row['failures']} requests failed: {row['locust'].get('errors')}")
    stream = row.get("stream")
    if stream and stream["ttft"]["requests"]:
        ttft, itl = stream["ttft"]["latency_ms"], stream["inter_token"]["latency_ms"]
        lines.append(
            f"- Streaming ({stream['users']} user(s) beside the load): time to first token "
            f"mean {_f(ttft['mean'], 0)} ms, p95 {_f(ttft['p95'], 0)} ms; inter-token mean "
            f"{_f(itl['mean'], 1)} ms, p95 {_f(itl['p95'], 0)} ms "
            f"({stream['inter_token']['requests']} gaps)."
        )
    if agree:
        lines.append(
            f"- Prometheus agrees: largest relative difference "
            f"{_pct(agree['max_rel_diff'], 1)} (tolerance {_pct(agree['tolerance'], 1)})."
        )
    return [*lines, ""]


def _prometheus_section(rows: Sequence[dict[str, Any]]) -> list[str]:
    proms = [(r, r.get("prometheus")) for r in rows]
    if not any(p and "agreement" in p for _, p in proms):
        return []
    lines = [
        "## Prometheus vs the direct reading",
        "",
        "The same figures, computed by the same code from Prometheus' `increase()` over the "
        "window aligned to its scrapes (first and last scrape inside the window, so nothing is "
        "extrapolated). That window is shorter by up to one scrape interval at each end, which "
        "is the whole difference. They agree when every figure that is a ratio of event "
        "counts (requests, tokens, executions, steps) is within the relative tolerance plus "
        "one wave of completions (one per user) at each edge. Figures weighted by durations "
        "(mean time, queue and stage shares) are shown but do not decide: a request "
        "completing at an edge brings its whole duration, so one stalled wave there moves them "
        "a lot in a short window. Every counter, durations included, is also checked exactly: "
        "Prometheus' window lies inside the direct one and counters only grow, so none may "
        'have grown more in Prometheus\' window ("contained").',
        "",
    ]
    for row, prom in proms:
        if not prom or "agreement" not in prom:
            continue
        w, a = prom["window"], prom["agreement"]
        lines += [
            f"**Output length {row['output_len']}**: Prometheus window {w['seconds']:.1f} s "
            f"({w['scrapes']} scrapes) inside the direct {w['direct_seconds']:.1f} s; "
            f"{'agree' if a['agree'] else 'DISAGREE'} (max difference "
            f"{_pct(a['max_rel_diff'], 1)}, tolerance {_pct(a['tolerance'], 1)}); counts "
            f"{'contained' if prom['contained'] else 'NOT contained: ' + str(prom['excess'])}.",
            "",
            "| figure | direct | Prometheus | difference |",
            "|---|---|---|---|",
        ]
        for f in a["figures"]:
            label = f["label"] if f.get("strict", True) else f"{f['label']} (shown, not decisive)"
            lines.append(
                f"| {label} | {_f(f['direct'], 4)} | {_f(f['other'], 4)} "
                f"| {_pct(f['rel_diff'], 1)} |"
            )
        lines.append("")
    return lines


NOTES = """## How the figures are computed

- **Window.** For each output length the users run a warm-up, then Triton's metrics port is read
  and Locust's statistics are reset at the same moment; at the end of the window both are read
  again. Triton counts a request when it completes and so does Locust, so the two agree.
  Triton's counters are cumulative: every figure is an increase over the window (the listings
  above are increases, not totals since start as in the original report).
- **RPS and latency** are the client's (Locust): requests completed in the window / its length,
  and Locust's response-time percentiles (Locust rounds times above 100 ms to 2 significant
  digits).
- **Batch size** per model is `delta nv_inference_count / delta nv_inference_exec_count`. For
  `gptj` this is how Triton's dynamic batcher groups requests before handing them to the engine;
  the batch the model actually runs is the engine's running batch,
  `delta codegen_engine_step_rows_total / delta codegen_engine_steps_total`.
- **Stage shares** follow the original report: a stage's compute time
  (`delta nv_inference_compute_infer_duration_us`) as a fraction of the model stage's. The model
  stage's time is the engine's busy time, `delta codegen_engine_compute_duration_us_total`
  (prefill and decode), so its own share is 1 by definition. Triton's
  `nv_inference_compute_infer_duration_us{model="gptj"}` is listed above but not used: the
  stage's `execute()` only hands requests to the engine and returns, and the engine answers
  later from its own thread, so Triton times the admission (milliseconds), not the generation.
  Triton charges each request of a dynamically batched execution with that execution's whole
  time (checked against its statistics API: the metric equals the sum over `batch_stats` of
  batch size x execution time), so when preprocessing or postprocessing batch more than one
  request per execution, their share counts that execution several times. The figure in
  brackets counts each execution once (`batch_stats` of `/v2/models/stats`, read at the same
  moments): the like-for-like comparison with the engine's busy time.
- **Queue share**: time requests waited (Triton's queues of the three stages plus the engine's
  wait before prefill) over the ensemble's end-to-end request time
  (`nv_inference_request_duration_us{model="ensemble"}`, which covers the whole request).
- **Tokens/s**: `delta codegen_engine_generated_tokens_total` over the window. A request can
  stop before its output length at the model's end-of-text token; tokens/request shows it.
"""


def render_markdown(summary: dict[str, Any], charts: dict[str, str]) -> str:
    run, rows = summary["run"], summary["rows"]
    lines = [
        f"# Load test: {run['name']}",
        "",
        f"Started {run['started']}, {run['seconds']:.0f} s. Command: `{run['command']}`",
        "",
        "Device Info:",
        *_machine_lines(run),
        "",
        "Experimental Setups:",
        *_settings_lines(run),
        "",
        "## Summary",
        "",
        *_summary_table(rows),
        "",
        f"![]({charts['rps_latency']})",
        f"![]({charts['stage_shares']})",
        "",
        "## Per output length",
        "",
    ]
    for row in rows:
        lines += _length_section(row, charts[f"timeseries_{row['output_len']}"])
    lines += _prometheus_section(rows)
    lines += [NOTES, "## Files", ""]
    lines.append(
        "- `summary.json`: one row per output length (`output_len`, `rps`, `latency_ms`, "
        "`failures`, `tokens_per_s`, `batch_size`, `stage_share`, `queue_share`, and the "
        "details behind them)."
    )
    lines.append(
        "- `len_NNNN_stats.csv`, `_stats_history.csv`, `_failures.csv`, `_exceptions.csv`: "
        "Locust's own CSVs (tables as at the end of the window; the history runs from the "
        "start of the warm-up, statistics reset when the window opens); `_stream_*.csv` for the "
        "streaming phase; `len_NNNN_requests.csv`: every request with its completion time."
    )
    lines.append(
        "- `len_NNNN_metrics_start.txt` / `_end.txt`: the raw metric snapshots at the window's "
        "ends."
    )
    return "\n".join(lines) + "\n"


def write_report(out: Path, summary: dict[str, Any]) -> list[Path]:
    """Write summary.json, the charts and report.md into ``out``; returns the paths."""
    out = Path(out)
    rows = summary["rows"]
    run = summary["run"]
    paths = [out / "summary.json"]
    paths[0].write_text(json.dumps(summary, indent=2, default=str) + "\n")
    model = (run.get("model") or {}).get("checkpoint") or {}
    machine = run.get("machine") or {}
    s = run["settings"]
    title = (
        f"{model.get('name', 'model')} on {machine.get('cores')} CPU cores, {s['users']} "
        f"{s['protocol'].upper()} users"
    )
    charts = {
        "rps_latency": chart_rps_latency(rows, out / "rps_latency.png", title).name,
        "stage_shares": chart_shares(rows, out / "stage_shares.png", title).name,
    }
    for row in rows:
        length = row["output_len"]
        requests_csv = out / f"len_{length:04d}_requests.csv"
        records = read_requests(requests_csv) if requests_csv.exists() else []
        records = [r for r in records if r[1] == ENSEMBLE_MODEL]
        path = chart_timeseries(
            row,
            records,
            out / f"timeseries_len_{length:04d}.png",
            f"Output length {length}: {title}",
        )
        charts[f"timeseries_{length}"] = path.name
    paths += [out / name for name in charts.values()]
    report = out / "report.md"
    report.write_text(render_markdown(summary, charts))
    paths.append(report)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Redraw a load test report from its folder.")
    parser.add_argument("run", type=Path, help="loadtest/results/<run>")
    args = parser.parse_args(argv)
    summary = json.loads((args.run / "summary.json").read_text())
    for path in write_report(args.run, summary):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
