"""Number and table formatting shared by every bench table: pure functions, unit-tested."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from string import Template
from typing import Any

from reporting import tables
from reporting.machine import describe

Table = tuple[str, str, list[str], list[list[str]]]  # title, context line, headers, rows
TEMPLATES = Path(__file__).with_name("report.md")


def prose(name: str, lines: bool = False, **values: Any) -> str:
    """A piece of the report's prose (bench/report.md), its ``$names`` filled in; on one line
    unless ``lines``."""
    text = tables.templates(TEMPLATES)[name]
    return Template(text if lines else text.replace("\n", " ")).substitute(values)


def machine(device: str = "cpu") -> dict[str, Any]:
    """This machine (:func:`reporting.machine.describe`) with torch's threads and, on CUDA,
    the GPU it runs on."""
    import torch

    info = describe()
    info.update(torch_threads=torch.get_num_threads(), device=device, gpu=None)
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def machine_label(info: dict[str, Any]) -> str:
    """One line for every table and chart: cores, CPU, threads (and GPU)."""
    text = f"{info['cores']} cores, {info['cpu']}, torch threads {info['torch_threads']}"
    if info.get("cpu_flags"):
        text += f", flags {' '.join(info['cpu_flags'])}"
    return text + (f", GPU {info['gpu']}" if info.get("gpu") else "")


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator is 0."""
    return None if numerator is None or not denominator else numerator / denominator


def fmt(value: float | int | None, digits: int = 0, suffix: str = "") -> str:
    """A number for a table: thousands separators, ``digits`` decimals; "—" for missing."""
    return "—" if value is None else f"{value:,.{digits}f}{suffix}"


def rate(value: float | None) -> str:
    """tokens/s for a table: whole numbers, one decimal below 10 (a 350M model at batch 1)."""
    return fmt(value, 1 if value is not None and value < 10 else 0)


def verdict(value: float | None, limit: float, at_most: bool) -> str:
    """ "ok" / "MISSED" against a target (at most / at least ``limit``); "—" without a value."""
    if value is None:
        return "—"
    return "ok" if (value <= limit if at_most else value >= limit) else "MISSED"


def _table(draw: Any, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A header with a leading space marks a numeric column: right-aligned."""
    align = "".join("r" if h.startswith(" ") else "l" for h in headers)
    return "\n".join(draw([h.strip() for h in headers], rows, align))


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    return _table(tables.table, headers, rows)


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    return _table(tables.text_table, headers, rows)


def render_text(table: Table) -> str:
    title, context, headers, rows = table
    return f"\n== {title}\n{context}\n\n{text_table(headers, rows)}\n"


def columns(
    spec: Sequence[tuple[str, Callable[[Any], str]]], rows: Sequence[Any]
) -> tuple[list[str], list[list[str]]]:
    """A table's headers and cells from ``(header, cell of a row)`` pairs."""
    return [h for h, _ in spec], [[cell(row) for _, cell in spec] for row in rows]


def context(results: dict[str, Any], *parts: str) -> str:
    machine = results.get("machine_label", "")
    return " · ".join(p for p in (f"machine: {machine}", *parts) if p)


def model_text(results: dict[str, Any], name: str) -> str:
    found = [m["description"] for m in results.get("models", []) if m["name"] == name]
    return f"model: {name}" + (f" ({found[0]})" if found else "")
