"""The benchmark harness's own logic: its maths, its tables and files, its settings (the
systems on real checkpoints: tests/test_bench_systems.py)."""

from __future__ import annotations

import json
import time

import pandas as pd
import pytest

from bench import report
from bench.format import fmt, machine_label, markdown_table, ratio, text_table, verdict
from bench.kernels import fit_tokens, measure
from bench.load import Measurement, served_engine_settings, windowed_rate
from bench.prefill import Prompts
from bench.prefill import measure as prefill_measure
from bench.settings import KernelPlan, make_plan, parse_list
from bench.tables import kernel_comparison, step_cost

# -- maths -------------------------------------------------------------------------------------


def test_ratio_and_verdict():
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(None, 2.0) is None
    assert ratio(1.0, 0.0) is None
    assert verdict(1.10, 1.15, at_most=True) == "ok"
    assert verdict(1.20, 1.15, at_most=True) == "MISSED"
    assert verdict(0.95, 0.9, at_most=False) == "ok"
    assert verdict(0.85, 0.9, at_most=False) == "MISSED"
    assert verdict(None, 0.9, at_most=False) == "—"


def requests(*rows: tuple[int, int, float, float, int]) -> pd.DataFrame:
    """Closed-loop rows from (client, wanted, start s, end s, tokens)."""
    return pd.DataFrame(
        [
            {"client": c, "wanted": w, "started_s": a, "latency_ms": (b - a) * 1e3, "tokens": n}
            for c, w, a, b, n in rows
        ]
    )


def test_windowed_rate_spreads_edge_requests_over_their_life():
    frame = requests(
        (0, 10, 0.0, 10.0, 100),  # half inside [5, 15]: 50 tokens
        (1, 10, 6.0, 8.0, 40),  # wholly inside: 40
        (2, 10, 14.0, 24.0, 100),  # a tenth inside: 10
        (3, 10, 20.0, 21.0, 30),  # outside: 0
        (4, 10, 9.0, 9.0, 7),  # no length, ends inside: all 7
        (5, 10, 4.0, 4.0, 9),  # no length, ends outside: 0
    )
    assert windowed_rate(frame, 5.0, 15.0) == pytest.approx((50 + 40 + 10 + 7) / 10)
    with pytest.raises(ValueError):
        windowed_rate(frame, 5.0, 5.0)


def test_windowed_rate_of_a_steady_closed_loop_is_its_true_rate():
    # 4 clients, each request 8 tokens in 0.5 s back to back, offset: 64 tokens/s in total
    frame = requests(
        *(
            (c, 8, c * 0.125 + k * 0.5, c * 0.125 + (k + 1) * 0.5, 8)
            for c in range(4)
            for k in range(40)
        )
    )
    assert windowed_rate(frame, 3.3, 17.1) == pytest.approx(64.0)


def test_latencies_take_complete_requests_started_in_the_window():
    m = Measurement(
        requests(
            (0, 8, 0.5, 0.6, 8),  # before the window
            (0, 8, 1.0, 1.2, 8),
            (1, 512, 1.0, 3.0, 512),  # a long one
            (0, 8, 1.9, 2.4, 8),  # ends after the window: still counted
            (0, 8, 1.5, 1.6, 3),  # cut short (cancelled): not counted
        ),
        w0=1.0,
        w1=2.0,
    )
    assert m.latencies(8) == pytest.approx([0.2, 0.5])
    assert m.short_of() == 1 and m.window_s == 1.0
    assert Measurement(requests(), 0.0, 1.0).latencies(8) == []


def test_fit_tokens_cuts_slow_cells_to_the_budget():
    assert fit_tokens(0.4, 4, budget_s=10, wanted=64, minimum=8) == 64  # 6.4 s fits
    assert fit_tokens(4.0, 4, budget_s=10, wanted=64, minimum=8) == 10
    assert fit_tokens(40.0, 4, budget_s=10, wanted=64, minimum=8) == 8  # never below minimum


class _FakeRunner:
    """Takes ``per_token`` seconds per token; stops ``early`` tokens short when asked to."""

    system = "fake"
    detail = "fake"

    def __init__(self, per_token: float, early: int = 0) -> None:
        self.per_token, self.early, self.calls = per_token, early, []

    def generate_ids(self, prompts, new, sampled, seed):
        self.calls.append(new)
        time.sleep(self.per_token * new)
        return [[1] * (new - self.early) for _ in prompts]

    def close(self) -> None:
        pass


def test_measure_probes_then_times_whole_cells():
    kplan = KernelPlan(batches=(2,), new_tokens=10, cell_budget_s=5.0, min_cell_s=0.0)
    runner = _FakeRunner(per_token=0.002)
    cell = measure(runner, [[1], [2]], kplan, sampled=False, seed=0)
    assert runner.calls == [2, 10]  # the probe, then one timed run of the full count
    assert cell["new_tokens"] == 10 and cell["note"] == ""
    assert cell["tokens_per_s"] == pytest.approx(2 * 10 / cell["seconds"])


