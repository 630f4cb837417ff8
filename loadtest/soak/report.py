"""The soak's run folder, built from the request-event table (``events.csv``) and the run's
other findings: summary.json, report.md, soak.png and samples.csv, and the table it prints at
the end."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from loadtest.soak import checks
from loadtest.soak.cases import ALL_KINDS, OK
from loadtest.soak.checks import FAIL
from loadtest.soak.server import Sample
from reporting.charts import plt, save_figure, shade_phases
from reporting.events import markdown

KIND_COLUMNS = ["kind", "sent", "ok", "rejected", "abandoned", "unanswered", "unexpected",
                "p50 s", "p99 s"]  # fmt: skip
CHECK_COLUMNS = ["check", "result", "detail"]
MEASURED = ("soak", "editor")  # the phases the accounting covers
COLORS = {"ramp": "#fff2cc", "soak": "#e2f0d9", "editor": "#e4dff2", "drain": "#deebf7",
          "drill": "#f8cbad"}  # fmt: skip


def plain(value: Any) -> Any:
    """``value`` as JSON can hold it (dataclasses as dicts, NaN and inf as null)."""
    if is_dataclass(value) and not isinstance(value, type):
        return plain(asdict(value))
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, float | np.floating):
        return float(value) if np.isfinite(value) else None
    return value.item() if isinstance(value, np.integer | np.bool_) else value


def table(frame: pd.DataFrame, digits: int = 1) -> str:
    """A Markdown table, whole numbers kept whole and missing figures as "-"."""
    return markdown(frame.astype(object).where(frame.notna(), None), digits=digits)


def measured(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of the phases the accounting covers, with every soak column."""
    return checks.soak_rows(frame[frame["window"].isin(MEASURED)])


def failed(result: dict[str, Any]) -> list[str]:
    return [c.name for c in result["checks"] if c.status == FAIL]


def render_report(result: dict[str, Any], frame: pd.DataFrame) -> str:
    """report.md: the checks first, then the tables that back them."""
    s, sat = result["settings"], result["saturation"]
    rows = measured(frame)
    case_table, errors = checks.cases(rows), checks.error_messages(rows)
    lines = [
        f"# Soak test {result['started_at']}",
        "",
        f"Server: {result['server'].get('description', '?')}. Machine: {s['machine']}. "
        f"Wall time {result['wall_s']:.0f} s.",
        "",
        f"Load: {s['clients']} closed-loop clients (2 x saturation {sat['clients']}) for "
        f"{s['duration_s']:.0f} s, {s['max_tokens']} tokens per valid request, deadline "
        f"{s['deadline_s']:.0f} s.",
        "",
        "## Checks",
        "",
        table(
            pd.DataFrame([asdict(c) for c in result["checks"]]).set_axis(
                ["check", "result", "detail"], axis=1
            )
        ),
        "",
        "## Requests by kind (soak and editor phases)",
        "",
        table(checks.kinds(rows)[KIND_COLUMNS], digits=2),
        "",
        "p50/p99: latency of the accepted requests (for streams, to the last piece).",
        "",
        "## Saturation",
        "",
        _saturation(sat),
        "",
    ]
    if not case_table.empty:
        lines += ["## Invalid and hostile cases", "", table(case_table), ""]
    lines += ["## Error texts", "", table(errors) if not errors.empty else "None.", ""]
    rss = result["rss"]
    lines += ["## Memory", "", rss.note if rss else result["rss_note"], ""]
    lines += ["## Editor phase", "", *_editor(result["editor"]), ""]
    lines += [
        "## Stalls",
        "",
        "The longest time, per phase, with requests in flight and none answered in full or "
        f"streaming its first text (bound: max({s['max_stall_s']} s, {checks.STALL_FACTOR} x "
        "one request alone just before the phase), loadtest/soak/checks.py):",
        "",
        *(f"- {checks.stall_line(stall)}" for stall in result["stalls"]),
        "",
        "## Drain and engine",
        "",
        *(f"- {k}: {v}" for k, v in {**result["drain"], **result["engine"]}.items()),
        "",
        "## Stub-kill drill",
        "",
        *_drill(result["drill"]),
        "",
        "![RSS and latency over time](soak.png)",
        "",
    ]
    return "\n".join(lines)


def _saturation(sat: dict[str, Any]) -> str:
    if not sat["steps"]:
        return f"Given: {sat['clients']} clients ({sat['note']})."
    steps = pd.DataFrame(sat["steps"])[["clients", "rps", "tokens_per_s"]]
    steps.columns = ["clients", "requests/s", "tokens/s"]
    return table(steps, digits=2) + "\n\n" + sat["note"]


