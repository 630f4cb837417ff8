"""The run's report: ``report.json`` (everything, every completion) and ``report.md`` (the
scores, the setup they were measured on, and every served completion that differs from
transformers'), in a folder of its own per run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reporting.tables import percent, table

MISMATCH_ROWS = 60  # the markdown lists this many; the JSON lists them all


def machine() -> dict[str, Any]:
    """Cores, CPU model and the flags that decide its speed (/proc/cpuinfo), library versions."""
    from bench.format import machine as describe
    from bench.format import machine_label

    info = describe("cpu")
    info["label"] = machine_label(info)
    return info


def _first_difference(a: str, b: str) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def _clip(text: str, width: int = 40) -> str:
    return repr(text if len(text) <= width else text[:width] + "…")


def server_line(server: dict[str, Any]) -> str:
    """What the server runs: Triton's engine settings when readable, else what we were told."""
    engine = server.get("engine")
    if engine:
        said = ", ".join(f"{k} {v}" for k, v in engine.items())
        if engine.get("backend") == "auto":
            said += " (auto: openvino on a CPU, torch on a CUDA GPU)"
        return f"engine ({said}), read from Triton's `engine` config"
    given = server.get("settings_given")
    return f"as given on the command line: {given}" if given else "not readable from the server"


def setup_lines(data: dict[str, Any]) -> list[str]:
    model, server, settings = data["model"], data["server"], data["settings"]
    sandbox = data["sandbox"]
    shape = ", ".join(
        f"{key} {model[key]:,}"
        for key in ("parameters", "layers", "width", "context", "vocab")
        if isinstance(model.get(key), int)
    )
    started = " (started by this run)" if server.get("started_here") else ""
    return [
        "## Setup",
        "",
        f"- Machine: {data['machine'].get('label', data['machine'])}",
        f"- Model: `{model['checkpoint']}`, model_type `{model.get('model_type')}`, {shape}",
        f"- Server: {server['url']}{started}, model `{server.get('model')}`; {server_line(server)}",
        f"- Problems: {settings['problems']} of 164 ({settings['selection']}); greedy "
        f"(temperature 0); HumanEval max_tokens {settings['max_tokens']} (capped by the context), "
        f"stops {settings['stops']}; lines: max_tokens {settings['line_max_tokens']}, stop `\\n`",
        f"- Token healing: {settings.get('token_healing', 'server default')} (transformers "
        "alone heals as the server does when it is on)",
        f"- Transformers: {settings['transformers_note']}; sandbox: `python -I`, "
        f"{settings['timeout']:g} s per program; {settings['concurrency']} requests in flight",
        f"- Sandbox check: {sandbox['passed']}/{sandbox['total']} canonical solutions pass"
        + (f" (failed: {sandbox['failed']})" if sandbox["failed"] else ""),
        "",
    ]


def humaneval_lines(section: dict[str, Any]) -> list[str]:
    rows = [("served", section["served"])]
    if section["transformers"] is not None:
        rows.append(("transformers, float32", section["transformers"]))
    lines = ["## HumanEval pass@1 (greedy)", ""]
    lines += table(
        ["path", "passed", "problems", "pass@1"],
        [(name, s["passed"], s["total"], percent(s["pass_at_1"], 1)) for name, s in rows],
        "lrrr",
    )
    lines.append("")
    if section["compared"]:
        lines.append(
            f"Completions compared problem by problem: {len(section['mismatches'])} of "
            f"{section['compared']} differ."
        )
        found = {p["task_id"]: p for p in section["problems"]}
        diff_rows = []
        for task in section["mismatches"][:MISMATCH_ROWS]:
            served, alone = found[task]["served"], found[task]["transformers"]
            at = _first_difference(served["completion"], alone["completion"])
            diff_rows.append(
                (
                    task,
                    at,
                    _clip(served["completion"][at:]),
                    _clip(alone["completion"][at:]),
                    served["result"],
                    alone["result"],
                )
            )
        if diff_rows:
            lines += [
                "",
                *table(
                    [
                        "problem",
                        "differs at char",
                        "served from there",
                        "transformers from there",
                        "served",
                        "transformers",
                    ],
                    diff_rows,
                    "lr",
                ),
            ]
    else:
        lines.append("Not compared with transformers (`--transformers none`).")
    if section["errors"]:
        lines += ["", f"Served requests that failed (counted as failures): {section['errors']}"]
    return [*lines, ""]


