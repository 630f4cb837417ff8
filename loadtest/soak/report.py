"""The soak's run folder, built from the request-event table (``events.csv``) and the run's
other findings: summary.json, report.md, soak.png and samples.csv, and the table it prints at
the end."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from loadtest.soak import checks
from loadtest.soak.cases import ALL_KINDS, OK
from loadtest.soak.checks import FAIL
from loadtest.soak.server import Sample
from reporting.charts import plt, save_figure, shade_phases
from reporting.events import markdown

KIND_COLUMNS = ["kind", "sent", "ok", "rejected", "abandoned", "unanswered", "unexpected",
                "p50 s", "p99 s"]  # fmt: skip
COLORS = {"ramp": "#fff2cc", "soak": "#e2f0d9", "editor": "#e4dff2", "drain": "#deebf7",
          "drill": "#f8cbad"}  # fmt: skip


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """A table's rows as JSON can hold them (missing figures as null)."""
    return frame.astype(object).where(frame.notna(), None).to_dict("records")


def table(frame: pd.DataFrame, digits: int = 1) -> str:
    """A Markdown table, whole numbers kept whole and missing figures as "-"."""
    return markdown(frame.astype(object).where(frame.notna(), None), digits=digits)


def failed(result: dict[str, Any]) -> list[str]:
    return [c.name for c in result["checks"] if c.status == FAIL]


def render_report(result: dict[str, Any], frame: pd.DataFrame) -> str:
    """report.md: the checks first, then the tables that back them."""
    s, sat, rows = result["settings"], result["saturation"], checks.measured(frame)
    case_table, errors = checks.cases(rows), checks.error_messages(rows)
    check_table = pd.DataFrame([asdict(c) for c in result["checks"]])
    lines = [
        f"# Soak test {result['started_at']}", "",
        f"Server: {result['server'].get('description', '?')}. Machine: {s['machine']}. "
        f"Wall time {result['wall_s']:.0f} s.", "",
        f"Load: {s['clients']} closed-loop clients (2 x saturation {sat['clients']}) for "
        f"{s['duration']:.0f} s, {s['max_tokens']} tokens per valid request, deadline "
        f"{s['deadline']:.0f} s.", "",
        "## Checks", "", table(check_table.set_axis(["check", "result", "detail"], axis=1)), "",
        "## Requests by kind (soak and editor phases)", "",
        table(checks.kinds(rows)[KIND_COLUMNS], digits=2), "",
        "p50/p99: latency of the accepted requests (for streams, to the last piece).", "",
        "## Saturation", "", _saturation(sat), "",
    ]  # fmt: skip
    if not case_table.empty:
        lines += ["## Invalid and hostile cases", "", table(case_table), ""]
    rss = result["rss"]
    lines += [
        "## Error texts", "", table(errors) if not errors.empty else "None.", "",
        "## Memory", "", rss.note if rss else result["rss_note"], "",
        "## Editor phase", "", *_editor(result["editor"]), "",
        "## Stalls", "",
        "The longest time, per phase, with requests in flight and none answered in full or "
        f"streaming its first text (bound: max({s['max_stall']} s, {checks.STALL_FACTOR} x "
        "one request alone just before the phase), loadtest/soak/checks.py):", "",
        *(f"- {checks.stall_line(stall)}" for stall in result["stalls"]), "",
        "## Drain and engine", "",
        *(f"- {k}: {v}" for k, v in {**result["drain"], **result["engine"]}.items()), "",
        "## Stub-kill drill", "", *_drill(result["drill"]), "",
        "![RSS and latency over time](soak.png)", "",
    ]  # fmt: skip
    return "\n".join(lines)


def _saturation(sat: dict[str, Any]) -> str:
    if not sat["steps"]:
        return f"Given: {sat['clients']} clients ({sat['note']})."
    steps = pd.DataFrame(sat["steps"])[["clients", "rps", "tokens_per_s"]]
    steps.columns = ["clients", "requests/s", "tokens/s"]
    return table(steps, digits=2) + "\n\n" + sat["note"]