def _editor(editor: dict[str, Any]) -> list[str]:
    """The editor phase: what the typists did (loadtest.soak.editor_phase)."""
    if not editor.get("done"):
        return [str(editor.get("error") or editor.get("note") or "not run")]
    f, suffix = editor["figures"], editor["suffix"]
    first, latency = f["first_token_ms"], f["latency_ms"]
    lines = [
        f"{editor['typists']} typists for {editor['duration_s']:.0f} s through the OpenAI API "
        f"(SSE), {editor['max_tokens']} tokens per completion, prompts up to "
        f"{editor['prompt_budget_tokens']} tokens; each request abandoned at the next keystroke.",
        "",
        f"- requests {f['requests']}: answered {f['answered']}, abandoned {f['abandoned']}, "
        f"errors {f['errors']}",
        f"- first token p50 / p95 (answered): {first['p50'] or 0:.0f} / {first['p95'] or 0:.0f} "
        f"ms; latency p50 / p95: {latency['p50'] or 0:.0f} / {latency['p95'] or 0:.0f} ms",
        f"- prompt tokens sent per request: {f['prompt_tokens_sent'] or 0:.0f}",
        f"- suffix: {suffix['note']}",
    ]
    return (
        [f"**{suffix['note']}**", ""] if not suffix["send"] and suffix["requested"] else []
    ) + lines


def _drill(drill: dict[str, Any]) -> list[str]:
    if not drill.get("done"):
        return [str(drill.get("note", "not run"))]
    keys = ("stub", "killed_at", "launcher_exit", "tritonserver_exit", "stub_restarted")
    lines = [str(drill["note"]), "", *(f"- {k}: {drill[k]}" for k in keys if k in drill)]
    timeline = pd.DataFrame(drill["timeline"], columns=["t_s", "what", "value"])
    timeline.columns = ["t after kill (s)", "what", "became"]
    lines += ["", table(timeline)]
    if drill["in_flight"]:
        lines += ["", "Requests in flight when the stub died:", ""]
        lines += [f"- {r['transport']}: {r['status']} {r['category']} {r['message'][:200]}"
                  for r in drill["in_flight"]]  # fmt: skip
    return lines


def console_table(result: dict[str, Any], frame: pd.DataFrame) -> str:
    """What the soak prints at the end: the accounting table and the checks."""
    kinds = checks.kinds(measured(frame))[KIND_COLUMNS]
    text = kinds.to_string(index=False, na_rep="-", float_format=lambda v: f"{v:.2f}")
    lines = ["", text, ""]
    width = max((len(c.name) for c in result["checks"]), default=10)
    lines += [f"  {c.status:4}  {c.name:<{width}}  {c.detail}" for c in result["checks"]]
    return "\n".join(lines)


def draw_chart(path: Path, samples: Sequence[Sample], frame: pd.DataFrame,
               phases: Sequence[tuple[str, float, float]], title: str) -> Path:  # fmt: skip
    """RSS over time above the latency of the accepted requests over time, phases shaded."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    rss = [(s.t_s, s.rss_bytes / 2**20) for s in samples if s.rss_bytes]
    if rss:
        top.plot(*zip(*rss, strict=True), "-", lw=1.5)
    top.set_ylabel("server RSS (MiB)\ntritonserver + stubs")
    ok = frame[frame["status"] == OK]
    for kind in ALL_KINDS:
        rows = ok[ok["kind"] == kind]
        if len(rows):
            latency = pd.to_numeric(rows["latency_ms"]) / 1000
            ended = pd.to_numeric(rows["started_s"]) + latency
            bottom.scatter(ended, latency, s=6, alpha=0.6, label=kind)
    bottom.set_ylabel("latency of accepted\nrequests (s)")
    bottom.set_xlabel("seconds since the start of the run")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
    if bottom.get_legend_handles_labels()[0]:
        bottom.legend(fontsize=8, markerscale=2, loc="upper left")
    shade_phases((top, bottom), phases, COLORS, label_axis=top)
    return save_figure(fig, path, title)


def write_run(out: Path, result: dict[str, Any], frame: pd.DataFrame, samples: Sequence[Sample],
              phases: Sequence[tuple[str, float, float]]) -> list[Path]:  # fmt: skip
    """summary.json, report.md, soak.png and samples.csv into ``out`` (events.csv is the
    run's own, written as it ends)."""
    out.mkdir(parents=True, exist_ok=True)
    frame, rows = checks.soak_rows(frame), measured(frame)
    kinds = checks.kinds(rows)
    summary = plain(
        {
            **result,
            "failed": bool(failed(result)),
            "phases": phases,
            "kinds": kinds.drop(columns="rejected").to_dict("records"),
            "cases": checks.cases(rows).to_dict("records"),
            "errors": checks.error_messages(rows).to_dict("records"),
        }
    )
    paths = [out / "summary.json", out / "report.md", out / "samples.csv"]
    paths[0].write_text(json.dumps(summary, indent=2) + "\n")
    paths[1].write_text(render_report(result, frame))
    pd.DataFrame([asdict(s) for s in samples], columns=list(Sample.__dataclass_fields__)).to_csv(
        paths[2], index=False
    )
    title = f"Soak {result['started_at']}: {result['settings']['clients']} clients"
    paths.append(draw_chart(out / "soak.png", samples, frame, phases, title))
    return paths