def test_a_probe_slower_than_the_budget_is_the_measurement():
    kplan = KernelPlan(batches=(1,), new_tokens=64, cell_budget_s=0.01, min_cell_s=0.0)
    runner = _FakeRunner(per_token=0.01)
    cell = measure(runner, [[1]], kplan, sampled=True, seed=0)
    assert runner.calls == [2]
    assert cell["new_tokens"] == 2 and "probe only" in cell["note"]


def test_measure_refuses_a_system_that_stops_early():
    kplan = KernelPlan(batches=(1,), new_tokens=8, cell_budget_s=5.0, min_cell_s=0.0)
    with pytest.raises(RuntimeError, match="end token was not banned"):
        measure(_FakeRunner(per_token=0.0, early=1), [[1]], kplan, sampled=False, seed=0)


def test_step_cost_and_comparison_ratios():
    rows = [
        {"model": "m", "dtype": "float32", "system": s, "batch": b, "mode": mode, "tokens_per_s": v}
        for s, b, mode, v in [
            ("engine", 16, "greedy", 1000.0),
            ("engine", 16, "sampled", 800.0),
            ("transformers", 16, "greedy", 500.0),
            ("openvino", 16, "greedy", 2000.0),
            ("engine", 1, "greedy", 100.0),
            ("engine", 1, "sampled", 50.0),
        ]
    ]
    rows.append(
        {
            "model": "m",
            "dtype": "int8",
            "system": "engine",
            "batch": 16,
            "mode": "greedy",
            "note": "not supported (no quantize)",
        }
    )
    comparison = {(e["dtype"], e["batch"], e["mode"]): e for e in kernel_comparison(rows)}
    greedy16 = comparison[("float32", 16, "greedy")]
    assert greedy16["engine_over_transformers"] == pytest.approx(2.0)
    assert greedy16["openvino_over_engine"] == pytest.approx(2.0)
    assert comparison[("int8", 16, "greedy")]["openvino_over_engine"] is None
    steps = step_cost(rows, batches=(16, 64))
    assert len(steps) == 1  # batch 1 is not asked for; int8 has no numbers
    assert steps[0]["sampled_over_greedy_time"] == pytest.approx(1.25)
    assert steps[0]["verdict"] == "MISSED"


# -- tables and files --------------------------------------------------------------------------


def test_markdown_and_text_tables():
    md = markdown_table(["name", " tok/s"], [["a|b", "1,000"], ["c", "2"]])
    assert md.splitlines() == [
        "| name | tok/s |",
        "|---|---:|",
        "| a\\|b | 1,000 |",
        "| c | 2 |",
    ]
    text = text_table(["name", " tok/s"], [["a", "1,000"], ["long name", "2"]])
    lines = text.splitlines()
    assert lines[0].startswith("name") and lines[0].endswith("tok/s")
    assert lines[3].endswith("    2")  # right-justified under its header
    assert fmt(None) == "—" and fmt(1234.5) == "1,234" and fmt(1.256, 2) == "1.26"


def _results() -> dict:
    plan = make_plan(quick=True)
    kernels = [
        {
            "model": "default",
            "plan_key": "default",
            "dtype": d,
            "system": s,
            "batch": b,
            "mode": m,
            "tokens_per_s": v,
            "new_tokens": 16,
        }
        for d in ("float32", "bfloat16")
        for s, v in (("engine", 900.0), ("transformers", 450.0))
        for b in (1, 16)
        for m in ("greedy", "sampled")
    ]
    kernels.append(
        {
            "model": "default",
            "plan_key": "default",
            "dtype": "int8",
            "system": "engine",
            "batch": 1,
            "mode": "greedy",
            "note": "not supported (no quantize parameter)",
        }
    )
    return {
        "started": "2026-01-01T00:00:00",
        "machine": {
            "torch": "2.13.0",
            "transformers": "5",
            "tritonclient": "2",
        },
        "machine_label": "2 cores, Test CPU, torch threads 2",
        "plan": plan.to_dict(),
        "models": [{"name": "default", "description": "4 layers x 256", "path": "/x"}],
        "notes": ["quick run"],
        "kernels": kernels,
        "load_settings": {"model": "default", "dtype": "float32", "max_batch_size": 64},
        "arrivals": [
            {
                "length": 8,
                "forward_ceiling_tokens_per_s": 1500.0,
                "bare_tokens_per_s": 1000.0,
                "served_tokens_per_s": 950.0,
                "static_tokens_per_s": 900.0,
                "served_over_bare": 0.95,
                "continuous_over_static": 1000 / 900,
                "windows": "3/3",
            },
        ],
        "mixed": [
            {
                "path": "bare",
                "alone_median_ms": 50.0,
                "mixed_median_ms": 80.0,
                "slowdown": 1.6,
                "alone_samples": 10,
                "mixed_samples": 9,
            },
        ],
        "single": {
            "bare_median_ms": 20.0,
            "served_median_ms": 31.0,
            "overhead_ms": 11.0,
            "repeats": 6,
        },
        "beams": [
            {
                "width": 4,
                "prompts": 4,
                "new_tokens": 16,
                "engine_tokens_per_s": 220.0,
                "engine_beam_tokens_per_s": 880.0,
                "transformers_tokens_per_s": 190.0,
                "engine_over_transformers": 220 / 190,
                "kv_cache_peak_mib": 16.0,
                "best_beams_agree": 4,
            }
        ],
    }


