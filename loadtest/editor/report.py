"""The editor profile's figures per system, from the event table and one row per window of each
system's own counters and CPU; its targets, each PASS, FAIL or NOT MEASURED (never a pass by
default); and its run folder (``report.md`` from the templates beside this module). Percentiles
are of the answered requests (``ok``: whole within the pause). Tokens generated for abandoned
requests: generated minus what readers got, an upper bound."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from string import Template
from typing import Any

import pandas as pd

from loadtest.editor.drill import CHAT_DRILL, RESENT
from loadtest.editor.systems import LLAMA, OFF, ON
from loadtest.metrics import reuse_share
from reporting.charts import plt, save_figure
from reporting.events import summarize
from reporting.machine import CPU_FLAGS
from reporting.tables import number, percent, templates

TEMPLATES = Path(__file__).with_name("report.md")
PASS, FAIL, NOT_MEASURED = "PASS", "FAIL", "NOT MEASURED"
TTFT_RATIO = 1 / 3  # answered first-token p50 with the cache on, at most this share of off
WASTE_PER_ABANDONED = 2.0  # tokens generated after the client left, per abandoned request
ONE_LINE_P50_MS, ONE_LINE_P95_MS, FIRST_TOKEN_P50_MS = 250.0, 600.0, 100.0
PEER_RATIO = 1.0  # the project's one-line p50, at most this times llama.cpp's
TIMELINE_CHART, LATENCY_CHART = "editor_timeline.png", "editor_latency.png"
SHARES = {"abandoned share", "prompt-cache reuse share (at most)"}
INTEGERS = {"requests", "answered", "abandoned", "errors", "abandoned while streaming"}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or not b or pd.isna(a) or pd.isna(b) else a / b


def _by_system(events: pd.DataFrame) -> dict[str, dict]:
    """:func:`reporting.events.summarize` per system, missing figures as None."""
    if not len(events):
        return {}
    table = summarize(events, by=["system"]).set_index("system").astype(object)
    return table.where(table.notna(), None).to_dict("index")


def system_figures(events: pd.DataFrame, windows: pd.DataFrame) -> dict[str, dict]:
    """Per system (in the order the systems first typed): the figures the report prints."""
    figures: dict[str, dict] = {}
    resent, events = events[events["name"] == RESENT], events[events["name"] != RESENT]
    typed, warm = _by_system(events), _by_system(resent)
    for system in dict.fromkeys([*windows["system"], *events["system"]]):
        rows, ours = events[events["system"] == system], windows[windows["system"] == system]
        s, w = typed.get(system, {}), warm.get(system, {})
        ok, abandoned = rows[rows["outcome"] == "ok"], rows[rows["outcome"] == "abandoned"]
        c = ours.dropna(axis=1).sum(numeric_only=True)  # a counter unread in a window: None
        seconds, generated, cpu = c["seconds"], c.get("generated"), c.get("cpu_s")
        delivered = float(pd.to_numeric(rows["tokens"], errors="coerce").fillna(0).sum())
        wasted = None if generated is None else generated - delivered
        prompt = rows.get("prefix_tokens", pd.Series()) + rows.get("suffix_tokens", 0)
        figures[system] = {
            "requests": len(rows),
            "answered": len(ok),
            "abandoned": len(abandoned),
            "errors": int((rows["outcome"] == "error").sum()),
            "abandoned share": _ratio(len(abandoned), len(ok) + len(abandoned)),
            "abandoned while streaming": int(abandoned["first_token_ms"].notna().sum()),
            **{
                f"{f} {p} ms": s.get(f"{f.replace(' ', '_')}_{p}_ms")
                for f in ("first token", "latency")
                for p in ("p50", "p95")
            },
            "prompt tokens sent / request": float(prompt.mean()) if len(prompt) else None,
            "seconds of typing": seconds,
            "tokens delivered / s": _ratio(delivered, seconds),
            "CPU seconds": cpu,
            "CPU ms / answered request": _ratio(cpu and 1000 * cpu, len(ok)),
            "tokens generated": generated,
            "tokens delivered": delivered,
            "generated for abandoned, unread (at most)": wasted,
            "... per abandoned request (at most)": _ratio(wasted, len(abandoned)),
            "sequences": c.get("sequences"),
            "of them cancelled": c.get("cancelled"),
            "prompt tokens received / request": _ratio(c.get("prompt"), len(rows)),
            "prompt-cache reuse share (at most)": reuse_share(c.get("prompt", 0), c.get("reused")),
            "editor stops": c.get("editor_stops"),
            "tokens generated past a stop": c.get("past_stop"),
            **{
                f"resent +3 chars: {f} ms": w.get(f"{f.replace(' ', '_')}_ms")
                for f in ("first token p50", "latency p50", "latency p95")
            },
        }
    return figures


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    goal: str
    measured: str
    verdict: str  # PASS, FAIL, NOT MEASURED


def _at_most(name: str, figure: str, value: float | None, limit: float) -> Target:
    goal = f"<= {limit:.0f} ms ({figure})"
    if value is None:
        return Target(name, goal, "no answered request", NOT_MEASURED)
    return Target(name, goal, f"{value:.0f} ms", PASS if value <= limit else FAIL)


def _relative(name: str, figure: str, a: dict, b: dict, limit: float) -> Target:
    x, y, goal = a[f"{figure} ms"], b[f"{figure} ms"], f"{figure}: at most {limit:.2f} x"
    if x is None or y is None:
        return Target(name, goal, "no answered request on one side", NOT_MEASURED)
    measured = f"{x:.0f} ms / {y:.0f} ms = {x / y if y else float('inf'):.2f}"
    return Target(name, goal, measured, PASS if x <= y * limit else FAIL)


def evaluate(
    figures: dict[str, dict], drills: dict[str, dict], afters: dict[str, str], one_line: bool
) -> list[Target]:
    """The targets from the systems' figures, drills and after-checks; the project is the first."""
    project, ours = figures[next(iter(figures))], [s for s in figures if s != LLAMA]
    targets = [Target("one-line", "one-line p50 / p95", "--no-one-line", NOT_MEASURED)]
    if one_line:
        targets = [
            _at_most(f"one-line {p}", "answered, the project", project[f"latency {p} ms"], limit)
            for p, limit in (("p50", ONE_LINE_P50_MS), ("p95", ONE_LINE_P95_MS))
        ]
    targets.append(
        _at_most(
            "first token p50", "the project", project["first token p50 ms"], FIRST_TOKEN_P50_MS
        )
    )
    if ON in figures and OFF in figures:
        targets.append(
            _relative(
                "first token, cache on / off",
                "first token p50",
                figures[ON],
                figures[OFF],
                TTFT_RATIO,
            )
        )
    if LLAMA in figures:
        targets.append(
            _relative(
                "one-line p50, project / llama.cpp",
                "latency p50",
                project,
                figures[LLAMA],
                PEER_RATIO,
            )
        )
    parts, verdicts = [], []  # tokens after abandonment: the typists' and the drill's
    for system in ours:
        f, d = figures[system], drills.get(system)
        sources = [("typists", f["... per abandoned request (at most)"], f["abandoned"])]
        sources += [("drill", d["unread_per_abandoned"], d["abandoned"])] if d else []
        chat = drills.get(f"{system} {CHAT_DRILL}")  # the same drill through the chat route
        sources += (
            [(f"{CHAT_DRILL} drill", chat["unread_per_abandoned"], chat["abandoned"])]
            if chat
            else []
        )
        for source, per, abandoned in sources:  # none abandoned: no verdict
            said = f"{per:.2f} over {abandoned} abandoned" if per is not None else "counters unread"
            parts.append(f"{system} {source}: {said if abandoned else 'none abandoned'}")
            ok = per is not None and per <= WASTE_PER_ABANDONED
            verdicts += [PASS if ok else NOT_MEASURED if per is None else FAIL] if abandoned else []
    worst = next((v for v in (FAIL, NOT_MEASURED) if v in verdicts), PASS)  # none: NOT MEASURED
    targets.append(
        Target(
            "abandoned requests",
            f"<= {WASTE_PER_ABANDONED:g} tokens generated per "
            "abandoned request after its client left, the typists' and the drills', "
            "each project system (tokens no reader got: an upper bound)",
            "; ".join(parts),
            worst if verdicts else NOT_MEASURED,
        )
    )
    goal = "0 tokens generated past a one-line, n_indent or time-budget stop (engine counters)"
    counts = {s: figures[s]["tokens generated past a stop"] for s in ours}
    stops = {s: figures[s]["editor stops"] for s in ours}
    unread = any(v is None for v in counts.values()) or not any(stops.values())
    measured = (
        f"stops {stops}"
        if unread
        else "; ".join(f"{s}: {counts[s]:.0f} past {stops[s]:.0f} stops" for s in ours)
    )
    verdict = NOT_MEASURED if unread else FAIL if any(counts.values()) else PASS
    targets.append(Target("past a stop", goal, measured, verdict))
    errors = {s: f["errors"] + drills.get(s, {}).get("errors", 0) for s, f in figures.items()}
    measured = ", ".join(f"{s} {n}" for s, n in errors.items()) + " (typists and drill)"
    targets.append(Target("errors", "0 errors", measured, FAIL if any(errors.values()) else PASS))
    ok = all(a.startswith("answered") for a in afters.values()) and bool(afters)
    measured = "; ".join(f"{s}: {a}" for s, a in afters.items())
    targets.append(
        Target(
            "after the run", "the server answers a plain completion", measured, PASS if ok else FAIL
        )
    )
    return targets


