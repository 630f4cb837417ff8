"""The editor profile's run folder, built from the event table alone (plus each window's
counter readings): ``events.csv`` (every request, :mod:`reporting.events`), ``windows.csv``,
``summary.json``, ``report.md`` with the targets and the systems side by side, and two charts.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from loadtest.editor.compare import PASS, Target
from loadtest.results import MachineInfo
from reporting.charts import plt, save_figure
from reporting.machine import CPU_FLAGS
from reporting.tables import number, percent

TIMELINE_CHART, LATENCY_CHART = "editor_timeline.png", "editor_latency.png"
SHARES = {"abandoned share", "prompt-cache reuse share (at most)"}
INTEGERS = {"requests", "answered", "abandoned", "errors", "abandoned while streaming"}


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
    figures: dict[str, dict[str, Any]]  # system: figure: value (figures.system_figures)
    drills: dict[str, dict[str, Any]]  # system: DrillFigures as a dict
    afters: dict[str, str]  # system: how it answered right after the run
    targets: list[Target]
    problems: list[str]
    machine: MachineInfo
    servers: dict[str, str]  # system: what it served
    load: dict[str, tuple[float, float]]  # system: 1-minute load average before, after

    @property
    def all_pass(self) -> bool:
        return all(t.verdict == PASS for t in self.targets)


def write_report(out: Path, run: EditorRun, events: pd.DataFrame, windows: pd.DataFrame):
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "summary.json", out / "windows.csv", out / "report.md"]
    paths[0].write_text(json.dumps(dataclasses.asdict(run), indent=2, default=str) + "\n")
    windows.to_csv(paths[1], index=False)
    paths[2].write_text(render(run, events))
    title = f"editor traffic, {run.settings['typists']} typists, {run.protocol}"
    return [*paths, chart_timeline(events, out / TIMELINE_CHART, title),
            chart_latency(events, out / LATENCY_CHART, title)]  # fmt: skip


def _cell(figure: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "-"
    if figure in SHARES:
        return percent(value, 1)
    whole = figure in INTEGERS or abs(value) >= 100 or float(value).is_integer()
    return number(value, 0 if whole else 2)


def side_by_side(figures: dict[str, dict[str, Any]]) -> str:
    """Every figure, one column per system, and the first over the second where two."""
    systems = list(figures)
    rows = []
    for figure in figures[systems[0]]:
        row = {"figure": figure, **{s: _cell(figure, figures[s][figure]) for s in systems}}
        if len(systems) == 2:
            a, b = (figures[s][figure] for s in systems)
            row[f"{systems[0]} / {systems[1]}"] = number(a / b, 2) if a is not None and b else "-"
        rows.append(row)
    return pd.DataFrame(rows).to_markdown(index=False)


def render(run: EditorRun, events: pd.DataFrame) -> str:
    s, m = run.settings, run.machine
    verdicts = [t.verdict for t in run.targets]
    targets = pd.DataFrame([dataclasses.asdict(t) for t in run.targets])
    lines = [
        f"# Editor traffic: {run.name}", "",
        f"Started {run.started}, {run.seconds:.0f} s. Command: `{run.command}`", "",
        *([f"> **{run.suffix['note']}**", ""] if run.suffix["refused"] else []),
        "## Targets", "", f"{verdicts.count(PASS)} of {len(verdicts)} PASS.", "",
        targets.to_markdown(index=False), "",
        "## Systems side by side", "", side_by_side(run.figures), "",
        "Answered: the whole completion arrived before the typist's next keystroke; first token "
        "and latency are of those (with the one-line stop, latency is the one-line completion's "
        "end to end). Generated for abandoned, unread: each server's own generated-tokens "
        "counter over its windows minus the tokens readers got, so every token generated after "
        "a client left plus any still in transit: an upper bound (over SSE a piece read counts "
        "as one token). CPU: user + system seconds of each server's process tree (psutil) over "
        "its windows, the API in front of Triton included.", "",
        *_drills(run.drills), *_errors(events), "",
        "## Settings", "",
        f"- {s['typists']} typists, after {s.get('warm_up_s', 0):.0f} s of uncounted typing on "
        f"each system, windows of {s['window_s']:.0f} s, {s['windows']} per system "
        f"in mirrored order ({', '.join(s['order'])}), over {run.protocol}, seed {s['seed']}, "
        f"{s['max_tokens']} tokens per completion, one-line stop {'on' if s['one_line'] else 'off'}"
        f", t_max_predict_ms {s['t_max_predict_ms']}, n_indent the cursor line's indentation, "
        f"pauses {s['pause_s'][0]}-{s['pause_s'][1]} s, prompts up to {s['prompt_tokens']} "
        f"tokens (context {s['context']}), suffix "
        f"{'sent' if run.suffix['send'] else 'NOT SENT'}, prefix cut anchored in steps of "
        f"{s['anchor_chars']} characters, sampling {s['sampling']}; then the abandonment drill, "
        f"{s['drill']} long completions abandoned at their first piece on each system, and the "
        f"resend probe: {s.get('resend', 0)} prompts read to their end one at a time, each "
        "followed by the same prompt 3 characters on, whose figures are the `resent +3 chars` "
        "rows.",
        *(f"- {system}: {served}" for system, served in run.servers.items()),
        f"- Machine: {m.cpu}, {m.cores} cores, {m.memory_gib} GiB; CPU flags: "
        f"{', '.join(m.cpu_flags) or 'none of ' + ', '.join(CPU_FLAGS)}; {m.os}.",
        "- 1-minute load average (before -> after each system's windows): "
        + "; ".join(f"{h} {a:.2f} -> {b:.2f}" for h, (a, b) in run.load.items())
        + f". Above {m.cores} the run shared the CPU with other work, and timings suffer.",
        "", *(["## Problems", "", *(f"- {p}" for p in run.problems)] if run.problems else []),
        f"![Requests over time]({TIMELINE_CHART})", "",
        f"![First token and latency of the answered requests]({LATENCY_CHART})",
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def _drills(drills: dict[str, dict[str, Any]]) -> list[str]:
    lines = []
    for system, d in drills.items():
        per, each = d["unread_per_abandoned"], d["unread_each"]
        lines.append(
            f"Abandonment drill, {system}: {d['requests']} requests of {d['max_tokens']} tokens "
            f"abandoned at their first piece: {d['abandoned']} abandoned, {d['answered']} "
            f"answered, {d['errors']} errors; generated {number(d['generated'], 0)}, read "
            f"{d['tokens_read']}: {'-' if per is None else f'at most {per:.2f}'} tokens per "
            "abandoned request after the client left"
            + (f" (median {np.median(each):.1f}, most {max(each):.0f})." if each else ".")
            + (f" Errors: {'; '.join(d['error_messages'][:3])}" if d["error_messages"] else "")
        )
        lines.append("")
    return lines


def _errors(events: pd.DataFrame) -> list[str]:
    failed = events[events["outcome"] == "error"] if len(events) else events
    if not len(failed):
        return ["Errors: none."]
    counts = failed.groupby(["system", "error"]).size().reset_index(name="count")
    return ["Errors:", "", counts.head(20).to_markdown(index=False)]


def chart_timeline(events: pd.DataFrame, path: Path, title: str) -> Path:
    """Each answered request's first token over the run, by system."""
    fig, ax = plt.subplots(figsize=(11, 4.2))
    for system, rows in events.groupby("system", sort=False) if len(events) else []:
        ok = rows[rows["outcome"] == "ok"]
        ax.plot(ok["started_s"], ok["first_token_ms"], ".", label=f"{system}: first token")
        gone = rows[rows["outcome"] != "ok"]
        ax.plot(gone["started_s"], gone["latency_ms"], "x", alpha=0.5,
                label=f"{system}: abandoned / failed, at")  # fmt: skip
    ax.set_yscale("log")
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel("ms (log scale)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    return save_figure(fig, path, title, dpi=100)


def chart_latency(events: pd.DataFrame, path: Path, title: str) -> Path:
    """Cumulative distributions of first token and latency of the answered requests."""
    fig, ax = plt.subplots(figsize=(8, 4.6))
    for system, rows in events.groupby("system", sort=False) if len(events) else []:
        ok = rows[rows["outcome"] == "ok"]
        for column, style in (("first_token_ms", "--"), ("latency_ms", "-")):
            data = np.sort(pd.to_numeric(ok[column], errors="coerce").dropna().to_numpy())
            if len(data):
                share = np.arange(1, len(data) + 1) / len(data)
                ax.step(data, share, style, where="post", label=f"{system}: {column[:-3]}")
    ax.set_xscale("log")
    ax.set_xlabel("ms (log scale)")
    ax.set_ylabel("share of answered requests at or below")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return save_figure(fig, path, title)
