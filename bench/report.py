"""Tables (markdown and the terminal), targets and the chart, from the measured rows.

Pure functions of the results dictionary, so they are unit-tested without running a model, and
a ``results.json`` from an earlier run can be re-rendered.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.prefix import prefix_table

# Targets from issue 11; each check row says which it is held to.
STEP_COST_MAX = 1.15  # sampled-step time over greedy-step time, engine, batch 16 and 64
SERVED_OVER_BARE_MIN = 0.9  # served tokens/s over bare, every output length
CONTINUOUS_OVER_STATIC_MIN = 1.0  # continuous arrivals at least as fast as static batches
MIXED_SLOWDOWN_MAX = 2.0  # short requests' median latency next to long ones over alone
SERVED_OVERHEAD_MAX_MS = 15.0  # one request alone, served minus bare
# 16 clients at output 128: 4x the engine's tokens/s before the work of issue 11 (about 615)
THROUGHPUT_TARGET_LENGTH, THROUGHPUT_TARGET = 128, 4 * 615.0


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator is 0."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def fmt(value: float | int | None, digits: int = 0, suffix: str = "") -> str:
    """A number for a table: thousands separators, ``digits`` decimals; "—" for missing."""
    if value is None:
        return "—"
    return f"{value:,.{digits}f}{suffix}"


def rate(value: float | None) -> str:
    """tokens/s for a table: whole numbers, one decimal below 10 (a 350M model at batch 1)."""
    return fmt(value, 1 if value is not None and value < 10 else 0)


def verdict(value: float | None, limit: float, at_most: bool) -> str:
    """ "ok" / "MISSED" against a target (at most / at least ``limit``); "—" without a value."""
    if value is None:
        return "—"
    good = value <= limit if at_most else value >= limit
    return "ok" if good else "MISSED"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub markdown table; columns whose header starts with a letter are left-aligned,
    the numeric ones right-aligned (their header is marked with a leading space)."""
    aligns = ["---:" if h.startswith(" ") else "---" for h in headers]
    lines = [
        "| " + " | ".join(h.strip() for h in headers) + " |",
        "|" + "|".join(aligns) + "|",
    ]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """The same table for a terminal: padded columns, numeric ones right-justified."""
    names = [h.strip() for h in headers]
    widths = [max([len(n), *(len(str(r[i])) for r in rows)]) for i, n in enumerate(names)]
    right = [h.startswith(" ") for h in headers]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            str(c).rjust(w) if r else str(c).ljust(w)
            for c, w, r in zip(cells, widths, right, strict=True)
        )

    return "\n".join([line(names), line(["-" * w for w in widths]), *(line(r) for r in rows)])


# -- derived rows ------------------------------------------------------------------------------