def write_report(out: Path, events: pd.DataFrame, windows: pd.DataFrame, run: dict) -> list:
    """``run``: what summary.json holds (run.py's ``main``); the paths written."""
    paths = [out / "summary.json", out / "events.csv", out / "windows.csv", out / "report.md"]
    plain = lambda v: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else str(v)  # noqa: E731
    paths[0].write_text(json.dumps(run, indent=2, default=plain) + "\n")
    events.to_csv(paths[1], index=False)
    windows.to_csv(paths[2], index=False)
    paths[3].write_text(render(run, events))
    return [
        *paths,
        *charts(
            events, out, f"editor traffic, {run['settings']['typists']} typists, {run['protocol']}"
        ),
    ]


def _cell(figure: str, value: Any) -> str:
    if value is None or pd.isna(value):
        return "-"
    whole = figure in INTEGERS or abs(value) >= 100 or value == int(value)
    return percent(value, 1) if figure in SHARES else number(value, 0 if whole else 2)


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
    drills = [
        parts["drill"].substitute(
            d,
            system=system,
            generated=number(d["generated"], 0),
            per="-"
            if d["unread_per_abandoned"] is None
            else f"at most {d['unread_per_abandoned']:.2f}",
            messages=f" Errors: {'; '.join(d['error_messages'][:3])}"
            if d["error_messages"]
            else "",
        )
        + "\n\n"
        for system, d in run["drills"].items()
    ]
    return (
        parts["report"].substitute(
            s,
            **m,
            **{k: run[k] for k in ("name", "command", "started", "protocol")},
            seconds=f"{run['seconds']:.0f}",
            passed=verdicts.count(PASS),
            total=len(verdicts),
            banner=f"> **{run['suffix']['note']}**\n\n" if run["suffix"]["refused"] else "",
            targets=pd.DataFrame(map(dataclasses.asdict, run["targets"])).to_markdown(index=False),
            systems=side_by_side(run["figures"]),
            drills="".join(drills),
            errors=("Errors:\n\n" + errors.head(20).to_markdown(index=False))
            if len(errors)
            else "Errors: none.",
            warm_up=f"{s['warm_up']:.0f}",
            window=f"{s['window_s']:.0f}",
            order=", ".join(s["order"]),
            one_line="on" if s["one_line"] else "off",
            pause="-".join(map(str, s["pause"])),
            suffix="sent" if run["suffix"]["send"] else "NOT SENT",
            servers="\n".join(f"- {system}: {served}" for system, served in run["servers"].items()),
            flags=", ".join(m["cpu_flags"]) or "none of " + ", ".join(CPU_FLAGS),
            load="; ".join(f"{h} {a:.2f} -> {b:.2f}" for h, (a, b) in run["load"].items()),
            problems="## Problems\n\n" + "".join(f"- {p}\n" for p in run["problems"]) + "\n"
            if run["problems"]
            else "",
        )
        + "\n"
    )


