"""The editor profile's run folder: ``summary.json``, ``requests.csv``, ``report.md`` and two
charts, drawn from the typed :class:`EditorRun` alone.

It reuses the sweep's report machinery rather than a stack of its own: the template pieces
(:func:`reporting.tables.templates`, prose in ``loadtest/templates/editor.md``), the number
formats of :mod:`reporting.tables`, the machine lines of :mod:`loadtest.machine`, and the
colours, rolling percentiles and figure saving of :mod:`reporting.charts`.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.editor.drill import DrillFigures
from loadtest.editor.figures import (
    ABANDONED,
    ANSWERED,
    ERROR,
    EditorFigures,
    EditorRecord,
    EngineFigures,
)
from loadtest.results import MachineInfo, ModelInfo
from loadtest.targets import header_fields
from reporting.charts import latency_panel, plt, save_figure
from reporting.tables import number, percent, templates

TEMPLATES = Path(__file__).parent.parent / "templates" / "editor.md"
TIMELINE_CHART, LATENCY_CHART = "editor_timeline.png", "editor_latency.png"
OUTCOME_COLORS = {ANSWERED: "#1f77b4", ABANDONED: "#ff7f0e", ERROR: "#d62728"}


@dataclass(frozen=True)
class EditorRun:
    """Everything summary.json holds."""

    name: str
    started: str
    seconds: float
    command: str
    protocol: str
    settings: dict[str, Any]
    suffix: dict[str, Any]  # SuffixMode as a dict
    figures: EditorFigures
    after: str  # how the server answered right after the run
    problems: list[str]  # typist threads that died, typists still busy, a failed after-check
    machine: MachineInfo
    model: ModelInfo
    drill: DrillFigures | None = None  # the abandonment drill after the typing (drill.py)


def write_report(out: Path, run: EditorRun, records: Sequence[EditorRecord]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    summary = out / "summary.json"
    summary.write_text(json.dumps(dataclasses.asdict(run), indent=2, default=str) + "\n")
    requests = out / "requests.csv"
    with requests.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(f.name for f in dataclasses.fields(EditorRecord))
        writer.writerows(dataclasses.astuple(r) for r in records)
    title = f"{run.protocol} editor traffic, {run.settings.get('typists')} typists"
    charts = [
        chart_timeline(records, out / TIMELINE_CHART, title),
        chart_latency(records, out / LATENCY_CHART, title),
    ]
    report = out / "report.md"
    report.write_text(render(run))
    return [summary, requests, *charts, report]


def _fill(name: str, /, **values: object) -> str:
    return templates(TEMPLATES)[name].substitute(values)


def _range(pair: Sequence[float], digits: int = 2) -> str:
    return f"{pair[0]:.{digits}f}-{pair[1]:.{digits}f}"


def render(run: EditorRun) -> str:
    s, f = run.settings, run.figures
    suffix = run.suffix
    if suffix["send"]:
        suffix_setup = (
            f"the suffix (the file after the cursor) takes up to {s['suffix_share']:.0%} of "
            "that budget."
        )
    elif suffix["requested"]:
        suffix_setup = "**no suffix** (the server refused it, see below)."
    else:
        suffix_setup = "no suffix (--no-suffix)."
    banner = _fill("suffix_banner", note=suffix["note"]) + "\n" if suffix["refused"] else ""
    sampling = ", ".join(f"{k} {v}" for k, v in s["sampling"].items())
    return (
        _fill(
            "report",
            **header_fields(run),
            typists=s["typists"],
            duration=f"{s['duration_s']:.0f}",
            protocol=_protocol(run.protocol),
            files=s["files"],
            burst=f"{s['burst'][0]}-{s['burst'][1]}",
            keystroke=_range(s["keystroke_s"]),
            pause=_range(s["pause_s"], 1),
            max_tokens=s["max_tokens"],
            sampling=sampling,
            context=s["context"],
            suffix_setup=suffix_setup,
            suffix_banner=banner,
            requests=f.requests,
            answered=f.answered,
            abandoned=f.abandoned,
            abandoned_share=percent(f.abandoned_share, 1),
            errors=f.errors,
            ttft=f"{number(f.first_token_ms.p50, 0)} / {number(f.first_token_ms.p95, 0)}",
            latency=f"{number(f.latency_ms.p50, 0)} / {number(f.latency_ms.p95, 0)}",
            prompt_sent=number(f.prompt_tokens_sent, 0),
            abandoned_streaming=f.abandoned_after_first_token,
            engine=_engine(f.engine, s.get("engine_note", "")),
            errors_section=_errors(f),
            after=run.after,
        )
        + _drill(run.drill)
        + (
            "\n\n## Problems\n\n" + "\n".join(f"- {p}" for p in run.problems)
            if run.problems
            else ""
        )
        + "\n"
    )


def _protocol(protocol: str) -> str:
    return {
        "openai": "the OpenAI-compatible API (`POST /v1/completions`, `stream: true`, SSE)",
        "grpc": "gRPC streams straight to `ensemble_stream`",
    }.get(protocol, protocol)


def _engine(e: EngineFigures | None, reason: str) -> str:
    if e is None:
        return _fill("no_engine", reason=reason or "unknown")
    reuse = e.reuse_note
    if e.reused_tokens is not None:
        reuse = f"{e.reused_tokens:,.0f} tokens ({percent(e.reuse_share, 1)}); {e.reuse_note}"
    bound = (
        "Over SSE a piece read counts as one token (it carries one or more), so this is an "
        "upper bound."
        if e.wasted_is_upper_bound
        else "Over gRPC each piece says how many tokens it carries: exact."
    )
    return _fill(
        "engine",
        sequences=f"{e.sequences:,.0f}",
        cancelled=f"{e.cancelled:,.0f}",
        generated=f"{e.generated_tokens:,.0f}",
        delivered=f"{e.delivered_tokens:,}",
        wasted=("at most " if e.wasted_is_upper_bound else "") + f"{e.wasted_tokens:,.0f}",
        wasted_per=number(e.wasted_per_abandoned, 1),
        prefilled=number(e.prompt_tokens_per_request, 0),
        reuse=reuse,
        bound=bound,
    )


def _drill(d: DrillFigures | None) -> str:
    if d is None:
        return ""
    per = "-" if d.unread_per_abandoned is None else f"at most {d.unread_per_abandoned:.2f}"
    generated = "unread" if d.generated is None else f"{d.generated:,.0f}"
    return (
        f"\n\nAbandonment drill (after the typing, one at a time): {d.requests} requests of "
        f"{d.max_tokens} tokens, each abandoned at its first piece: {d.abandoned} abandoned, "
        f"{d.answered} answered, {d.errors} errors; the engine generated {generated} tokens, "
        f"the clients read {d.tokens_read}: tokens generated after the client left, {per} per "
        f"abandoned request (an upper bound: {d.bound})"
        + (
            f"; each abandoned request alone: median {float(np.median(d.unread_each)):.1f}, "
            f"most {max(d.unread_each):.0f}."
            if d.unread_each
            else "."
        )
        + (f" Errors: {'; '.join(d.error_messages[:5])}" if d.error_messages else "")
    )


def _errors(f: EditorFigures) -> str:
    if not f.error_messages:
        return "Errors: none."
    lines = ["Errors:", "", "| count | message |", "|---:|---|"]
    for message, count in f.error_messages.items():
        lines.append(f"| {count} | {message.replace('|', chr(92) + '|')} |")
    return "\n".join(lines)


# --- charts ----------------------------------------------------------------------------------


def chart_timeline(records: Sequence[EditorRecord], path: Path, title: str) -> Path:
    """Requests ended per second by outcome, above each answered request's first token with
    rolling percentiles."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.4), sharex=True)
    end = max((r.t_s + r.pause_s for r in records), default=1.0)
    seconds = np.arange(int(np.ceil(end)) + 1)
    bottom_of = np.zeros(len(seconds))
    for outcome in (ANSWERED, ABANDONED, ERROR):
        times = [r.t_s for r in records if r.outcome == outcome]
        counts = np.bincount(np.floor(times).astype(int), minlength=len(seconds))[: len(seconds)]
        if counts.any():
            top.bar(
                seconds + 0.5,
                counts,
                width=1.0,
                bottom=bottom_of,
                color=OUTCOME_COLORS[outcome],
                label=outcome,
            )
            bottom_of = bottom_of + counts
    top.set_ylabel("requests sent / s")
    top.legend(loc="upper right", fontsize=8)
    top.grid(True, alpha=0.3)
    answered = [r for r in records if r.outcome == ANSWERED and r.first_token_ms is not None]
    times = np.array([r.t_s for r in answered], dtype=float)
    ttft = np.array([r.first_token_ms for r in answered], dtype=float)
    grid = np.arange(0.0, end + 0.01, 0.5)
    labels = ("answered: first token", "first token (ms)", "seconds since the typists started")
    latency_panel(bottom, times, ttft, grid, 10.0, labels)
    return save_figure(fig, path, title, dpi=100)


def chart_latency(records: Sequence[EditorRecord], path: Path, title: str) -> Path:
    """Cumulative distributions: first token and latency of the answered requests against
    the pauses (a request is answered only when its latency is shorter than its pause)."""
    fig, ax = plt.subplots(figsize=(8, 4.6))
    series = (
        ("first token (answered)", [r.first_token_ms for r in records if r.outcome == ANSWERED]),
        ("latency (answered)", [r.latency_ms for r in records if r.outcome == ANSWERED]),
        ("pause (every request)", [r.pause_s * 1000 for r in records]),
    )
    for (label, values), color in zip(series, ("#1f77b4", "#2ca02c", "#7f7f7f"), strict=True):
        data = np.sort(np.array([v for v in values if v is not None], dtype=float))
        if len(data):
            share = np.arange(1, len(data) + 1) / len(data)
            ax.step(data, share, where="post", label=label, color=color)
    ax.set_xscale("log")
    ax.set_xlabel("ms (log scale)")
    ax.set_ylabel("share of requests at or below")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return save_figure(fig, path, title)
