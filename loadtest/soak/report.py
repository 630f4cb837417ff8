"""The soak's run folder from the request-event table and the run's other findings:
summary.json, report.md, soak.png and samples.csv, and the table it prints at the end."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from string import Template
from typing import Any

import pandas as pd

from loadtest.soak import checks
from loadtest.soak.cases import OK
from loadtest.soak.checks import FAIL
from loadtest.soak.drill import SAMPLE_COLUMNS
from reporting.charts import plt, save_figure, shade_phases
from reporting.events import markdown
from reporting.tables import templates

KIND_COLUMNS = [
    "kind",
    "sent",
    "ok",
    "rejected",
    "abandoned",
    "unanswered",
    "unexpected",
    "p50 s",
    "p99 s",
]
TEMPLATES = Path(__file__).with_name("report.md")
COLORS = {
    "ramp": "#fff2cc",
    "soak": "#e2f0d9",
    "editor": "#e4dff2",
    "drain": "#deebf7",
    "drill": "#f8cbad",
}


def _plain(frame: pd.DataFrame) -> pd.DataFrame:
    """Missing figures as None: null in JSON, "-" in Markdown, whole numbers kept whole."""
    return frame.astype(object).where(frame.notna(), None)


def table(frame: pd.DataFrame, digits: int = 1) -> str:
    return markdown(_plain(frame), digits=digits)


def failed(result: dict[str, Any]) -> list[str]:
    return [c.name for c in result["checks"] if c.status == FAIL]


def render_report(result: dict[str, Any], frame: pd.DataFrame) -> str:
    """report.md: the checks first, then the tables that back them (prose: report.md here)."""
    s, sat, rows = result["settings"], result["saturation"], checks.measured(frame)
    case_table, errors = checks.cases(rows), checks.error_messages(rows)
    check_table = pd.DataFrame([asdict(c) for c in result["checks"]])
    memory = next((c.detail for c in result["checks"] if c.name == checks.RSS_CHECK), "")
    return (
        Template(templates(TEMPLATES)["report"]).substitute(
            started_at=result["started_at"],
            server=result["server"].get("description", "?"),
            machine=s["machine"],
            wall=f"{result['wall_s']:.0f}",
            clients=s["clients"],
            saturation=sat["clients"],
            duration=f"{s['duration']:.0f}",
            max_tokens=s["max_tokens"],
            deadline=f"{s['deadline']:.0f}",
            max_stall=s["max_stall"],
            stall_factor=checks.STALL_FACTOR,
            checks=table(check_table.set_axis(["check", "result", "detail"], axis=1)),
            kinds=table(checks.kinds(rows)[KIND_COLUMNS], digits=2),
            ramp=_saturation(sat),
            cases=""
            if case_table.empty
            else f"## Invalid and hostile cases\n\n{table(case_table)}\n\n",
            errors=table(errors) if not errors.empty else "None.",
            memory=memory,
            editor=_editor(result["editor"]),
            stalls="\n".join(f"- {checks.stall_line(stall)}" for stall in result["stalls"]),
            drain="\n".join(f"- {k}: {v}" for k, v in result["drain"].items()),
            drill="\n".join(_drill(result["drill"])),
        )
        + "\n"
    )


def _saturation(sat: dict[str, Any]) -> str:
    if not sat["steps"]:
        return f"Given: {sat['clients']} clients ({sat['note']})."
    steps = pd.DataFrame(sat["steps"])[["clients", "rps", "tokens_per_s"]]
    steps.columns = ["clients", "requests/s", "tokens/s"]
    return table(steps, digits=2) + "\n\n" + sat["note"]


def _editor(editor: dict[str, Any]) -> str:
    if not editor.get("done"):
        return str(editor.get("error") or editor.get("note") or "not run")
    f, suffix = editor["figures"], editor["suffix"]
    refused = not suffix["send"] and suffix["requested"]
    return Template(templates(TEMPLATES)["editor"]).substitute(
        {k: f"{v or 0:.0f}" for k, v in f.items()},
        typists=editor["typists"],
        duration=f"{editor['duration_s']:.0f}",
        max_tokens=editor["max_tokens"],
        budget=editor["prompt_budget_tokens"],
        file_budget=editor.get("file_budget_tokens", editor["prompt_budget_tokens"]),
        suffix=suffix["note"],
        refused=f"**{suffix['note']}**\n\n" if refused else "",
    )


def _drill(drill: dict[str, Any]) -> list[str]:
    if not drill.get("done"):
        return [str(drill.get("note", "not run"))]
    keys = ("stub", "killed_at", "launcher_exit", "tritonserver_exit", "stub_restarted")
    timeline = pd.DataFrame(drill["timeline"], columns=["t_s", "what", "value"])
    timeline.columns = ["t after kill (s)", "what", "became"]
    lines = [str(drill["note"]), "", *(f"- {k}: {drill[k]}" for k in keys), "", table(timeline)]
    if drill["in_flight"]:
        lines += ["", "Requests in flight when the stub died:", ""]
        lines += [
            f"- {r['transport']}: {r['status']} {r['category']} {r['message'][:200]}"
            for r in drill["in_flight"]
        ]
    return lines


def console_table(result: dict[str, Any], frame: pd.DataFrame) -> str:
    """What the soak prints at the end: the accounting table and the checks."""
    kinds = checks.kinds(checks.measured(frame))[KIND_COLUMNS]
    text = kinds.to_string(index=False, na_rep="-", float_format=lambda v: f"{v:.2f}")
    width = max((len(c.name) for c in result["checks"]), default=10)
    return "\n".join(
        [
            "",
            text,
            "",
            *(f"  {c.status:4}  {c.name:<{width}}  {c.detail}" for c in result["checks"]),
        ]
    )


def draw_chart(
    path: Path,
    samples: Sequence[dict[str, Any]],
    frame: pd.DataFrame,
    phases: Sequence[tuple[str, float, float]],
    title: str,
) -> Path:
    """RSS over time above the latency of the accepted requests over time, phases shaded."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    rss = [(s["t_s"], s["rss_bytes"] / 2**20) for s in samples if s["rss_bytes"]]
    if rss:
        top.plot(*zip(*rss, strict=True), "-", lw=1.5)
    top.set_ylabel("server RSS (MiB)\ntritonserver + stubs")
    for kind, rows in frame[frame["status"] == OK].groupby("kind", sort=False):
        latency = pd.to_numeric(rows["latency_ms"]) / 1000
        ended = pd.to_numeric(rows["started_s"]) + latency
        bottom.scatter(ended, latency, s=6, alpha=0.6, label=kind)
    bottom.set_ylabel("latency of accepted\nrequests (s)")
    bottom.set_xlabel("seconds since the start of the run")
    top.grid(True, alpha=0.3)
    bottom.grid(True, alpha=0.3)
    if bottom.get_legend_handles_labels()[0]:
        bottom.legend(fontsize=8, markerscale=2, loc="upper left")
    shade_phases((top, bottom), phases, COLORS, label_axis=top)
    return save_figure(fig, path, title)