def charts(events: pd.DataFrame, out: Path, title: str) -> list[Path]:
    """First tokens over the run (the others where they ended), and answered ones' ECDFs."""
    (timeline_figure, timeline), (cdf_figure, cdf) = (
        plt.subplots(figsize=(11, 4.2)),
        plt.subplots(figsize=(8, 4.6)),
    )
    for system, rows in events.groupby("system", sort=False):
        ok, gone = rows[rows["outcome"] == "ok"], rows[rows["outcome"] != "ok"]
        timeline.plot(ok["started_s"], ok["first_token_ms"], ".", label=f"{system}: first token")
        timeline.plot(
            gone["started_s"],
            gone["latency_ms"],
            "x",
            alpha=0.5,
            label=f"{system}: abandoned / failed, at",
        )
        for column, style in (("first_token_ms", "--"), ("latency_ms", "-")):
            if len(data := pd.to_numeric(ok[column], errors="coerce").dropna()):
                cdf.ecdf(data, linestyle=style, label=f"{system}: {column[:-3]}")
    timeline.set(yscale="log", xlabel="seconds since the run started", ylabel="ms (log scale)")
    cdf.set(xscale="log", xlabel="ms (log scale)", ylabel="share of answered requests at or below")
    for ax, corner in ((timeline, "upper right"), (cdf, "lower right")):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc=corner)
    return [
        save_figure(timeline_figure, out / TIMELINE_CHART, title, dpi=100),
        save_figure(cdf_figure, out / LATENCY_CHART, title),
    ]
