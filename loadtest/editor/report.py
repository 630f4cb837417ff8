"""The editor profile's run folder, built from the event table and each window's counters:
``summary.json``, ``windows.csv``, ``report.md`` (its prose in ``report.md`` beside this
module) with the targets and the systems side by side, and two charts."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from string import Template
from typing import Any

import pandas as pd

from loadtest.editor.figures import PASS
from reporting.charts import plt, save_figure
from reporting.machine import CPU_FLAGS
from reporting.tables import number, percent, templates

TEMPLATES = Path(__file__).with_name("report.md")
TIMELINE_CHART, LATENCY_CHART = "editor_timeline.png", "editor_latency.png"
SHARES = {"abandoned share", "prompt-cache reuse share (at most)"}
INTEGERS = {"requests", "answered", "abandoned", "errors", "abandoned while streaming"}


def write_report(out: Path, events: pd.DataFrame, windows: pd.DataFrame, run: dict) -> list:
    """``run``: what summary.json holds (run.py's ``main``); the paths written."""
    paths = [out / "summary.json", out / "events.csv", out / "windows.csv", out / "report.md"]
    plain = lambda v: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else str(v)  # noqa: E731
    paths[0].write_text(json.dumps(run, indent=2, default=plain) + "\n")
    events.to_csv(paths[1], index=False)
    windows.to_csv(paths[2], index=False)
    paths[3].write_text(render(run, events))
    title = f"editor traffic, {run['settings']['typists']} typists, {run['protocol']}"
    return [*paths, *charts(events, out, title)]


def _cell(figure: str, value: Any) -> str:
    if value is None or pd.isna(value):
        return "-"
    if figure in SHARES:
        return percent(value, 1)
    return number(value, 0 if figure in INTEGERS or abs(value) >= 100 or value == int(value) else 2)


def side_by_side(figures: dict[str, dict[str, Any]]) -> str:
    """Every figure, one column per system, and the first over the second where two."""
    systems, rows = list(figures), []
    for figure in figures[systems[0]]:
        row = {"figure": figure, **{s: _cell(figure, figures[s][figure]) for s in systems}}
        if len(systems) == 2:
            a, b = (figures[s][figure] for s in systems)
            row[f"{systems[0]} / {systems[1]}"] = number(a / b, 2) if a is not None and b else "-"
        rows.append(row)
    return pd.DataFrame(rows).to_markdown(index=False)


def render(run: dict, events: pd.DataFrame) -> str:
    s, m = run["settings"], run["machine"]
    parts = {name: Template(text) for name, text in templates(TEMPLATES).items()}
    verdicts = [t.verdict for t in run["targets"]]
    failed = events[events["outcome"] == "error"]
    errors = failed.groupby(["system", "error"]).size().reset_index(name="count")
    drills = [parts["drill"].substitute(d, system=system, generated=number(d["generated"], 0),
              per="-" if d["unread_per_abandoned"] is None else
              f"at most {d['unread_per_abandoned']:.2f}",
              messages=f" Errors: {'; '.join(d['error_messages'][:3])}"
              if d["error_messages"] else "") + "\n\n"
              for system, d in run["drills"].items()]  # fmt: skip
    return parts["report"].substitute(
        s, **m, **{k: run[k] for k in ("name", "command", "started", "protocol")},
        seconds=f"{run['seconds']:.0f}", passed=verdicts.count(PASS), total=len(verdicts),
        banner=f"> **{run['suffix']['note']}**\n\n" if run["suffix"]["refused"] else "",
        targets=pd.DataFrame(map(dataclasses.asdict, run["targets"])).to_markdown(index=False),
        systems=side_by_side(run["figures"]), drills="".join(drills),
        errors=("Errors:\n\n" + errors.head(20).to_markdown(index=False)) if len(errors)
        else "Errors: none.",
        warm_up=f"{s['warm_up']:.0f}", window=f"{s['window_s']:.0f}", order=", ".join(s["order"]),
        one_line="on" if s["one_line"] else "off", pause="-".join(map(str, s["pause"])),
        suffix="sent" if run["suffix"]["send"] else "NOT SENT",
        servers="\n".join(f"- {system}: {served}" for system, served in run["servers"].items()),
        flags=", ".join(m["cpu_flags"]) or "none of " + ", ".join(CPU_FLAGS),
        load="; ".join(f"{h} {a:.2f} -> {b:.2f}" for h, (a, b) in run["load"].items()),
        problems="## Problems\n\n" + "".join(f"- {p}\n" for p in run["problems"]) + "\n"
        if run["problems"] else "",
    ) + "\n"  # fmt: skip


def charts(events: pd.DataFrame, out: Path, title: str) -> list[Path]:
    """First tokens over the run (the others where they ended), and answered ones' ECDFs."""
    (timeline_figure, timeline), (cdf_figure, cdf) = (plt.subplots(figsize=(11, 4.2)),
                                                      plt.subplots(figsize=(8, 4.6)))  # fmt: skip
    for system, rows in events.groupby("system", sort=False):
        ok, gone = rows[rows["outcome"] == "ok"], rows[rows["outcome"] != "ok"]
        timeline.plot(ok["started_s"], ok["first_token_ms"], ".", label=f"{system}: first token")
        timeline.plot(gone["started_s"], gone["latency_ms"], "x", alpha=0.5,
                      label=f"{system}: abandoned / failed, at")  # fmt: skip
        for column, style in (("first_token_ms", "--"), ("latency_ms", "-")):
            if len(data := pd.to_numeric(ok[column], errors="coerce").dropna()):
                cdf.ecdf(data, linestyle=style, label=f"{system}: {column[:-3]}")
    timeline.set(yscale="log", xlabel="seconds since the run started", ylabel="ms (log scale)")
    cdf.set(xscale="log", xlabel="ms (log scale)", ylabel="share of answered requests at or below")
    for ax, corner in ((timeline, "upper right"), (cdf, "lower right")):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc=corner)
    return [save_figure(timeline_figure, out / TIMELINE_CHART, title, dpi=100),
            save_figure(cdf_figure, out / LATENCY_CHART, title)]  # fmt: skip
