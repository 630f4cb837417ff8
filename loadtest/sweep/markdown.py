"""report.md in the seed's format, from the per-length rows of :mod:`loadtest.sweep.report`.

The prose lives in ``loadtest/templates/report.md`` (``string.Template`` pieces); this module
only formats the figures that fill it and picks the optional pieces.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pandas as pd

from contract import metrics as names
from contract.tensors import ENGINE_MODEL, MODEL_STAGE
from loadtest.metrics import MODELS, POSTPROCESSING, PREPROCESSING, reuse_line, sample_name
from loadtest.results import MachineInfo, ModelInfo
from loadtest.sweep.charts import RPS_LATENCY_CHART, STAGE_SHARES_CHART, timeseries_chart
from loadtest.targets import header_fields
from reporting import tables
from reporting.tables import templates

TEMPLATES = Path(__file__).parents[1] / "templates" / "report.md"
PRE, POST = PREPROCESSING, POSTPROCESSING
# the summary table: header, the row's column (a callable for a composed cell), number format
SUMMARY = (
    ("output len", "output_len", "d"), ("requests", "requests", "d"), ("RPS", "rps", ".2f"),
    ("mean ms", "latency_mean_ms", ",.0f"), ("p50", "latency_p50_ms", ",.0f"),
    ("p90", "latency_p90_ms", ",.0f"), ("p95", "latency_p95_ms", ",.0f"),
    ("p99", "latency_p99_ms", ",.0f"), ("failures", "failures", "d"),
    ("tokens/s", "tokens_per_s", ",.0f"), ("tokens/req", "tokens_per_request", ".1f"),
    ("batch pre / gptj / post", lambda r: " / ".join(number(r[f"batch_{m}"], 2)
                                                    for m in (PRE, MODEL_STAGE, POST)), ""),
    ("engine batch", "engine_batch", ".1f"), ("pre % of model", "share_preprocessing", "%"),
    ("post % of model", "share_postprocessing", "%"), ("queue share", "queue_share", "%"),
)  # fmt: skip


def number(value: Any, digits: int = 1) -> str:
    return tables.number(None if pd.isna(value) else value, digits)


def percent(value: Any, digits: int = 2) -> str:
    return tables.percent(None if pd.isna(value) else value, digits)


def _fill(template: str, /, **values: object) -> str:
    return templates(TEMPLATES)[template].substitute(values)


def summary_table(table: pd.DataFrame) -> str:
    """The summary, one row per output length, with ``DataFrame.to_markdown``."""
    cells = {}
    for header, column, fmt in SUMMARY:
        if callable(column):
            cells[header] = [column(row) for _, row in table.iterrows()]
        elif fmt == "%":
            cells[header] = [percent(v) for v in table[column]]
        else:
            cells[header] = [
                "-" if pd.isna(v) else format(int(v) if fmt == "d" else v, fmt)
                for v in table[column]
            ]
    return pd.DataFrame(cells).to_markdown(index=False, disable_numparse=True, stralign="right")


def render(run: dict[str, Any], table: pd.DataFrame) -> str:
    info, s = run["run"], run["run"]["settings"]
    header = types.SimpleNamespace(**info)
    header.machine = MachineInfo(**info["machine"])
    header.model = ModelInfo.from_dict(info["model"])
    stream_setup = (
        _fill("stream_setup", users=s["stream_users"], seconds=f"{s['stream_duration_s']:.0f}")
        if s["stream_users"]
        else _fill("no_stream_setup")
    )
    sections = [
        _length_section(row, window, s["stream_users"])
        for (_, row), window in zip(table.iterrows(), run["windows"], strict=True)
    ]
    return _fill(
        "report",
        **header_fields(header),
        users=s["users"], protocol=s["protocol"].upper(), warmup=f"{s['warmup_s']:.0f}",
        duration=f"{s['duration_s']:.0f}", prompts=s["prompts"], prompt_seed=s["prompt_seed"],
        sampling=s["sampling"], stream_setup=stream_setup, prometheus=info["prometheus"],
        lengths=" vs ".join(str(n) for n in s["lengths"]), summary_table=summary_table(table),
        rps_latency_chart=RPS_LATENCY_CHART, stage_shares_chart=STAGE_SHARES_CHART,
        length_sections="\n".join(sections),
    ) + "\n"  # fmt: skip


def metric_listing(increases: dict[str, dict[str, float]]) -> list[str]:
    """The seed's metric listing, as increases over the measured window."""

    def increase(metric: str, model: str) -> float:
        return increases.get(sample_name(metric), {}).get(model, 0.0)

    lines = []
    for metric in (names.INFERENCE_COUNT, names.EXEC_COUNT, names.COMPUTE_INFER_DURATION_US):
        lines += [f'{metric}{{model="{m}"}} {increase(metric, m):.0f}' for m in MODELS] + [""]
    for metric in (names.ENGINE_COMPUTE_DURATION_US, names.ENGINE_STEPS, names.ENGINE_STEP_ROWS,
                   names.ENGINE_GENERATED_TOKENS, names.ENGINE_PROMPT_TOKENS,
                   names.ENGINE_PROMPT_TOKENS_REUSED):  # fmt: skip
        lines.append(f'{metric}{{model="{ENGINE_MODEL}"}} {increase(metric, ENGINE_MODEL):.0f}')
    received = increase(names.ENGINE_PROMPT_TOKENS, ENGINE_MODEL)
    reused = increase(names.ENGINE_PROMPT_TOKENS_REUSED, ENGINE_MODEL)
    return [*lines, "# " + reuse_line(received, reused)]


