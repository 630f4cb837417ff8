"""A short load-test sweep against the real server, its figures from the metrics port.

Two output lengths, a few seconds each, 4 users: then the report must be consistent with
itself and with the server: requests/s x window ~ requests, the four models counted the same
requests, batch sizes >= 1, shares in [0, 1]. (Prometheus as the source: the scrape-aligned
window and its increases, tests/test_loadtest_metrics.py.)
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from loadtest.results import RunResult
from serving.paths import REPO_ROOT
from serving.process import http_ready

LENGTHS = (4, 8)
USERS = 4
MODELS = ("ensemble", "preprocessing", "gptj", "postprocessing")


@pytest.fixture(scope="module")
def run(server, tmp_path_factory):
    out = tmp_path_factory.mktemp("loadtest") / "run"
    command = [
        sys.executable, "-m", "loadtest.sweep",
        "--lengths", ",".join(map(str, LENGTHS)),
        "--users", str(USERS),
        "--duration", "6",
        "--warmup", "3",
        "--stream-users", "1",
        "--stream-duration", "2",
        "--host", server.http_url,
        "--grpc-url", server.grpc_url,
        "--metrics-url", server.metrics_url,
        "--prometheus", "off",  # the metrics port: its readings bracket Locust's window
        "--model-repository", str(server.model_repository),
        "--progress-every", "2",
        "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    print(done.stdout[-6000:], done.stderr[-6000:], sep="\n")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    return out, summary, RunResult.from_dict(summary), done.stdout


def test_the_sweep_reports_every_length_with_stable_keys(run):
    _, summary, result, stdout = run
    rows = summary["rows"]
    assert [row["output_len"] for row in rows] == list(LENGTHS)
    for row in rows:
        assert {
            "output_len", "rps", "latency_ms", "failures", "tokens_per_s", "batch_size",
            "stage_share", "queue_share",
        } <= row.keys()  # fmt: skip
        assert set(row["latency_ms"]) >= {"mean", "p50", "p90", "p95", "p99"}
        assert set(row["batch_size"]) == set(MODELS)
        assert set(row["stage_share"]) == {"preprocessing", "model", "postprocessing"}
    # every key is a typed field (or a headline figure derived from one): nothing untyped
    assert result.to_dict() == summary
    assert "length 8 (2/2) measure" in stdout  # progress lines: length, phase, time left
    assert "req/s now" in stdout and "left" in stdout


def test_requests_rate_and_counts_are_consistent(run):
    _, _, result, _ = run
    for row in result.rows:
        triton = row.triton
        counts = triton.counts
        assert row.requests > 0 and row.failures == 0, row.locust
        # Locust's requests/s times the window is the number of requests Triton completed
        assert row.rps * row.window_s == pytest.approx(
            counts["ensemble"], abs=max(USERS, 0.05 * counts["ensemble"])
        )
        # the client sees a completion a few ms after Triton counts it (a wave of completions,
        # one per user, can fall in between at an edge), and on a loaded machine the metric read
        # and Locust's reset at each edge are a few hundred ms apart, during which requests
        # complete at the window's rate: allow both
        allowed = max(2 * USERS, 0.05 * counts["ensemble"])
        assert row.requests == pytest.approx(counts["ensemble"], abs=allowed)
        # every request passed through the four models; in-flight ones at the edges aside
        for model in MODELS:
            assert abs(counts[model] - counts["ensemble"]) <= USERS, counts
        # the engine (decoupled) is counted once its execute returns, which on a busy machine
        # can come after its caller was answered: up to a user's request late at each edge
        assert abs(triton.engine_requests - counts["gptj"]) <= 2 * USERS
        lat = row.latency_ms
        assert 0 < lat.p50 <= lat.p90 <= lat.p95 <= lat.p99
        assert row.tokens_per_s > 0
        # the window's tokens include those of the requests still running at its end (up to
        # one per user), which a loaded machine's short window may hold few requests to offset
        edge = 1 + USERS / triton.engine_requests
        assert 0 < row.tokens_per_request <= row.output_len * edge


def test_batch_sizes_and_shares_are_in_range(run):
    _, _, result, _ = run
    for row in result.rows:
        for model in MODELS:
            assert row.batch_size[model] >= 1, (model, row.batch_size)
        assert row.engine_batch_size >= 1
        for stage, share in row.stage_share.items():
            assert 0 < share <= 1, (stage, share)
        assert row.stage_share["model"] == pytest.approx(1.0)
        for stage, share in row.busy_share.items():
            # each execution counted once: about the seed's figure or less (it counts one per
            # request). The statistics are read after the metrics, a few ms apart unloaded and
            # hundreds of ms on a loaded machine, during which executions go on: 1.5x still
            # catches counting per request (batches of up to USERS requests)
            assert 0 < share <= row.stage_share[stage] * 1.5, (stage, share)
        assert 0 <= row.queue_share <= 1
        # the model stage's time is the engine's, far above Triton's admission-only figure
        assert row.triton.compute_us["model"] > row.triton.triton_model_compute_infer_us


def test_tritons_figures_come_from_one_source(run):
    _, _, result, _ = run
    assert result.run.prometheus == "Prometheus: off (--prometheus off)"
    for row in result.rows:
        assert row.source == "Triton's /metrics read at both ends of the window", row.source
        assert row.triton.requests > 0 and row.triton_deltas


def test_streaming_phase_measures_ttft_and_inter_token_latency(run, server):
    ready = f"http://{server.http_url}/v2/models/ensemble_stream/ready"
    assert http_ready(ready), "the model repository serves ensemble_stream"
    _, _, result, _ = run
    for row in result.rows:
        stream = row.stream
        assert stream is not None and stream.ttft.requests > 0, stream
        assert stream.ttft.failures == 0 and stream.total.failures == 0
        assert stream.inter_token.requests > 0
        assert stream.ttft.latency_ms.mean > 0


def test_report_files(run):
    out, _, result, _ = run
    report = (out / "report.md").read_text()
    for length in LENGTHS:
        assert f"### Output Length: {length}" in report
        assert (out / f"timeseries_len_{length:04d}.png").stat().st_size > 10_000
        for suffix in ("_stats.csv", "_stats_history.csv", "_requests.csv", "_metrics_end.txt"):
            assert (out / f"len_{length:04d}{suffix}").stat().st_size > 0
    for chart in ("rps_latency.png", "stage_shares.png"):
        assert (out / chart).stat().st_size > 10_000
        assert f"]({chart})" in report
    assert "| output len | requests | RPS |" in report
    assert "Preprocessing spends" in report and "of the model inference time" in report
    assert result.run.machine.cores >= 1
    assert result.run.model.checkpoint.name == "tiny-test-gptj"
    assert "# metrics: increase over the measured window, from Triton's /metrics" in report
