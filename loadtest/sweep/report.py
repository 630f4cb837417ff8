"""The sweep's report.md and charts, redrawn from its run folder alone (``python -m
loadtest.sweep.report <run>``): ``events.csv`` (every request) and ``run.json`` (the run, and each
length's window with Triton's counter increases), joined by :func:`length_row` into one row per
output length. The prose is ``loadtest/templates/report.md``, format strings."""

from __future__ import annotations

import argparse
import json
import math
import string
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from contract import metrics as names
from contract.tensors import ENGINE_MODEL, ENSEMBLE_MODEL, MODEL_STAGE, STAGES
from loadtest.metrics import MODELS, Deltas, reuse_line, window_figures
from loadtest.results import MachineInfo, ModelInfo
from loadtest.sweep import ITL_NAME, STREAM_NAME, charts
from loadtest.targets import served_lines
from reporting import events
from reporting.tables import templates
from reporting.triton import sample_name

EVENTS, RUN = "events.csv", "run.json"
TEMPLATES = Path(__file__).parents[1] / "templates" / "report.md"
PRE, POST = STAGES[0], STAGES[-1]
# the summary table: header, the row's column, its format ("%": a share as a percentage)
SUMMARY = (
    ("output len", "output_len", "d"),
    ("requests", "requests", "d"),
    ("RPS", "rps", ".2f"),
    ("mean ms", "latency_mean_ms", ",.0f"),
    ("p50", "latency_p50_ms", ",.0f"),
    ("p90", "latency_p90_ms", ",.0f"),
    ("p95", "latency_p95_ms", ",.0f"),
    ("p99", "latency_p99_ms", ",.0f"),
    ("failures", "failures", "d"),
    ("tokens/s", "tokens_per_s", ",.0f"),
    ("tokens/req", "tokens_per_request", ".1f"),
    ("batch pre / gptj / post", "batches", "s"),
    ("engine batch", "engine_batch", ".1f"),
    ("pre % of model", "share_preprocessing", ".2%"),
    ("post % of model", "share_postprocessing", ".2%"),
    ("queue share", "queue_share", ".2%"),
)


def _figures(values: pd.Series, prefix: str, keys: tuple[str, ...]) -> dict[str, float | None]:
    """``{prefix}_{key}_ms`` for each of mean, p50, p90, p95, p99, max asked (None: no value)."""
    d = pd.to_numeric(values, errors="coerce").dropna().describe(percentiles=[0.5, 0.9, 0.95, 0.99])
    d = d.rename(lambda k: f"p{k[:-1]}" if k.endswith("%") else k)
    return {f"{prefix}_{key}_ms": None if pd.isna(d[key]) else float(d[key]) for key in keys}


def length_row(frame: pd.DataFrame, window: dict[str, Any]) -> dict[str, Any]:
    """One output length's figures: the client's from the event table's rows of its measured
    window (``phase`` ``measure``) and streaming phase, Triton's from the window's increases."""
    frame = frame.assign(**{c: pd.NA for c in ("window", "phase") if c not in frame})
    rows = frame[frame["window"] == window["output_len"]]
    measured = rows[(rows["phase"] == "measure") & (rows["name"] == ENSEMBLE_MODEL)]
    failed, seconds = measured[measured["outcome"] != "ok"], window["client_window_s"]
    stream = rows[rows["phase"] == "stream"]
    first, gaps = stream[stream["name"] == STREAM_NAME], stream[stream["name"] == ITL_NAME]
    latency = measured[measured["outcome"] == "ok"]["latency_ms"]
    return {
        **{key: window[key] for key in ("output_len", "source", "client_window_s", "drained")},
        "requests": len(measured),
        "failures": len(failed),
        "rps": len(measured) / seconds if seconds > 0 else None,
        "errors": failed["error"].value_counts().to_dict(),
        **_figures(latency, "latency", ("mean", "p50", "p90", "p95", "p99", "max")),
        "stream_requests": len(first),
        **_figures(first["first_token_ms"], "ttft", ("mean", "p95")),
        **_figures(gaps["latency_ms"], "itl", ("mean", "p95")),
        "gaps": len(gaps),
        **{f"busy_{stage}": share for stage, share in window["busy_share"].items()},
        **window_figures(Deltas.from_dict(window["deltas"], window["window_s"])),
    }


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
    report.write_text(render(run, table))
    return [*charts.draw_charts(Path(out), run, frame, table), report]


