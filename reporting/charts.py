"""The chart helper every report uses: matplotlib without a display, one palette for the latency
percentiles, figure saving, shaded phases and a latency-over-time panel."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server
import matplotlib.pyplot as plt
import numpy as np

MARKERS = {"mean": "o", "p50": "s", "p90": "^", "p95": "v", "p99": "D"}
COLORS = {"mean": "#444444", "p50": "#1f77b4", "p90": "#2ca02c", "p95": "#ff7f0e", "p99": "#d62728"}


def save_figure(fig: Any, path: Path, title: str, dpi: int = 110) -> Path:
    """Title, lay out, write ``path`` and close ``fig`` (a long run draws many)."""
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


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
                begin,
                1.0,
                f" {name}",
                transform=label_axis.get_xaxis_transform(),
                va="top",
                fontsize=8,
            )


def rolling(times: np.ndarray, values: np.ndarray, grid: np.ndarray, width: float, q: float):
    """The ``q`` quantile of the values whose times lie in the ``width`` seconds before each grid
    point; NaN where there are none."""
    windows = (values[(times > t - width) & (times <= t)] for t in grid)
    return [np.quantile(chosen, q) if len(chosen) else np.nan for chosen in windows]


def latency_panel(
    ax: Any,
    times: np.ndarray,
    values: np.ndarray,
    grid: np.ndarray,
    width: float,
    labels: tuple[str, str, str],
) -> None:
    """Each value as a dot at its time, with its rolling p50 and p95 over ``width`` seconds on
    ``grid``; ``labels``: the dots', the y axis' and the x axis'."""
    dots, ylabel, xlabel = labels
    ax.plot(times, values, ".", ms=3, color="#9e9ac8", alpha=0.5, label=dots)
    for key, q in (("p50", 0.5), ("p95", 0.95)) if len(times) else ():
        line = rolling(times, values, grid, width, q)
        ax.plot(grid, line, color=COLORS[key], lw=1.8, label=f"rolling {key} ({width:.0f} s)")
    ax.set(ylabel=ylabel, xlabel=xlabel, ylim=(0, None))
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
