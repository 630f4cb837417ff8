"""A short load-test sweep against the real server, its figures from the metrics port.

Two output lengths, a few seconds each, 4 users: then the report, rebuilt from the run folder's
event table and window records, must be consistent with itself and with the server:
requests/s x window ~ requests, the four models counted the same requests, batch sizes >= 1,
shares in [0, 1]. (Prometheus as the source: the scrape-aligned
window and its increases, tests/test_loadtest_metrics.py.)
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from loadtest.sweep import STREAM_NAME
from loadtest.sweep.report import load_run
from serving.paths import REPO_ROOT
from serving.process import http_ready

LENGTHS = (4, 8)
USERS = 4
MODELS = ("ensemble", "preprocessing", "gptj", "postprocessing")


@pytest.fixture(scope="module")
def run(server, tmp_path_factory):
    out = tmp_path_factory.mktemp("loadtest") / "run"
    command = [
        sys.executable,
        "-m",
        "loadtest.sweep",
        "--lengths",
        ",".join(map(str, LENGTHS)),
        "--users",
        str(USERS),
        "--duration",
        "6",
        "--warmup",
        "3",
        "--stream-users",
        "1",
        "--stream-duration",
        "2",
        "--host",
        server.http_url,
        "--grpc-url",
        server.grpc_url,
        "--metrics-url",
        server.metrics_url,
        "--prometheus",
        "off",  # the metrics port: its readings bracket Locust's window
        "--model-repository",
        str(server.model_repository),
        "--out",
        str(out),
    ]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    print(done.stdout[-6000:], done.stderr[-6000:], sep="\n")
    assert done.returncode == 0, done.stderr[-3000:]
    run, frame, table = load_run(out)
    return out, run, frame, table, done.stdout


def test_every_request_is_a_row_of_the_event_table(run):
    _, info, frame, table, stdout = run
    assert list(table["output_len"]) == list(LENGTHS)
    assert set(frame["profile"]) == {"sweep"} and set(frame["window"]) == set(LENGTHS)
    assert {"warm-up", "measure", "stream"} <= set(frame["phase"])
    streamed = frame[frame["name"] == STREAM_NAME]
    assert len(streamed) and (streamed["first_token_ms"] > 0).all()
    assert (streamed["tokens"] > 0).all()
    assert [w["output_len"] for w in info["windows"]] == list(LENGTHS)
    assert "length 8: measuring" in stdout  # a progress line per phase


def test_requests_rate_and_counts_are_consistent(run):
    _, _, _, table, _ = run
    for _, row in table.iterrows():
        assert row["requests"] > 0 and row["failures"] == 0, row["errors"]
        # the event table's requests/s times the window is the number Triton completed
        triton = row["count_ensemble"]
        assert row["rps"] * row["window_s"] == pytest.approx(triton, abs=max(USERS, 0.05 * triton))
        # the client sees a completion a few ms after Triton counts it (a wave of completions,
        # one per user, can fall in between at an edge), and on a loaded machine the metric read
        # and the window's stamp at each edge are a few hundred ms apart, during which requests
        # complete at the window's rate: allow both
        assert row["requests"] == pytest.approx(triton, abs=max(2 * USERS, 0.05 * triton))
        # every request passed through the four models; in-flight ones at the edges aside
        for model in MODELS:
            assert abs(row[f"count_{model}"] - triton) <= USERS, model
        # the engine (decoupled) is counted once its execute returns, which on a busy machine
        # can come after its caller was answered: up to a user's request late at each edge
        assert abs(row["engine_requests"] - row["count_gptj"]) <= 2 * USERS
        percentiles = [row[f"latency_p{q}_ms"] for q in (50, 90, 95, 99)]
        assert percentiles[0] > 0 and percentiles == sorted(percentiles)
        assert row["tokens_per_s"] > 0
        # the window's tokens include those of the requests still running at its end (up to
        # one per user), which a loaded machine's short window may hold few requests to offset
        edge = 1 + USERS / row["engine_requests"]
        assert 0 < row["tokens_per_request"] <= row["output_len"] * edge


def test_batch_sizes_and_shares_are_in_range(run):
    _, _, _, table, _ = run
    for _, row in table.iterrows():
        for model in MODELS:
            assert row[f"batch_{model}"] >= 1, model
        assert row["engine_batch"] >= 1
        for stage in ("preprocessing", "model", "postprocessing"):
            assert 0 < row[f"share_{stage}"] <= 1, stage
        assert row["share_model"] == pytest.approx(1.0)
        for stage in ("preprocessing", "postprocessing"):
            # each execution counted once: about the seed's figure or less (it counts one per
            # request). The statistics are read after the metrics, a few ms apart unloaded and
            # hundreds of ms on a loaded machine, during which executions go on: 1.5x still
            # catches counting per request (batches of up to USERS requests)
            assert 0 < row[f"busy_{stage}"] <= row[f"share_{stage}"] * 1.5, stage
        assert 0 <= row["queue_share"] <= 1
        # the model stage's time is the engine's, far above Triton's admission-only figure
        assert row["compute_model_us"] > row["triton_model_compute_infer_us"]


def test_tritons_figures_come_from_one_source(run):
    _, info, _, table, _ = run
    assert info["run"]["prometheus"] == "Prometheus: off (--prometheus off)"
    for _, row in table.iterrows():
        assert row["source"] == "Triton's /metrics read at both ends of the window"
        assert row["triton_requests"] > 0


def test_streaming_phase_measures_ttft_and_inter_token_latency(run, server):
    ready = f"http://{server.http_url}/v2/models/ensemble_stream/ready"
    assert http_ready(ready), "the model repository serves ensemble_stream"
    _, _, _, table, _ = run
    for _, row in table.iterrows():
        assert row["stream_requests"] > 0 and row["gaps"] > 0
        assert row["ttft_mean_ms"] > 0 and row["itl_mean_ms"] > 0


def test_report_files(run):
    out, info, _, _, _ = run
    report = (out / "report.md").read_text()
    for length in LENGTHS:
        assert f"### Output Length: {length}" in report
        assert (out / f"timeseries_len_{length:04d}.png").stat().st_size > 10_000
        for suffix in ("_stats.csv", "_stats_history.csv", ".html", "_metrics_end.txt"):
            assert (out / f"len_{length:04d}{suffix}").stat().st_size > 0
    for chart in ("rps_latency.png", "stage_shares.png"):
        assert (out / chart).stat().st_size > 10_000
        assert f"]({chart})" in report
    assert re.search(r"^\|\s+output len\s+\|", report, re.MULTILINE)
    assert "Preprocessing spends" in report
    assert info["run"]["machine"]["cores"] >= 1
    assert info["run"]["model"]["checkpoint"]["name"] == "tiny-test-gptj"
    assert "# metrics: increase over the measured window, from Triton's /metrics" in report
