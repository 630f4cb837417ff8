"""A run folder's report: ``summary.json`` (:mod:`loadtest.results`), the charts
(:mod:`loadtest.sweep.charts`) and ``report.md`` (:mod:`loadtest.sweep.markdown`).

Everything is drawn from the typed results and the request logs in the folder, so a report can
be redrawn without rerunning the load: ``python -m loadtest.sweep.report <run folder>``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from loadtest.results import RunResult
from loadtest.sweep import markdown
from loadtest.sweep.charts import draw_charts


def write_report(out: Path, result: RunResult) -> list[Path]:
    """Write summary.json, the charts and report.md into ``out``; returns the paths."""
    out = Path(out)
    paths = [result.save(out / "summary.json"), *draw_charts(out, result)]
    report = out / "report.md"
    report.write_text(markdown.render(result))
    return [*paths, report]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Redraw a load test report from its folder.")
    parser.add_argument("run", type=Path, help="loadtest/results/<run>")
    args = parser.parse_args(argv)
    result = RunResult.load(args.run / "summary.json")
    for path in write_report(args.run, result):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
