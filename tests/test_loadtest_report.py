"""The typed results, summary.json and the report, on a synthetic run (no server needed).

A renamed field fails here, at unit-test time, rather than when a real run draws its report.
"""

from __future__ import annotations

import json

import pytest

from loadtest.metrics import snapshot_deltas, window_figures
from loadtest.results import (
    CheckpointInfo,
    ClientFigures,
    Latency,
    LengthResult,
    LocustWindow,
    MachineInfo,
    ModelInfo,
    RequestRecord,
    RunInfo,
    RunResult,
    RunSettings,
    StreamFigures,
    Timeline,
    length_file,
    read_request_log,
    write_request_log,
)
from loadtest.sweep.report import main as redraw
from loadtest.sweep.report import write_report
from tests.test_loadtest_metrics import END, START, snapshot

# summary.json's row keys, in order: the stable headline keys first, then the details.
ROW_KEYS = [
    "output_len", "protocol", "users", "window_s", "rps", "latency_ms", "failures", "requests",
    "tokens_per_s", "tokens_per_request", "batch_size", "engine_batch_size", "stage_share",
    "queue_share", "busy_share", "locust", "triton", "triton_deltas", "timeline", "stream",
    "drained", "files", "source",
]  # fmt: skip


def _latency(ms: float) -> Latency:
    return Latency(ms, ms, 1.2 * ms, 1.3 * ms, 1.5 * ms, 2 * ms)


def _row(length: int, source: str) -> LengthResult:
    deltas = snapshot_deltas(snapshot(START, 100.0), snapshot(END, 110.0))
    direct = window_figures(deltas)
    stream = ClientFigures(12, 0, 1.2, _latency(80.0))
    return LengthResult(
        output_len=length,
        protocol="http",
        users=4,
        busy_share={"preprocessing": 0.015, "postprocessing": None},
        locust=LocustWindow(198, 1, 19.8, _latency(200.0), window_s=10.0, errors={"boom": 1}),
        triton=direct,
        triton_deltas=deltas.as_dict(),
        timeline=Timeline(3.2, 13.2),
        stream=StreamFigures(1, 3.0, stream, ClientFigures(300, 0, 100.0, _latency(9.0)), stream),
        drained=True,
        files=[length_file(length, "_stats.csv")],
        source=source,
    )


@pytest.fixture
def result() -> RunResult:
    run = RunInfo(
        name="20260101-000000-http",
        started="2026-01-01T00:00:00",
        seconds=42.0,
        command="python -m loadtest.sweep --quick",
        settings=RunSettings(
            lengths=[8, 32],
            users=4,
            duration_s=6.0,
            warmup_s=3.0,
            protocol="http",
            host="localhost:8000",
            metrics_url="http://localhost:8002/metrics",
            stream_users=1,
            stream_duration_s=3.0,
            prompts=300,
            prompt_seed=0,
            sampling={"top_k": 40, "top_p": 0.95, "temperature": 0.8},
        ),
        prometheus="Prometheus at http://127.0.0.1:9090 (target 127.0.0.1:8002)",
        machine=MachineInfo("a CPU", 2, 7.7, "none", "Linux", "3.12", "2.13.0", "2.47", "2.73"),
        model=ModelInfo(
            triton_version="2.59.0",
            stage_parameters={"engine_batch_size": "16", "checkpoint_path": "x"},
            checkpoint=CheckpointInfo("/ckpt", "tiny-test-gptj", 5_250_000, 4, 256, 8, 1024, 4096),
        ),
    )
    return RunResult(run, [_row(8, "Prometheus' increase()"), _row(32, "Triton's /metrics")])


def test_summary_json_keeps_its_stable_keys_and_round_trips(result, tmp_path):
    data = json.loads(json.dumps(result.to_dict()))
    assert list(data) == ["run", "rows"]
    for row in data["rows"]:
        assert list(row) == ROW_KEYS
        assert list(row["latency_ms"]) == ["mean", "p50", "p90", "p95", "p99", "max"]
        assert set(row["batch_size"]) == {"ensemble", "preprocessing", "gptj", "postprocessing"}
        assert set(row["stage_share"]) == {"preprocessing", "model", "postprocessing"}
        assert set(row["stream"]) == {"users", "seconds", "ttft", "inter_token", "total"}
    # the headline figures are the sources' own: Locust's rps, the metrics' tokens/s
    first = data["rows"][0]
    assert first["rps"] == first["locust"]["rps"] == 19.8
    assert first["tokens_per_s"] == first["triton"]["tokens_per_s"] == pytest.approx(640.0)
    assert first["source"] == "Prometheus' increase()"  # one source per window, named
    # what the report reads back is what was written, types included
    loaded = RunResult.load(result.save(tmp_path / "summary.json"))
    assert loaded == result
    assert loaded.to_dict() == data


def test_request_log_round_trips(tmp_path):
    records = [
        RequestRecord(0.5, "ensemble", 120.0, 300, False),
        RequestRecord(1.25, "x", 7, 0, True),
    ]
    write_request_log(tmp_path / "log.csv", records)
    assert read_request_log(tmp_path / "log.csv") == records


def test_the_report_is_drawn_from_typed_results(result, tmp_path):
    for row in result.rows:
        write_request_log(
            tmp_path / length_file(row.output_len, "_requests.csv"),
            [RequestRecord(0.1 * i, "ensemble", 150.0 + i, 100, i == 7) for i in range(150)],
        )
    paths = write_report(tmp_path, result)
    names = {p.name for p in paths}
    assert {"summary.json", "report.md", "rps_latency.png", "stage_shares.png"} <= names
    assert {"timeseries_len_0008.png", "timeseries_len_0032.png"} <= names
    for name in names - {"summary.json", "report.md"}:
        assert (tmp_path / name).stat().st_size > 10_000
    report = (tmp_path / "report.md").read_text()
    assert "$" not in report.replace("$PROMETHEUS_URL", "")  # every placeholder filled
    assert "| output len | requests | RPS |" in report
    assert "| 8 | 198 | 19.80 | 200 |" in report
    assert "### Output Length: 32" in report and "![](timeseries_len_0032.png)" in report
    assert 'nv_inference_count{model="ensemble"} 200' in report
    assert "# Prefix-cache reuse: " in report  # reused over received, beside the listing
    assert "Preprocessing spends 2.00% of the model inference time (1.50% counting" in report
    assert "Postprocessing spends 1.00% of the model inference time.\n" in report
    assert "- 1 requests failed: {'boom': 1}" in report
    assert "time to first token mean 80 ms" in report
    assert "# metrics: increase over the measured window, from Prometheus' increase()" in report
    assert "# metrics: increase over the measured window, from Triton's /metrics" in report
    assert "Prometheus agrees" not in report  # one reading per window: nothing compared
    assert "- Model: `tiny-test-gptj` GPT-J, 4 layers x 256 wide" in report
    assert "checkpoint_path" not in report
    assert "## How the figures are computed" in report and report.endswith("ends.\n")

    # redrawn from the folder alone: the same report
    (tmp_path / "report.md").unlink()
    assert redraw([str(tmp_path)]) == 0
    assert (tmp_path / "report.md").read_text() == report