def test_every_table_names_machine_model_and_settings():
    results = _results()
    tables = report.all_tables(results)
    titles = [t[0] for t in tables]
    assert any(t.startswith("Static batches") for t in titles)
    assert "Engine: sampled step vs greedy step" in titles
    assert any(t.startswith("Continuous arrivals") for t in titles)
    for _title, context, headers, rows in tables:
        assert "2 cores, Test CPU, torch threads 2" in context
        assert "model" in context or "same static batches" in context
        assert all(len(row) == len(headers) for row in rows)
    kernels = tables[0]
    assert "n/s" in [cell for row in kernels[3] for cell in row]  # unsupported int8 engine
    assert "not supported (no quantize parameter)" in kernels[1]  # said once, in the context


def test_write_all_writes_markdown_json_and_chart(tmp_path):
    results = _results()
    written = report.write_all(tmp_path, results)
    assert {p.name for p in written} == {"results.json", "results.md", "chart.png"}
    assert json.loads((tmp_path / "results.json").read_text())["single"]["overhead_ms"] == 11.0
    md = (tmp_path / "results.md").read_text()
    assert "## Continuous arrivals: 16 closed-loop clients" in md
    assert "| 8 | 1,500 | 1,000 | — | 950 | 0.95 | ok |" in md
    assert "| 4 | 220 | 880 | 190 | 1.16x | 16.0 | 4/4 |" in md
    assert "machine: 2 cores, Test CPU, torch threads 2" in md
    assert (tmp_path / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_empty_results_write_no_chart(tmp_path):
    results = _results()
    for key in ("kernels", "arrivals", "mixed", "single", "beams"):
        results.pop(key)
    assert report.write_chart(tmp_path / "chart.png", results) is None
    assert "## " not in report.render_markdown(results)


# -- settings, machine, server config ----------------------------------------------------------


def test_quick_plan_is_smaller_and_only_selects_sections():
    full, quick = make_plan(), make_plan(quick=True)
    assert full.lengths == (8, 32, 128, 512) and full.clients == 16
    assert full.kernels["default"].batches == (1, 16, 64)
    assert len(quick.lengths) < len(full.lengths) and quick.window_s < full.window_s
    assert quick.models == ("default",)
    assert make_plan(only="single, kernels").sections == ("kernels", "single")
    with pytest.raises(ValueError, match="unknown sections"):
        make_plan(only="kernels,speed")
    assert parse_list("", ("a",), "x") is None
    assert make_plan(lengths="8,64").lengths == (8, 64)
    with pytest.raises(ValueError, match="positive"):
        make_plan(lengths="8,0")


def test_machine_label():
    label = machine_label({"cores": 2, "cpu": "X", "torch_threads": 2, "gpu": None})
    assert label == "2 cores, X, torch threads 2"


def test_bare_engine_matches_the_served_config():
    from serving import model_config
    from serving.paths import MODEL_REPOSITORY

    params = model_config.parameters(model_config.read(MODEL_REPOSITORY / "engine"))
    assert params["dtype"] == "float32"
    settings = served_engine_settings()
    assert settings["max_batch_size"] == int(params["engine_max_batch_size"])
    assert settings["max_prefill_tokens"] == int(params["engine_max_prefill_tokens"])


def test_the_prefill_bench_measures_its_three_figures_on_a_server(openvino_server, tiny_checkpoint):
    """``python -m bench.prefill``'s measurement against a running server (the tiny model, whose
    openvino engine prefills in chunks): cold prompts are distinct, and every figure is a time."""
    prompts = Prompts(tiny_checkpoint, seed=1)
    assert prompts.cold(50) != prompts.cold(50)
    figures = prefill_measure(openvino_server.grpc_url, prompts, 100, 1)
    assert len(figures) == 3
    assert all(0 < value < 120_000 for value in figures.values()), figures
