"""Markdown tables, number formats and template prose, the same for every report."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path

MISSING = "-"  # a figure that was not measured


def number(value: float | None, digits: int = 1) -> str:
    """``value`` with thousands separators and ``digits`` decimals; "-" when missing."""
    return MISSING if value is None else f"{value:,.{digits}f}"


def percent(value: float | None, digits: int = 2) -> str:
    """A share (0.25) as a percentage ("25.00%"); "-" when missing."""
    return MISSING if value is None else f"{100 * value:.{digits}f}%"


def _checked(
    header: Sequence[str], rows: Iterable[Sequence[object]], align: str
) -> tuple[list[bool], list[list[str]]]:
    """Which columns are right-aligned, and the cells as text; a malformed table is refused."""
    if len(align) > len(header):
        raise ValueError(f"align {align!r} has more letters than the {len(header)} columns")
    if set(align) - {"l", "r"}:
        raise ValueError(f"align {align!r}: one of l or r per column")
    cells = []
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"a row of {len(row)} cells in a table of {len(header)} columns")
        cells.append([str(cell) for cell in row])
    return [a == "r" for a in align.ljust(len(header), "l")], cells


def table(header: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> list[str]:
    """A Markdown table's lines. ``align`` has one letter per column: ``l`` (the default for
    a column it leaves out) or ``r``. Cells are written with ``str``, on one line, ``|``
    escaped, so any text fits in a cell."""
    right, cells = _checked(header, rows, align)

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in row) + " |"

    rules = "|" + "|".join("---:" if r else "---" for r in right) + "|"
    return [line(header), rules, *(line(row) for row in cells)]


def text_table(
    header: Sequence[str], rows: Iterable[Sequence[object]], align: str = ""
) -> list[str]:
    """The same table for a terminal: padded columns, the ``r`` ones right-justified."""
    right, cells = _checked(header, rows, align)
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(header)]

    def line(row: Sequence[str]) -> str:
        padded = (
            c.rjust(w) if r else c.ljust(w) for c, w, r in zip(row, widths, right, strict=True)
        )
        return "  ".join(padded).rstrip()

    return [line(header), line(["-" * w for w in widths]), *(line(row) for row in cells)]


@cache
def templates(path: Path) -> dict[str, str]:
    """The pieces of a template file, by name: ``<!-- template: NAME -->`` starts one; what comes
    before the first is the file's own comment. Reports keep their prose there."""
    parts = re.split(r"^<!-- template: (\w+) -->\n", Path(path).read_text(), flags=re.MULTILINE)
    pieces = zip(parts[1::2], parts[2::2], strict=True)
    return {name: body.removesuffix("\n") for name, body in pieces}
