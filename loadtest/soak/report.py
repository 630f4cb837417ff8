"""The soak's run folder: summary.json, report.md, soak.png, requests.csv and rss.csv, and the
table it prints at the end, all drawn from a :class:`~loadtest.soak.results.SoakResult`."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.soak.cases import (
    ALL_KINDS,
    CATEGORIES,
    OK,
    STATUSES,
)
from loadtest.soak.results import (
    KindSummary,
    Record,
    SoakResult,
)
from loadtest.soak.server import RssSample
from reporting.charts import plt, save_figure, shade_phases
from reporting.tables import number, table, text_table

# --- the run folder ------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return {k: _plain(v) for k, v in asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


def write_rows(path: Path, kind: type, rows: Iterable[Any]) -> None:
    """Dataclass rows of ``kind`` as a CSV file, one column per field."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(kind.__dataclass_fields__)
        writer.writerows(asdict(row).values() for row in rows)


def _kinds(rows: Sequence[KindSummary]) -> tuple[list[str], list[list[object]]]:
    """The accounting table's header and rows: one row per kind, then the total."""
    header = ["kind", "sent", "ok", "rejected", "abandoned", "unanswered", "unexpected"]
    cells: list[list[object]] = []
    for r in rows:
        rejected = ", ".join(f"{c} {r.rejected[c]}" for c in CATEGORIES if r.rejected.get(c))
        cells.append(
            [r.kind, r.sent, r.ok, rejected or "0", r.abandoned, r.unanswered, r.unexpected,
             number(r.p50_s, 2), number(r.p99_s, 2)]
        )  # fmt: skip
    return [*header, "p50 s", "p99 s"], cells


KINDS_ALIGN = "lrrlrrrrr"


def kinds_table(rows: Sequence[KindSummary]) -> list[str]:
    """The accounting table, in Markdown."""
    return table(*_kinds(rows), KINDS_ALIGN)


def render_report(result: SoakResult) -> str:
    """report.md: the checks first, then the tables that back them."""
    s, srv = result.settings, result.server
    lines = [
        f"# Soak test {result.started_at}",
        "",
        f"Server: {srv.get('description', '?')}. Machine: {s.get('machine', '?')}. "
        f"Wall time {result.wall_s:.0f} s.",
        "",
        f"Load: {s.get('clients')} closed-loop clients (2 x saturation "
        f"{result.saturation.get('clients')}) for {s.get('duration_s'):.0f} s, "
        f"{s.get('max_tokens')} tokens per valid request, deadline {s.get('deadline_s'):.0f} s.",
        "",
        "## Checks",
        "",
        *table(
            ["check", "result", "detail"], [(c.name, c.status, c.detail) for c in result.checks]
        ),
        "",
        "## Requests by kind (soak phase)",
        "",
        *kinds_table([*result.kinds, result.total]),
        "",
        "p50/p99: latency of the accepted requests (for streams, to the last piece).",
        "",
        "## Saturation",
        "",
        _saturation_text(result.saturation),
        "",
    ]
    if result.cases:
        header = ["case", "kind", "sent", "must be", "as expected", "outcomes", "message"]
        cells = [
            (c.case, c.kind, c.sent, c.expect, c.as_expected,
             ", ".join(f"{k} {v}" for k, v in c.outcomes.items()), _cell(c.sample_message, 160))
            for c in result.cases
        ]  # fmt: skip
        lines += ["## Invalid and hostile cases", "", *table(header, cells, "llrlr"), ""]
    lines += ["## Error texts", ""]
    if result.errors:
        cells = [(e["category"], e["count"], _cell(e["message"], 200)) for e in result.errors]
        lines += table(["category", "count", "message"], cells, "lr")
    else:
        lines.append("None.")
    lines += [
        "",
        "## Memory",
        "",
        result.rss.note if result.rss else result.rss_note,
        "",
        "## Editor phase",
        "",
        *_editor_lines(result.editor),
        "",
        "## Stalls",
        "",
        "The longest time, per phase, with requests in flight and none answered in full or "
        f"streaming its first text (bound: max({result.settings.get('max_stall_s', '?')} s, "
        "8 x one request alone just before the phase), loadtest/soak/stall.py):",
        "",
        *(
            f"- {_get(s, 'phase')}: {_get(s, 'seconds')} s"
            + (f" from t={_get(s, 'at_s')} s" if _get(s, "at_s") is not None else "")
            + f", {_get(s, 'progress_events')} progress events, bound {_get(s, 'bound_s')} s"
            + f" (one request alone: {_get(s, 'reference_s')} s)"
            + (f"; engine meanwhile: {_get(s, 'engine')}" if _get(s, "engine") else "")
            for s in result.stalls
        ),
        "",
        "## Drain and engine",
        "",
        *(f"- {k}: {v}" for k, v in result.drain.items()),
        *(f"- {k}: {v}" for k, v in result.engine.items()),
        "",
        "## Stub-kill drill",
        "",
        *_drill_lines(result.drill),
        "",
        "![RSS and latency over time](soak.png)",
        "",
    ]
    return "\n".join(lines)


def _cell(text: str, limit: int) -> str:
    """At most ``limit`` characters of ``text`` (the table puts it on one line)."""
    return text[:limit]


def _get(item: Any, key: str) -> Any:
    return item[key] if isinstance(item, dict) else getattr(item, key)


