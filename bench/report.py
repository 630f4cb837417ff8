"""The run's report: every table, as markdown and for the terminal, the JSON and the chart.

Pure functions of the results dictionary (bench/tables.py, bench/targets.py), so a
``results.json`` from an earlier run can be re-rendered. The formatting helpers and the
section tables live in bench/format.py and bench/tables.py; their names are re-exported here
for the callers that import them from the report.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.chart import write_chart
from bench.format import Table, fmt, markdown_table, rate, ratio, text_table, verdict
from bench.peer import peer_table
from bench.prefix import prefix_table
from bench.served_prefix import served_prefix_table
from bench.tables import (
    THROUGHPUT_TARGET,
    THROUGHPUT_TARGET_LENGTH,
    beam_tables,
    kernel_comparison,
    kernel_tables,
    step_cost,
)
from bench.targets import any_measured, targets_table
from bench.traffic_tables import arrival_tables, mixed_tables, single_tables, throughput_verdict

__all__ = [
    "THROUGHPUT_TARGET",
    "THROUGHPUT_TARGET_LENGTH",
    "Table",
    "all_tables",
    "fmt",
    "kernel_comparison",
    "kernel_tables",
    "markdown_table",
    "rate",
    "ratio",
    "render_markdown",
    "render_text",
    "step_cost",
    "text_table",
    "throughput_verdict",
    "verdict",
    "write_all",
    "write_chart",
]


def all_tables(results: dict[str, Any]) -> list[Table]:
    return [
        *kernel_tables(results),
        *arrival_tables(results),
        *mixed_tables(results),
        *single_tables(results),
        *beam_tables(results),
        *([prefix_table(results["prefix"])] if results.get("prefix") else []),
        *([served_prefix_table(results["prefix_served"])] if results.get("prefix_served") else []),
        *([peer_table(results)] if results.get("llama") else []),
        *([targets_table(results)] if any_measured(results) else []),
    ]


def render_text(table: Table) -> str:
    title, context, headers, rows = table
    return f"\n== {title}\n{context}\n\n{text_table(headers, rows)}\n"


def render_markdown(results: dict[str, Any]) -> str:
    """The whole run as one markdown document."""
    plan = results["plan"]
    lines = [
        f"# make bench — {results.get('started', '')}",
        "",
        f"- machine: {results.get('machine_label', '')}",
        f"- libraries: torch {results['machine'].get('torch')}, transformers "
        f"{results['machine'].get('transformers')}, ctranslate2 "
        f"{results['machine'].get('ctranslate2')}, tritonclient "
        f"{results['machine'].get('tritonclient')}",
        f"- CPU flags: {' '.join(results['machine'].get('cpu_flags') or []) or 'none found'} "
        f"(bfloat16 native: {'yes' if results['machine'].get('bf16_native') else 'no'}); "
        f"openvino {results['machine'].get('openvino')}, openvino-genai "
        f"{results['machine'].get('openvino-genai')}",
        f"- load average (1/5/15 min, `uptime`): at the start {results.get('load_start', '?')}, "
        f"at the end {results.get('load_end', '?')}; {results['machine'].get('cores')} cores "
        "shared with other work on this machine (a load above the core count slows every "
        "figure: compare ratios, not absolute rates, across runs)",
        f"- run: {'quick' if plan['quick'] else 'full'}, sections {', '.join(plan['sections'])}, "
        f"device {plan['device']}, {results.get('elapsed', '')}",
    ]
    for model in results.get("models", []):
        lines.append(f"- model {model['name']}: {model['description']} ({model['path']})")
    lines += [f"- {note}" for note in results.get("notes", [])]
    for title, context, headers, rows in all_tables(results):
        lines += ["", f"## {title}", "", f"*{context}*", "", markdown_table(headers, rows)]
    return "\n".join(lines) + "\n"


def write_json(path: Path, results: dict[str, Any]) -> Path:
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return path


def write_all(out: Path, results: dict[str, Any]) -> list[Path]:
    """results.json, results.md and chart.png into ``out`` (rewritten after every section, so
    an interrupted run keeps what it measured)."""
    out.mkdir(parents=True, exist_ok=True)
    written = [write_json(out / "results.json", results)]
    (out / "results.md").write_text(render_markdown(results))
    written.append(out / "results.md")
    chart = write_chart(out / "chart.png", results)
    if chart is not None:
        written.append(chart)
    return written