def write_run(
    out: Path,
    result: dict[str, Any],
    frame: pd.DataFrame,
    samples: Sequence[dict],
    phases: Sequence[tuple[str, float, float]],
) -> list[Path]:
    """summary.json, report.md, soak.png and samples.csv (events.csv: the run's own)."""
    out.mkdir(parents=True, exist_ok=True)
    frame, rows = checks.soak_rows(frame), checks.measured(frame)
    summary = {
        **result,
        "failed": bool(failed(result)),
        "phases": phases,
        "kinds": _plain(checks.kinds(rows).drop(columns="rejected")).to_dict("records"),
        **{
            k: _plain(f(rows)).to_dict("records")
            for k, f in (("cases", checks.cases), ("errors", checks.error_messages))
        },
    }
    paths = [out / "summary.json", out / "report.md", out / "samples.csv"]
    text = json.dumps(
        summary,
        indent=2,
        default=lambda v: asdict(v) if is_dataclass(v) else getattr(v, "item", v.__str__)(),
    )
    paths[0].write_text(text + "\n")
    paths[1].write_text(render_report(result, frame))
    pd.DataFrame(samples, columns=SAMPLE_COLUMNS).to_csv(paths[2], index=False)
    title = f"Soak {result['started_at']}: {result['settings']['clients']} clients"
    return [*paths, draw_chart(out / "soak.png", samples, frame, phases, title)]