def instruct_lines(section: dict[str, Any] | None, plain: dict[str, Any]) -> list[str]:
    """Instruct HumanEval beside plain completion's pass@1 (evaluation/instruct.py)."""
    lines = ["## Instruct HumanEval pass@1 (greedy, through /v1/chat/completions)", ""]
    if section is None or section["status"] != "ok":
        reason = section["reason"] if section else "not run"
        return [*lines, f"Skipped: {reason}.", ""]
    rows = [("served", section["served"], plain["served"])]
    if section["transformers"] is not None:
        if section["compared"] < section["served"]["total"]:  # --instruct-compare N
            first = f"served, the first {section['compared']}"
            rows.append((first, section["served_compared"], plain["served"]))
        rows.append(("transformers, float32", section["transformers"], plain["transformers"]))
    cells = [
        (name, s["passed"], s["total"], percent(s["pass_at_1"], 1), percent(p["pass_at_1"], 1))
        for name, s, p in rows
        if p is not None
    ]
    header = ["path", "passed", "problems", "instruct pass@1", "plain completion pass@1"]
    lines += table(header, cells, "lrrrr")
    lines.append("")
    if section["compared"]:
        shown = section["mismatches"][:MISMATCH_ROWS]
        lines.append(
            f"Answers compared problem by problem: {len(section['mismatches'])} of "
            f"{section['compared']} differ" + (f": {', '.join(shown)}." if shown else ".")
        )
    if section["errors"]:
        lines += ["", f"Served requests that failed (counted as failures): {section['errors']}"]
    return [*lines, ""]


def next_line_lines(section: dict[str, Any]) -> list[str]:
    rows = [("served", section["served"])]
    if section["transformers"] is not None:
        rows.append(("transformers, float32", section["transformers"]))
    lines = ["## Next-line accuracy", ""]
    lines += table(
        ["path", "lines", "exact", "exact match", "edit similarity"],
        [
            (n, s["lines"], s["exact"], percent(s["exact_match"], 1), f"{s['edit_similarity']:.3f}")
            for n, s in rows
        ],
        "lrrrr",
    )
    if section["compared"]:
        shown = section["mismatches"][:MISMATCH_ROWS]
        more = len(section["mismatches"]) - len(shown)
        lines += [
            "",
            f"Served and transformers lines differ in {len(section['mismatches'])} of "
            f"{section['compared']}"
            + (f": {', '.join(shown)}" if shown else ".")
            + (f" and {more} more" if more > 0 else ""),
        ]
    if section["errors"]:
        lines += ["", f"Served requests that failed: {len(section['errors'])}"]
    return [*lines, ""]


def infill_lines(section: dict[str, Any]) -> list[str]:
    lines = ["## Single-line infilling", ""]
    if section["status"] != "ok":
        return [*lines, f"Skipped: {section['reason']}", ""]
    rows = [("prefix and suffix", section["with_suffix"]), ("prefix only", section["prefix_only"])]
    lines += table(
        ["the model sees", "lines", "passed", "pass@1", "exact match", "edit similarity"],
        [
            (
                n,
                s["total"],
                s["passed"],
                percent(s["pass_at_1"], 1),
                percent(s["exact_match"], 1),
                f"{s['edit_similarity']:.3f}",
            )
            for n, s in rows
        ],
        "lrrrrr",
    )
    if section["errors"]:
        lines += ["", f"Served requests that failed: {len(section['errors'])}"]
    return [*lines, ""]


def markdown(data: dict[str, Any]) -> str:
    title = data["model"].get("name") or data["model"].get("model_type") or "model"
    lines = [
        f"# Completion quality: {title} through {data['server']['url']}",
        "",
        f"{data['created']}, {data['duration_s']:.0f} s. Method: docs/eval.md.",
        "",
        *setup_lines(data),
        *humaneval_lines(data["humaneval"]),
        *instruct_lines(data.get("humaneval_instruct"), data["humaneval"]),
    ]
    if data.get("next_line") is not None:
        lines += [*next_line_lines(data["next_line"]), *infill_lines(data["infill"])]
    return "\n".join(lines)


def write(data: dict[str, Any], folder: Path) -> tuple[Path, Path]:
    """``report.json`` and ``report.md`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    as_json, as_md = folder / "report.json", folder / "report.md"
    as_json.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    as_md.write_text(markdown(data) + "\n")
    return as_json, as_md