class _Figures(string.Formatter):
    """``str.format`` with a figure not measured (None, NaN) as "-"."""

    def format_field(self, value: Any, spec: str) -> str:
        missing = value is None or (isinstance(value, float) and math.isnan(value))
        return "-" if missing else super().format_field(value, spec)


def _fill(template: str, /, **values: Any) -> str:
    return _Figures().vformat(templates(TEMPLATES)[template], (), values)


def summary_table(table: pd.DataFrame) -> str:
    """The summary, one row per output length."""
    text = _Figures().format_field
    batches = [
        " / ".join(text(row[f"batch_{m}"], ".2f") for m in (PRE, MODEL_STAGE, POST))
        for _, row in table.iterrows()
    ]
    whole = {c: table[c].astype(int) for c in ("output_len", "requests", "failures")}
    table = table.assign(batches=batches, **whole)
    cells = {header: [text(v, fmt) for v in table[column]] for header, column, fmt in SUMMARY}
    return pd.DataFrame(cells).to_markdown(index=False, disable_numparse=True, stralign="right")


def render(run: dict[str, Any], table: pd.DataFrame) -> str:
    """report.md in the seed's format."""
    info, s = run["run"], run["run"]["settings"]
    machine = served_lines(MachineInfo(**info["machine"]), ModelInfo(**info["model"]))
    windows = zip(table.iterrows(), run["windows"], strict=True)
    sections = [_length_section(row, window, s["stream_users"]) for (_, row), window in windows]
    return (
        _fill(
            "report",
            run=info,
            settings=s,
            machine="\n".join(machine),
            protocol=s["protocol"].upper(),
            lengths=" vs ".join(str(n) for n in s["lengths"]),
            stream_setup=_fill(
                "stream_setup" if s["stream_users"] else "no_stream_setup", settings=s
            ),
            summary_table=summary_table(table),
            length_sections="\n".join(sections),
            rps_latency_chart=charts.RPS_LATENCY_CHART,
            stage_shares_chart=charts.STAGE_SHARES_CHART,
        )
        + "\n"
    )


def metric_listing(increases: dict[str, dict[str, float]]) -> list[str]:
    """The seed's metric listing, as increases over the measured window."""

    def increase(metric: str, model: str) -> float:
        return increases.get(sample_name(metric), {}).get(model, 0.0)

    lines = []
    for metric in (names.INFERENCE_COUNT, names.EXEC_COUNT, names.COMPUTE_INFER_DURATION_US):
        lines += [f'{metric}{{model="{m}"}} {increase(metric, m):.0f}' for m in MODELS] + [""]
    for metric in (
        names.ENGINE_COMPUTE_DURATION_US,
        names.ENGINE_STEPS,
        names.ENGINE_STEP_ROWS,
        names.ENGINE_GENERATED_TOKENS,
        names.ENGINE_PROMPT_TOKENS,
        names.ENGINE_PROMPT_TOKENS_REUSED,
    ):
        lines.append(f'{metric}{{model="{ENGINE_MODEL}"}} {increase(metric, ENGINE_MODEL):.0f}')
    received = increase(names.ENGINE_PROMPT_TOKENS, ENGINE_MODEL)
    reused = increase(names.ENGINE_PROMPT_TOKENS_REUSED, ENGINE_MODEL)
    return [*lines, "# " + reuse_line(received, reused)]


def _length_section(row: pd.Series, window: dict[str, Any], stream_users: int) -> str:
    shares = {stage: row[f"busy_{stage}"] for stage in (PRE, POST)}
    busy = {k: "" if pd.isna(v) else _fill("busy", share=v) for k, v in shares.items()}
    optional = []
    if row["failures"]:
        optional.append(_fill("failures", **row))
    if row["stream_requests"]:
        optional.append(_fill("stream", **row, users=stream_users))
    gptj, batch = row[f"count_{MODEL_STAGE}"], row[f"batch_{MODEL_STAGE}"]
    return _fill(
        "length",
        **row,
        chart=charts.timeseries_chart(row["output_len"]),
        metric_listing="\n".join(metric_listing(window["deltas"])),
        pre_busy=busy[PRE],
        post_busy=busy[POST],
        gptj_executions=0 if pd.isna(batch) else gptj / batch,
        optional="".join(f"\n{line}" for line in optional),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Redraw a load test report from its folder.")
    parser.add_argument("run", type=Path, help="loadtest/results/<run>")
    for path in write_report(parser.parse_args(argv).run):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