def kernel_comparison(kernels: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (model, dtype, batch, mode): the three systems' tokens/s and the ratios."""
    keyed: dict[tuple, dict[str, Any]] = {}
    for row in kernels:
        key = (row["model"], row["dtype"], row["batch"], row["mode"])
        entry = keyed.setdefault(
            key,
            {
                "model": row["model"],
                "dtype": row["dtype"],
                "batch": row["batch"],
                "mode": row["mode"],
                "new_tokens": {},
                "wanted_tokens": {},
                "notes": {},
            },
        )
        entry[row["system"]] = row.get("tokens_per_s")
        entry["new_tokens"][row["system"]] = row.get("new_tokens")
        if row.get("wanted_tokens"):
            entry["wanted_tokens"][row["system"]] = row["wanted_tokens"]
        if row.get("note"):
            entry["notes"][row["system"]] = row["note"]
    out = []
    for entry in keyed.values():
        entry["engine_over_transformers"] = ratio(entry.get("engine"), entry.get("transformers"))
        entry["engine_over_ct2"] = ratio(entry.get("engine"), entry.get("ct2"))
        out.append(entry)
    return out


def step_cost(
    kernels: Sequence[dict[str, Any]], batches: Sequence[int] = (16, 64)
) -> list[dict[str, Any]]:
    """The engine's sampled-step over greedy-step time at ``batches``: the same tokens, so the
    time ratio is greedy tokens/s over sampled tokens/s."""
    comparison = kernel_comparison(kernels)
    sampled_rows = {
        (e["model"], e["dtype"], e["batch"]): e for e in comparison if e["mode"] == "sampled"
    }
    rows = []
    for entry in comparison:
        if entry["mode"] != "greedy" or entry["batch"] not in batches:
            continue
        sampled = sampled_rows.get((entry["model"], entry["dtype"], entry["batch"]))
        greedy_rate = entry.get("engine")
        sampled_rate = sampled.get("engine") if sampled else None
        if greedy_rate is None or sampled_rate is None:
            continue
        value = ratio(greedy_rate, sampled_rate)
        rows.append(
            {
                "model": entry["model"],
                "dtype": entry["dtype"],
                "batch": entry["batch"],
                "greedy_tokens_per_s": greedy_rate,
                "sampled_tokens_per_s": sampled_rate,
                "sampled_over_greedy_time": value,
                "verdict": verdict(value, STEP_COST_MAX, at_most=True),
            }
        )
    return rows


# -- sections ----------------------------------------------------------------------------------

Table = tuple[str, str, list[str], list[list[str]]]  # title, context line, headers, rows


def _context(results: dict[str, Any], *parts: str) -> str:
    machine = results.get("machine_label", "")
    return " · ".join(p for p in (f"machine: {machine}", *parts) if p)


def _model_text(results: dict[str, Any], name: str) -> str:
    for model in results.get("models", []):
        if model["name"] == name:
            return f"model: {name} ({model['description']})"
    return f"model: {name}"


def kernel_tables(results: dict[str, Any]) -> list[Table]:
    rows = results.get("kernels") or []
    if not rows:
        return []
    plan = results["plan"]
    tables: list[Table] = []
    comparison = kernel_comparison(rows)
    for model in dict.fromkeys(r["model"] for r in comparison):
        entries = [e for e in comparison if e["model"] == model]
        body = []
        reasons: dict[str, str] = {}  # "not supported" explanations, said once per table
        for e in entries:
            counts = sorted({n for n in e["new_tokens"].values() if n})
            cut = [
                f"{s} {n}"
                for s, n in e["new_tokens"].items()
                if n and n < e["wanted_tokens"].get(s, n)
            ]
            cells = []
            for system in ("engine", "transformers", "ct2"):
                note = e["notes"].get(system, "")
                if e.get(system) is None and note and "tokens (time budget)" not in note:
                    mark = "n/s" if note.startswith("not supported") else "failed"
                    reasons[f"{system} {e['dtype']}"] = note
                    cells.append(mark)
                else:
                    cells.append(rate(e.get(system)))
            body.append(
                [
                    e["dtype"],
                    str(e["batch"]),
                    e["mode"],
                    *cells,
                    fmt(e["engine_over_transformers"], 2, "x"),
                    fmt(e["engine_over_ct2"], 2, "x"),
                    "/".join(str(n) for n in counts) or "—",
                    ", ".join(cut),
                ]
            )
        key = next((r.get("plan_key") for r in rows if r["model"] == model), None)
        kplan = plan["kernels"].get(key, {}) if key else {}
        settings = (
            f"static batches, {kplan.get('prompt_tokens', '?')}-token prompts, "
            f"{kplan.get('new_tokens', '?')} new tokens (fewer where a row says so), end token "
            f"banned; sampled = top-k {40} / top-p 0.95 / temperature 0.8; device {plan['device']}"
        )
        footnote = "; ".join(f"{k}: {v}" for k, v in reasons.items())
        tables.append(
            (
                f"Static batches: engine vs transformers vs CTranslate2 — {model}",
                _context(results, _model_text(results, model), settings, footnote),
                [
                    "dtype",
                    " batch",
                    "mode",
                    " engine tok/s",
                    " transformers tok/s",
                    " ct2 tok/s",
                    " engine/transformers",
                    " engine/ct2",
                    " new tokens",
                    "fewer tokens (time budget)",
                ],
                body,
            )
        )
    steps = step_cost(rows, plan.get("step_batches", (16, 64)))
    if steps:
        tables.append(
            (
                "Engine: sampled step vs greedy step",
                _context(
                    results,
                    "same static batches as above; time ratio = greedy tok/s / sampled tok/s",
                    f"target <= {STEP_COST_MAX}",
                ),
                [
                    "model",
                    "dtype",
                    " batch",
                    " greedy tok/s",
                    " sampled tok/s",
                    " sampled/greedy time",
                    "target",
                ],
                [
                    [
                        s["model"],
                        s["dtype"],
                        str(s["batch"]),
                        rate(s["greedy_tokens_per_s"]),
                        rate(s["sampled_tokens_per_s"]),
                        fmt(s["sampled_over_greedy_time"], 2),
                        s["verdict"],
                    ]
                    for s in steps
                ],
            )
        )
    return tables


def _load_context(results: dict[str, Any], extra: str) -> str:
    load = results.get("load_settings", {})
    model = load.get("model", "default")
    return _context(
        results,
        _model_text(results, model),
        f"dtype {load.get('dtype', '?')}, device {results['plan']['device']}",
        f"engine max_batch_size {load.get('max_batch_size', '?')}",
        "sampling top-k 40 / top-p 0.95 / temperature 0.8, code prompts, end token banned",
        extra,
    )


def throughput_verdict(row: dict[str, Any]) -> str:
    """The bare engine's tokens/s against the throughput target, at the target's length."""
    if row["length"] != THROUGHPUT_TARGET_LENGTH:
        return "—"
    return verdict(row.get("bare_tokens_per_s"), THROUGHPUT_TARGET, at_most=False)


def arrival_tables(results: dict[str, Any]) -> list[Table]:
    rows = results.get("arrivals") or []
    if not rows:
        return []
    clients = results["plan"]["clients"]
    body = []
    for r in rows:
        body.append(
            [
                str(r["length"]),
                rate(r.get("forward_ceiling_tokens_per_s")),
                rate(r.get("bare_tokens_per_s")),
                throughput_verdict(r),
                rate(r.get("served_tokens_per_s")),
                fmt(r.get("served_over_bare"), 2),
                verdict(r.get("served_over_bare"), SERVED_OVER_BARE_MIN, at_most=False),
                rate(r.get("static_tokens_per_s")),
                fmt(r.get("continuous_over_static"), 2),
                verdict(r.get("continuous_over_static"), CONTINUOUS_OVER_STATIC_MIN, False),
                r.get("windows", ""),
            ]
        )
    return [
        (
            f"Continuous arrivals: {clients} closed-loop clients",
            _load_context(
                results,
                f"bare = threads submitting to an in-process Engine; served = CodegenClient over "
                f"gRPC to Triton's ensemble; static = {clients} submitted at once, wait for all, "
                f"repeat; forward ceiling = {clients} rows / one decode forward pass at the "
                f"positions the clients hold (no sampling, prefill or serving: no scheduler "
                f"beats it); targets bare >= {THROUGHPUT_TARGET:,.0f} tok/s at output "
                f"{THROUGHPUT_TARGET_LENGTH}, served/bare >= {SERVED_OVER_BARE_MIN}, "
                f"continuous/static >= {CONTINUOUS_OVER_STATIC_MIN}",
            ),
            [
                " output tokens",
                " forward ceiling tok/s",
                " bare tok/s",
                "target",
                " served tok/s",
                " served/bare",
                "target",
                " static tok/s",
                " continuous/static",
                "target ",
                "windows (s)",
            ],
            body,
        )
    ]


def mixed_tables(results: dict[str, Any]) -> list[Table]:
    rows = results.get("mixed") or []
    if not rows:
        return []
    plan = results["plan"]
    body = [
        [
            r["path"],
            fmt(r.get("alone_median_ms"), 1),
            fmt(r.get("mixed_median_ms"), 1),
            fmt(r.get("slowdown"), 2, "x"),
            verdict(r.get("slowdown"), MIXED_SLOWDOWN_MAX, at_most=True),
            f"{r.get('alone_samples', 0)}/{r.get('mixed_samples', 0)}",
        ]
        for r in rows
    ]
    return [
        (
            f"Mixed lengths: {plan['mixed_clients']} clients x {plan['mixed_short']} tokens next "
            f"to {plan['mixed_clients']} x {plan['mixed_long']} tokens",
            _load_context(
                results,
                f"the short requests' median latency mixed over alone; target <= "
                f"{MIXED_SLOWDOWN_MAX}x",
            ),
            [
                "path",
                f" {plan['mixed_short']}-token alone ms",
                f" {plan['mixed_short']}-token mixed ms",
                " slowdown",
                "target",
                " samples alone/mixed",
            ],
            body,
        )
    ]


def single_tables(results: dict[str, Any]) -> list[Table]:
    single = results.get("single")
    if not single:
        return []
    plan = results["plan"]
    overhead = single.get("overhead_ms")
    return [
        (
            f"One request alone: {plan['single_tokens']} tokens",
            _load_context(
                results,
                f"medians over {single.get('repeats')} repeats; target served - bare <= "
                f"{SERVED_OVERHEAD_MAX_MS:g} ms",
            ),
            [" bare ms", " served ms", " served - bare ms", "target"],
            [
                [
                    fmt(single.get("bare_median_ms"), 1),
                    fmt(single.get("served_median_ms"), 1),
                    fmt(overhead, 1),
                    verdict(overhead, SERVED_OVERHEAD_MAX_MS, at_most=True),
                ]
            ],
        )
    ]


def beam_tables(results: dict[str, Any]) -> list[Table]:
    rows = results.get("beams")
    if not rows:
        return []
    first = rows[0]
    return [
        (
            "Beam search: widths side by side with transformers",
            _context(
                results,
                f"default model, float32; {first['prompts']} prompts of "
                f"{results['plan']['beam_prompt_tokens']} tokens at once, {first['new_tokens']} "
                "new tokens each (end token banned); transformers: generate(num_beams=width) "
                "on the same batch",
            ),
            [
                " width",
                " engine tok/s",
                " every beam tok/s",
                " transformers tok/s",
                " engine / transformers",
                " KV cache peak MiB",
                " best beams equal",
            ],
            [
                [
                    str(row["width"]),
                    rate(row["engine_tokens_per_s"]),
                    rate(row["engine_beam_tokens_per_s"]),
                    rate(row["transformers_tokens_per_s"]),
                    fmt(row["engine_over_transformers"], 2, "x"),
                    fmt(row["kv_cache_peak_mib"], 1),
                    f"{row['best_beams_agree']}/{row['prompts']}",
                ]
                for row in rows
            ],
        )
    ]


def all_tables(results: dict[str, Any]) -> list[Table]:
    return [
        *kernel_tables(results),
        *arrival_tables(results),
        *mixed_tables(results),
        *single_tables(results),
        *beam_tables(results),
        *([prefix_table(results["prefix"])] if results.get("prefix") else []),
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


# -- chart -------------------------------------------------------------------------------------


def write_chart(path: Path, results: dict[str, Any]) -> Path | None:
    """One PNG: a panel per model's static-batch comparison, one for arrivals, one for the
    latencies (mixed and single). Every panel's title carries its model, dtype and settings;
    the figure's title the machine."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    comparison = kernel_comparison(results.get("kernels") or [])
    models = list(dict.fromkeys(e["model"] for e in comparison))
    panels: list[str] = [f"kernels:{m}" for m in models]
    if results.get("arrivals"):
        panels.append("arrivals")
    if results.get("mixed") or results.get("single"):
        panels.append("latency")
    if not panels:
        return None
    fig, axes = plt.subplots(len(panels), 1, figsize=(13, 4.2 * len(panels)), squeeze=False)
    colors = {"engine": "#1f77b4", "transformers": "#ff7f0e", "ct2": "#2ca02c"}
    load_model = results.get("load_settings", {}).get("model", "default")
    load_dtype = results.get("load_settings", {}).get("dtype", "?")
    for ax, panel in zip(axes[:, 0], panels, strict=True):
        if panel.startswith("kernels:"):
            model = panel.split(":", 1)[1]
            entries = [e for e in comparison if e["model"] == model]
            labels = [f"{e['dtype']}\nb{e['batch']} {e['mode'][:6]}" for e in entries]
            width = 0.27
            for i, system in enumerate(("engine", "transformers", "ct2")):
                values = [e.get(system) or 0 for e in entries]
                xs = [x + (i - 1) * width for x in range(len(entries))]
                ax.bar(xs, values, width, label=system, color=colors[system])
            ax.set_xticks(range(len(entries)), labels, fontsize=7)
            ax.set_yscale("log")
            ax.set_ylabel("generated tokens/s (log)")
            ax.set_title(
                f"static batches — {_model_text(results, model)}; sampled = top-k 40, "
                "top-p 0.95, T 0.8; missing bar = not supported",
                fontsize=9,
            )
            ax.legend(fontsize=8)
        elif panel == "arrivals":
            rows = results["arrivals"]
            series = (
                ("bare", "bare_tokens_per_s", "#1f77b4"),
                ("served", "served_tokens_per_s", "#9467bd"),
                ("static batches", "static_tokens_per_s", "#8c564b"),
            )
            width = 0.27
            for i, (label, key, color) in enumerate(series):
                xs = [x + (i - 1) * width for x in range(len(rows))]
                ax.bar(xs, [r.get(key) or 0 for r in rows], width, label=label, color=color)
            ceilings = [
                (x, r["forward_ceiling_tokens_per_s"])
                for x, r in enumerate(rows)
                if r.get("forward_ceiling_tokens_per_s")
            ]
            for n, (x, ceiling) in enumerate(ceilings):
                ax.hlines(
                    ceiling,
                    x - 0.45,
                    x + 0.45,
                    colors="black",
                    linestyles="dashed",
                    label="forward-pass ceiling" if n == 0 else None,
                )
            ax.set_xticks(range(len(rows)), [f"{r['length']} tokens" for r in rows])
            ax.set_ylabel("generated tokens/s")
            ax.set_title(
                f"{results['plan']['clients']} closed-loop clients — model {load_model}, "
                f"{load_dtype}; load-test sampling",
                fontsize=9,
            )
            ax.legend(fontsize=8)
        else:
            labels, values, colors_ = [], [], []
            for r in results.get("mixed") or []:
                labels += [f"{r['path']}\nshort alone", f"{r['path']}\nshort mixed"]
                values += [r.get("alone_median_ms") or 0, r.get("mixed_median_ms") or 0]
                colors_ += ["#17becf", "#d62728"]
            single = results.get("single") or {}
            if single:
                labels += ["single\nbare", "single\nserved"]
                values += [single.get("bare_median_ms") or 0, single.get("served_median_ms") or 0]
                colors_ += ["#1f77b4", "#9467bd"]
            ax.bar(range(len(values)), values, color=colors_)
            ax.set_xticks(range(len(values)), labels, fontsize=8)
            ax.set_ylabel("median latency (ms)")
            plan = results["plan"]
            ax.set_title(
                f"latency — model {load_model}, {load_dtype}; mixed: {plan['mixed_clients']}x"
                f"{plan['mixed_short']} next to {plan['mixed_clients']}x{plan['mixed_long']} "
                f"tokens; single: {plan['single_tokens']} tokens",
                fontsize=9,
            )
    fig.suptitle(f"make bench — {results.get('machine_label', '')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
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