def _busy(share: float | None) -> str:
    return "" if share is None or pd.isna(share) else _fill("busy", share=percent(share))


def _length_section(row: pd.Series, window: dict[str, Any], stream_users: int) -> str:
    optional = []
    if row["failures"]:
        optional.append(_fill("failures", failures=row["failures"], errors=row["errors"]))
    if row["stream_requests"]:
        optional.append(_fill("stream", users=stream_users, gaps=row["gaps"],
                              ttft_mean=number(row["ttft_mean_ms"], 0),
                              ttft_p95=number(row["ttft_p95_ms"], 0),
                              itl_mean=number(row["itl_mean_ms"], 1),
                              itl_p95=number(row["itl_p95_ms"], 0)))  # fmt: skip
    gptj, gptj_batch = row[f"count_{MODEL_STAGE}"], row[f"batch_{MODEL_STAGE}"]
    return _fill(
        "length",
        output_len=row["output_len"], chart=timeseries_chart(row["output_len"]),
        metric_listing="\n".join(metric_listing(window["deltas"])), source=row["source"],
        rps=number(row["rps"], 2), requests=row["requests"], window_s=number(row["window_s"], 1),
        triton_requests=f"{row['triton_requests']:.0f}", mean=number(row["latency_mean_ms"], 0),
        p50=number(row["latency_p50_ms"], 0), p95=number(row["latency_p95_ms"], 0),
        p99=number(row["latency_p99_ms"], 0), triton_mean=number(row["triton_mean_ms"], 0),
        tokens_per_s=number(row["tokens_per_s"], 0),
        tokens_per_request=number(row["tokens_per_request"], 1),
        batch_pre=number(row[f"batch_{PRE}"], 2), batch_gptj=number(gptj_batch, 2),
        gptj_requests=f"{gptj:.0f}",
        gptj_executions=number(gptj / gptj_batch if not pd.isna(gptj_batch) else 0, 0),
        batch_post=number(row[f"batch_{POST}"], 2), engine_batch=number(row["engine_batch"], 1),
        pre_share=percent(row[f"share_{PRE}"]), pre_busy=_busy(row[f"busy_{PRE}"]),
        post_share=percent(row[f"share_{POST}"]), post_busy=_busy(row[f"busy_{POST}"]),
        queue_share=percent(row["queue_share"]), engine_busy=percent(row["engine_busy"], 0),
        optional="".join(f"\n{line}" for line in optional),
    )  # fmt: skip
