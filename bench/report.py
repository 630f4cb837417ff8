"""The run's report: every table, the markdown, the JSON and the chart, as pure functions of
the results dictionary, so a ``results.json`` from an earlier run can be re-rendered."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import tables
from bench.format import Table, markdown_table, model_text, prose
from bench.peer import peer_table
from bench.targets import any_measured, targets_table


def all_tables(results: dict[str, Any]) -> list[Table]:
    sections = (
        tables.kernel_tables,
        tables.arrival_tables,
        tables.mixed_tables,
        tables.single_tables,
        tables.beam_tables,
    )
    prefix = [
        tables.prefix_table(results[key], key == "prefix_served")
        for key in ("prefix", "prefix_served")
        if results.get(key)
    ]
    return [
        *(table for section in sections for table in section(results)),
        *prefix,
        *([peer_table(results)] if results.get("llama") else []),
        *([targets_table(results)] if any_measured(results) else []),
    ]


def render_markdown(results: dict[str, Any]) -> str:
    """The whole run as one markdown document."""
    plan, m, models = results["plan"], results["machine"], results.get("models", [])
    flags = " ".join(m.get("cpu_flags") or []) or "none found"
    lines = [
        prose(
            "header",
            lines=True,
            started=results.get("started", ""),
            flags=flags,
            machine=results.get("machine_label", ""),
            torch=m.get("torch"),
            transformers=m.get("transformers"),
            tritonclient=m.get("tritonclient"),
            bf16="yes" if m.get("bf16_native") else "no",
            openvino=m.get("openvino"),
            genai=m.get("openvino-genai"),
            start=results.get("load_start", "?"),
            end=results.get("load_end", "?"),
            cores=m.get("cores"),
            elapsed=results.get("elapsed", ""),
            run="quick" if plan["quick"] else "full",
            sections=", ".join(plan["sections"]),
            device=plan["device"],
        )
    ]
    lines += [f"- model {x['name']}: {x['description']} ({x['path']})" for x in models]
    lines += [f"- {note}" for note in results.get("notes", [])]
    for title, context, headers, rows in all_tables(results):
        lines += ["", f"## {title}", "", f"*{context}*", "", markdown_table(headers, rows)]
    return "\n".join(lines) + "\n"


def write_all(out: Path, results: dict[str, Any]) -> list[Path]:
    """results.json, results.md and chart.png into ``out`` (rewritten after every section, so
    an interrupted run keeps what it measured)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    (out / "results.md").write_text(render_markdown(results))
    chart = write_chart(out / "chart.png", results)
    return [out / "results.json", out / "results.md", *([chart] if chart else [])]


COLORS = {"engine": "#1f77b4", "openvino": "#e377c2", "transformers": "#ff7f0e"}
ARRIVAL_SERIES = (
    ("torch bare", "bare", "#1f77b4"),
    ("torch served", "served", "#9467bd"),
    ("torch static batches", "static", "#8c564b"),
    ("openvino bare", "openvino_bare", "#e377c2"),
    ("openvino served", "openvino_served", "#bcbd22"),
)


def write_chart(path: Path, results: dict[str, Any]) -> Path | None:
    """One PNG: a panel per model's static batches, one for arrivals, one for the latencies
    (mixed and single), each titled with its model, dtype and settings; the figure's title
    the machine."""
    import pandas as pd

    from reporting.charts import plt, save_figure  # matplotlib on Agg, loaded only to draw

    comparison = tables.kernel_comparison(results.get("kernels") or [])
    models = list(dict.fromkeys(e["model"] for e in comparison))
    arrivals, mixed = results.get("arrivals") or [], results.get("mixed") or []
    single = results.get("single") or {}
    panels = len(models) + bool(arrivals) + bool(mixed or single)
    if not panels:
        return None
    fig, grid = plt.subplots(panels, 1, figsize=(13, 4.2 * panels), squeeze=False)
    axes, plan, load = iter(grid[:, 0]), results["plan"], results.get("load_settings", {})
    loaded = f"model {load.get('model', 'default')}, {load.get('dtype', '?')}"
    for model in models:
        entries = [e for e in comparison if e["model"] == model]
        labels = [f"{e['dtype']}\nb{e['batch']} {e['mode'][:6]}" for e in entries]
        frame = pd.DataFrame(
            {s: [e.get(s) or 0 for e in entries] for s in tables.KERNEL_SYSTEMS}, labels
        )
        ax = frame.plot.bar(ax=next(axes), color=COLORS, logy=True, rot=0, width=0.8)
        ax.set_ylabel("generated tokens/s (log)")
        ax.set_title(
            f"static batches — {model_text(results, model)}; sampled = top-k 40, "
            "top-p 0.95, T 0.8; missing bar = not supported",
            fontsize=9,
        )
    if arrivals:
        frame = pd.DataFrame(
            {
                name: [r.get(f"{key}_tokens_per_s") or 0 for r in arrivals]
                for name, key, _ in ARRIVAL_SERIES
            },
            [f"{r['length']} tokens" for r in arrivals],
        )
        ax = frame.plot.bar(ax=next(axes), color=[c for *_, c in ARRIVAL_SERIES], rot=0, width=0.8)
        for x, r in enumerate(arrivals):
            if ceiling := r.get("forward_ceiling_tokens_per_s"):
                ax.hlines(ceiling, x - 0.45, x + 0.45, colors="black", linestyles="dashed")
        ax.set_ylabel("generated tokens/s (dashed: forward-pass ceiling)")
        ax.set_title(
            f"{plan['clients']} closed-loop clients — {loaded}; load-test sampling", fontsize=9
        )
    if mixed or single:
        bars = [
            (
                f"{r['path'].replace('_', chr(10))}\nshort {when}",
                r.get(f"{when}_median_ms") or 0,
                color,
            )
            for r in mixed
            for when, color in (("alone", "#17becf"), ("mixed", "#d62728"))
        ]
        bars += [
            ("single\n" + key.replace("_", " "), single[f"{key}_median_ms"], color)
            for _, key, color in ARRIVAL_SERIES
            if single.get(f"{key}_median_ms") is not None
        ]
        ax = next(axes)
        ax.bar(range(len(bars)), [b[1] for b in bars], color=[b[2] for b in bars])
        ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
        ax.set_ylabel("median latency (ms)")
        ax.set_title(
            f"latency — {loaded}; mixed: {plan['mixed_clients']}x{plan['mixed_short']} next "
            f"to {plan['mixed_clients']}x{plan['mixed_long']} tokens; single: "
            f"{plan['single_tokens']} tokens",
            fontsize=9,
        )
    return save_figure(fig, path, f"make bench — {results.get('machine_label', '')}")
