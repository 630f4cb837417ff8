"""The run's chart: one PNG, a panel per section, each titled with its model and settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.format import model_text
from bench.tables import KERNEL_SYSTEMS, kernel_comparison


def write_chart(path: Path, results: dict[str, Any]) -> Path | None:
    """One PNG: a panel per model's static-batch comparison, one for arrivals, one for the
    latencies (mixed and single). Every panel's title carries its model, dtype and settings;
    the figure's title the machine."""
    from reporting.charts import plt, save_figure  # matplotlib on Agg, loaded only to draw

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
    colors = {
        "engine": "#1f77b4",
        "openvino": "#e377c2",
        "transformers": "#ff7f0e",
        "ct2": "#2ca02c",
    }
    load_model = results.get("load_settings", {}).get("model", "default")
    load_dtype = results.get("load_settings", {}).get("dtype", "?")
    for ax, panel in zip(axes[:, 0], panels, strict=True):
        if panel.startswith("kernels:"):
            model = panel.split(":", 1)[1]
            entries = [e for e in comparison if e["model"] == model]
            labels = [f"{e['dtype']}\nb{e['batch']} {e['mode'][:6]}" for e in entries]
            width = 0.2
            for i, system in enumerate(KERNEL_SYSTEMS):
                values = [e.get(system) or 0 for e in entries]
                xs = [x + (i - 1.5) * width for x in range(len(entries))]
                ax.bar(xs, values, width, label=system, color=colors[system])
            ax.set_xticks(range(len(entries)), labels, fontsize=7)
            ax.set_yscale("log")
            ax.set_ylabel("generated tokens/s (log)")
            ax.set_title(
                f"static batches — {model_text(results, model)}; sampled = top-k 40, "
                "top-p 0.95, T 0.8; missing bar = not supported",
                fontsize=9,
            )
            ax.legend(fontsize=8)
        elif panel == "arrivals":
            rows = results["arrivals"]
            series = (
                ("torch bare", "bare_tokens_per_s", "#1f77b4"),
                ("torch served", "served_tokens_per_s", "#9467bd"),
                ("torch static batches", "static_tokens_per_s", "#8c564b"),
                ("openvino bare", "openvino_bare_tokens_per_s", "#e377c2"),
                ("openvino served", "openvino_served_tokens_per_s", "#bcbd22"),
            )
            width = 0.16
            for i, (label, key, color) in enumerate(series):
                xs = [x + (i - 2) * width for x in range(len(rows))]
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
                where = r["path"].replace("_", "\n")
                labels += [f"{where}\nshort alone", f"{where}\nshort mixed"]
                values += [r.get("alone_median_ms") or 0, r.get("mixed_median_ms") or 0]
                colors_ += ["#17becf", "#d62728"]
            single = results.get("single") or {}
            for served, color in (
                ("bare", "#1f77b4"),
                ("served", "#9467bd"),
                ("openvino_bare", "#e377c2"),
                ("openvino_served", "#bcbd22"),
            ):
                if single.get(f"{served}_median_ms") is not None:
                    labels.append("single\n" + served.replace("_", " "))
                    values.append(single[f"{served}_median_ms"])
                    colors_.append(color)
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
    return save_figure(fig, path, f"make bench — {results.get('machine_label', '')}")
