"""The sweep's report from a synthetic run folder (no server needed): an events.csv written by
the one event log (reporting.events) and a run.json of windows, as the driver leaves them.

A renamed column or key fails here, at unit-test time, rather than when a real run draws its
report.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from loadtest.metrics import Deltas, snapshot_deltas, window_figures
from loadtest.prom import COUNTERS
from loadtest.results import MachineInfo, ModelInfo
from loadtest.sweep import ITL_NAME, STREAM_NAME
from loadtest.sweep.report import EVENTS, RUN, length_row, load_run, metric_listing, write_report
from loadtest.sweep.report import main as redraw
from reporting.events import EventLog
from reporting.triton import sample_name
from tests.test_loadtest_metrics import END, START, snapshot

LENGTHS = (8, 32)


def _events() -> EventLog:
    """Per length: slow warm-up requests (outside the window), 197 answered at 200 ms and one
    failure in the window, then 12 streamed requests and 300 inter-token gaps."""
    log = EventLog(profile="sweep", system="http")
    for length in LENGTHS:
        log.stamp(window=length, phase="warm-up")
        for _ in range(5):
            log.record(kind="POST", name="ensemble", latency_ms=5000.0, outcome="ok", error="")
        log.stamp(phase="measure")
        for i in range(198):
            outcome, error = ("error", "boom") if i == 7 else ("ok", "")
            log.record(
                kind="POST",
                name="ensemble",
                latency_ms=200.0,
                started_s=3 + i / 20,
                outcome=outcome,
                error=error,
            )
        log.stamp(phase="stream")
        for _ in range(12):
            log.record(
                kind="grpc-stream",
                name=STREAM_NAME,
                latency_ms=400.0,
                outcome="ok",
                error="",
                first_token_ms=80.0,
                tokens=length,
            )
        for _ in range(300):
            log.record(kind="grpc-stream", name=ITL_NAME, latency_ms=9.0, outcome="ok", error="")
        log.stamp(phase="after")
    return log


def _window(length: int) -> dict:
    deltas = snapshot_deltas(snapshot(START, 100.0), snapshot(END, 110.0))
    source = "Prometheus' increase()" if length == 8 else "Triton's /metrics"
    return {
        "output_len": length,
        "source": source,
        "window_s": deltas.window_s,
        "client_window_s": 10.0,
        "length_start_s": 0.0,
        "window_start_s": 3.2,
        "window_end_s": 13.2,
        "busy_share": {"preprocessing": 0.015, "postprocessing": None},
        "drained": True,
        "deltas": deltas.as_dict(),
    }


@pytest.fixture
def folder(tmp_path):
    _events().save(tmp_path / EVENTS)
    model = ModelInfo(
        triton_version="2.59.0",
        stage_parameters={"engine_batch_size": "16", "checkpoint_path": "x"},
        checkpoint={
            "path": "/ckpt",
            "name": "tiny-test-gptj",
            "parameters": 5_250_000,
            "layers": 4,
            "width": 256,
            "heads": 8,
            "context": 1024,
            "vocab": 4096,
        },
    )
    machine = MachineInfo("a CPU", 2, 7.7, "none", "Linux", "3.12", "2.13.0", "2.47", "2.73")
    settings = {
        "lengths": list(LENGTHS),
        "users": 4,
        "duration_s": 6.0,
        "warmup_s": 3.0,
        "protocol": "http",
        "host": "localhost:8000",
        "stream_users": 1,
        "metrics_url": "http://localhost:8002/metrics",
        "stream_duration_s": 3.0,
        "prompts": 300,
        "prompt_seed": 0,
        "sampling": {"top_k": 40},
    }
    run = {
        "name": "20260101-000000-http",
        "started": "2026-01-01T00:00:00",
        "seconds": 42.0,
        "command": "python -m loadtest.sweep --quick",
        "settings": settings,
        "prometheus": "Prometheus at http://127.0.0.1:9090 (target 127.0.0.1:8002)",
        "machine": dataclasses.asdict(machine),
        "model": dataclasses.asdict(model),
    }
    windows = [_window(length) for length in LENGTHS]
    (tmp_path / RUN).write_text(json.dumps({"run": run, "windows": windows}))
    return tmp_path


def test_each_lengths_figures_join_its_window_rows_and_tritons_increases(folder):
    _, frame, table = load_run(folder)
    assert len(frame) == 2 * (5 + 198 + 12 + 300)
    assert list(table["output_len"]) == list(LENGTHS)
    row = table.iloc[0]
    # the client's: only the measured window's unary rows (the slow warm-up is left out)
    assert (row["requests"], row["failures"]) == (198, 1)
    assert row["rps"] == pytest.approx(19.8)
    assert row["latency_mean_ms"] == row["latency_p50_ms"] == row["latency_p99_ms"] == 200
    assert row["errors"] == {"boom": 1}
    assert (row["stream_requests"], row["gaps"]) == (12, 300)
    assert row["ttft_mean_ms"] == 80 and row["itl_p95_ms"] == 9
    # Triton's, from the window's increases: the same arithmetic as the metrics' unit tests
    assert row["triton_requests"] == 200 and row["tokens_per_s"] == pytest.approx(640.0)
    assert row["share_preprocessing"] == pytest.approx(0.02)
    assert row["busy_preprocessing"] == 0.015
    assert row["source"] == "Prometheus' increase()"  # one source per window, named


def test_a_window_no_request_completed_in_has_no_latency_but_tritons_figures():
    row = length_row(EventLog(profile="sweep").frame(), _window(8))
    assert (row["requests"], row["failures"], row["rps"]) == (0, 0, 0)
    assert row["latency_mean_ms"] is None and row["latency_p95_ms"] is None
    assert row["ttft_mean_ms"] is None and row["gaps"] == 0
    assert row["triton_requests"] == 200


def test_the_report_is_drawn_from_the_event_table_and_the_windows(folder):
    paths = write_report(folder)
    names = {p.name for p in paths}
    charts = {
        "rps_latency.png",
        "stage_shares.png",
        "timeseries_len_0008.png",
        "timeseries_len_0032.png",
    }
    assert names == charts | {"report.md"}
    for name in charts:
        assert (folder / name).stat().st_size > 10_000
    report = (folder / "report.md").read_text()
    assert "$" not in report.replace("$PROMETHEUS_URL", "")  # every placeholder filled
    table = [line for line in report.splitlines() if line.startswith("|")]
    assert [c.strip() for c in table[0].split("|")[1:4]] == ["output len", "requests", "RPS"]
    first = [c.strip() for c in table[2].split("|")[1:-1]]
    assert first[:9] == ["8", "198", "19.80", "200", "200", "200", "200", "200", "1"]
    assert first[9:] == ["640", "32.0", "2.00 / 4.00 / 2.00", "6.0", "2.00%", "1.00%", "2.06%"]
    assert "### Output Length: 32" in report and "![](timeseries_len_0032.png)" in report
    assert 'nv_inference_count{model="ensemble"} 200' in report
    assert "# Prefix-cache reuse: " in report  # reused over received, beside the listing
    assert "Preprocessing spends 2.00% of the model inference time (1.50% counting" in report
    assert "Postprocessing spends 1.00% of the model inference time.\n" in report
    assert "- 1 requests failed: {'boom': 1}" in report
    assert "time to first token mean 80 ms" in report and "(300 gaps)" in report
    assert "# metrics: increase over the measured window, from Prometheus' increase()" in report
    assert "# metrics: increase over the measured window, from Triton's /metrics" in report
    assert "Prometheus agrees" not in report  # one reading per window: nothing compared
    assert "- Model: `tiny-test-gptj` GPT-J, 4 layers x 256 wide" in report
    assert "checkpoint_path" not in report
    assert "## How the figures are computed" in report and report.endswith("ends.\n")

    # redrawn from the folder alone: the same report
    (folder / "report.md").unlink()
    assert redraw([str(folder)]) == 0
    assert (folder / "report.md").read_text() == report


def test_prometheus_is_asked_for_every_counter_the_report_reads(monkeypatch):
    """A counter left out of the Prometheus queries would read 0 in every Prometheus window."""
    asked: set[str] = set()
    real = Deltas.get

    def spy(self: Deltas, metric: str, model: str) -> float:
        asked.add(sample_name(metric))
        return real(self, metric, model)

    monkeypatch.setattr(Deltas, "get", spy)
    window_figures(Deltas({}, 1.0))
    listed = {line.split("{")[0] for line in metric_listing({}) if "{" in line[:60]}
    assert listed and asked
    assert asked | {sample_name(m) for m in listed} <= {sample_name(c) for c in COUNTERS}
