"""Chart helpers every report uses: matplotlib without a display, one palette for the
latency percentiles, figure saving, rolling percentiles and shaded phases."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server
import matplotlib.pyplot as plt
import numpy as np

__all__ = ["COLORS", "MARKERS", "plt", "rolling", "save_figure", "shade_phases"]

MARKERS = {"mean": "o", "p50": "s", "p90": "^", "p95": "v", "p99": "D"}
COLORS = {"mean": "#444444", "p50": "#1f77b4", "p90": "#2ca02c", "p95": "#ff7f0e", "p99": "#d62728"}


def save_figure(fig: Any, path: Path, title: str, dpi: int = 110) -> Path:
    """Title, lay out, write ``path`` and close ``fig`` (a long run draws many)."""
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def rolling(
    times: np.ndarray,
    values: np.ndarray,
    grid: np.ndarray,
    width: float,
    how: Callable[[np.ndarray], float],
) -> list[float]:
    """``how`` (e.g. a percentile) of the values whose times lie in the ``width`` seconds
    before each grid point; NaN where there are none."""
    out = []
    for t in grid:
        chosen = values[(times > t - width) & (times <= t)]
        out.append(how(chosen) if len(chosen) else np.nan)
    return out


def shade_phases(
    axes: Sequence[Any],
    phases: Sequence[tuple[str, float, float]],
    colors: dict[str, str],
    label_axis: Any | None = None,
) -> None:
    """Shade each ``(name, begin, end)`` on every axis; name them at the top of ``label_axis``."""
    for name, begin, end in phases:
        for ax in axes:
            ax.axvspan(begin, end, color=colors.get(name, "#eeeeee"), alpha=0.5, lw=0)
        if label_axis is not None:
            label_axis.text(
                begin, 1.0, f" {name}", transform=label_axis.get_xaxis_transform(), va="top",
                fontsize=8,
            )  # fmt: skip