def _editor(editor: dict[str, Any]) -> list[str]:
    """The editor phase: what the typists did (loadtest.soak.users.editor_phase)."""
    if not editor.get("done"):
        return [str(editor.get("error") or editor.get("note") or "not run")]
    f, suffix = editor["figures"], editor["suffix"]

    def ms(key: str) -> str:
        return f"{f[key] or 0:.0f}"

    refused = not suffix["send"] and suffix["requested"]
    return [*([f"**{suffix['note']}**", ""] if refused else []),
        f"{editor['typists']} typists for {editor['duration_s']:.0f} s through the OpenAI API "
        f"(SSE), {editor['max_tokens']} tokens per completion, prompts up to "
        f"{editor['prompt_budget_tokens']} tokens; each request abandoned at the next keystroke.",
        "",
        f"- requests {f['requests']}: answered {f['answered']}, abandoned {f['abandoned']}, "
        f"errors {f['errors']}",
        f"- first token p50 / p95 (answered): {ms('first_token_p50_ms')} / "
        f"{ms('first_token_p95_ms')} ms; latency p50 / p95: {ms('latency_p50_ms')} / "
        f"{ms('latency_p95_ms')} ms",
        f"- prompt tokens sent per request: {f['prompt_tokens_sent'] or 0:.0f}",
        f"- suffix: {suffix['note']}",
    ]  # fmt: skip


def _drill(drill: dict[str, Any]) -> list[str]:
    if not drill.get("done"):
        return [str(drill.get("note", "not run"))]
    keys = ("stub", "killed_at", "launcher_exit", "tritonserver_exit", "stub_restarted")
    timeline = pd.DataFrame(drill["timeline"], columns=["t_s", "what", "value"])
    timeline.columns = ["t after kill (s)", "what", "became"]
    lines = [str(drill["note"]), "", *(f"- {k}: {drill[k]}" for k in keys), "", table(timeline)]
    if drill["in_flight"]:
        lines += ["", "Requests in flight when the stub died:", ""]
        lines += [f"- {r['transport']}: {r['status']} {r['category']} {r['message'][:200]}"
                  for r in drill["in_flight"]]  # fmt: skip
    return lines


def console_table(result: dict[str, Any], frame: pd.DataFrame) -> str:
    """What the soak prints at the end: the accounting table and the checks."""
    kinds = checks.kinds(checks.measured(frame))[KIND_COLUMNS]
    text = kinds.to_string(index=False, na_rep="-", float_format=lambda v: f"{v:.2f}")
    width = max((len(c.name) for c in result["checks"]), default=10)
    return "\n".join(["", text, "", *(f"  {c.status:4}  {c.name:<{width}}  {c.detail}"
                                      for c in result["checks"])])  # fmt: skip


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
    frame, rows = checks.soak_rows(frame), checks.measured(frame)
    summary = {**result, "failed": bool(failed(result)), "phases": phases,
               "kinds": records(checks.kinds(rows).drop(columns="rejected")),
               "cases": records(checks.cases(rows)),
               "errors": records(checks.error_messages(rows))}  # fmt: skip
    paths = [out / "summary.json", out / "report.md", out / "samples.csv"]
    paths[0].write_text(json.dumps(summary, indent=2, default=_json) + "\n")
    paths[1].write_text(render_report(result, frame))
    columns = list(Sample.__dataclass_fields__)
    pd.DataFrame(map(asdict, samples), columns=columns).to_csv(paths[2], index=False)
    title = f"Soak {result['started_at']}: {result['settings']['clients']} clients"
    return [*paths, draw_chart(out / "soak.png", samples, frame, phases, title)]


def _json(value: Any) -> Any:
    """What json cannot write itself: dataclasses as dicts, numpy numbers as numbers, paths
    as text."""
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    return value.item() if hasattr(value, "item") else str(value)