def _editor_lines(editor: dict[str, Any]) -> list[str]:
    """The editor phase: what the typists did (loadtest.soak.editor_phase)."""
    if not editor.get("done"):
        return [str(editor.get("error") or editor.get("note") or "not run")]
    f, suffix = editor["figures"], editor["suffix"]
    lines = [
        f"{editor['typists']} typists for {editor['duration_s']:.0f} s through the OpenAI API "
        f"(SSE), {editor['max_tokens']} tokens per completion, prompts up to "
        f"{editor['prompt_budget_tokens']} tokens; each request abandoned at the next keystroke.",
        "",
        f"- requests {f['requests']}: answered {f['answered']}, abandoned {f['abandoned']}, "
        f"errors {f['errors']}",
        f"- first token p50 / p95 (answered): {number(f['first_token_ms']['p50'], 0)} / "
        f"{number(f['first_token_ms']['p95'], 0)} ms; latency p50 / p95: "
        f"{number(f['latency_ms']['p50'], 0)} / {number(f['latency_ms']['p95'], 0)} ms",
        f"- prompt tokens sent per request: {number(f['prompt_tokens_sent'], 0)}",
        f"- suffix: {suffix['note']}",
    ]
    if not suffix["send"] and suffix["requested"]:
        lines.insert(0, f"**{suffix['note']}**\n")
    return lines


def _saturation_text(saturation: dict[str, Any]) -> str:
    steps = saturation.get("steps") or []
    if not steps:
        return f"Given: {saturation.get('clients')} clients ({saturation.get('note', '')})."
    cells = [(s["clients"], f"{s['rps']:.2f}", f"{s['tokens_per_s']:.0f}") for s in steps]
    rows = table(["clients", "requests/s", "tokens/s"], cells, "rrr")
    return "\n".join([*rows, "", saturation.get("note", "")])


def _drill_lines(drill: dict[str, Any]) -> list[str]:
    if not drill.get("done"):
        return [str(drill.get("note", "not run"))]
    lines = [str(drill.get("note", "")), ""]
    for key in ("stub", "killed_at", "launcher_exit", "tritonserver_exit", "stub_restarted"):
        if key in drill:
            lines.append(f"- {key}: {drill[key]}")
    timeline = [
        (f"{e['t_s']:.1f}", e["what"], _cell(str(e["value"]), 200))
        for e in drill.get("timeline", [])
    ]
    lines += ["", *table(["t after kill (s)", "what", "became"], timeline, "r")]
    in_flight = drill.get("in_flight", [])
    if in_flight:
        lines += ["", "Requests in flight when the stub died:", ""]
        lines += [
            f"- {r['transport']}: {r['status']} {r['category']} {r['message'][:200]}"
            for r in in_flight
        ]
    return lines


def console_table(result: SoakResult) -> str:
    """What the soak prints at the end: the accounting table and the checks."""
    lines = ["", *text_table(*_kinds([*result.kinds, result.total]), KINDS_ALIGN), ""]
    width = max((len(c.name) for c in result.checks), default=10)
    lines += [f"  {c.status:4}  {c.name:<{width}}  {c.detail}" for c in result.checks]
    return "\n".join(lines)


def draw_chart(
    path: Path,
    samples: Sequence[RssSample],
    records: Sequence[Record],
    phases: Sequence[tuple[str, float, float]],
    title: str,
) -> Path:
    """RSS over time above the latency of the accepted requests over time, phases shaded."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    if samples:
        top.plot([s.t_s for s in samples], [s.rss_bytes / 2**20 for s in samples], "-", lw=1.5)
    top.set_ylabel("server RSS (MiB)\ntritonserver + stubs")
    top.grid(True, alpha=0.3)
    for kind in ALL_KINDS:
        points = [
            (r.started_s + (r.latency_s or 0), r.latency_s)
            for r in records
            if r.kind == kind and r.status == OK and r.latency_s is not None
        ]
        if points:
            xs, ys = zip(*points, strict=True)
            bottom.scatter(xs, ys, s=6, alpha=0.6, label=kind)
    bottom.set_ylabel("latency of accepted\nrequests (s)")
    bottom.set_xlabel("seconds since the start of the run")
    bottom.grid(True, alpha=0.3)
    if bottom.get_legend_handles_labels()[0]:
        bottom.legend(fontsize=8, markerscale=2, loc="upper left")
    colors = {
        "ramp": "#fff2cc",
        "soak": "#e2f0d9",
        "editor": "#e4dff2",
        "drain": "#deebf7",
        "drill": "#f8cbad",
    }
    shade_phases((top, bottom), phases, colors, label_axis=top)
    return save_figure(fig, path, title)


def write_run(
    out: Path,
    result: SoakResult,
    records: Sequence[Record],
    samples: Sequence[RssSample],
    phases: Sequence[tuple[str, float, float]],
) -> list[Path]:
    """summary.json, report.md, soak.png, requests.csv and rss.csv into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    summary = _plain(result)
    summary["failed"] = result.failed
    summary["statuses"] = list(STATUSES)
    paths = [out / "summary.json", out / "report.md", out / "requests.csv", out / "rss.csv"]
    paths[0].write_text(json.dumps(summary, indent=2) + "\n")
    paths[1].write_text(render_report(result))
    write_rows(paths[2], Record, records)
    write_rows(paths[3], RssSample, samples)
    title = f"Soak {result.started_at}: {result.settings.get('clients')} clients"
    paths.append(draw_chart(out / "soak.png", samples, records, phases, title))
    return paths
