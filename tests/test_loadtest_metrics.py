"""The load test's metric arithmetic on recorded Triton metric text (no server needed).

The texts below were recorded from the project's Triton (tiny model) during a sweep, trimmed
to the families the load test reads, with the engine's counters as the engine model exports them.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from loadtest.metrics import (
    Deltas,
    busy_shares,
    counter_increase,
    execution_busy_us,
    snapshot_deltas,
    window_figures,
)
from loadtest.prom import AlignedWindow, PromSource
from loadtest.run_prometheus import render_config
from reporting.triton import parse_metrics, sample_name

HEADER = """\
# HELP nv_inference_request_failure Number of failed inference requests, all batch sizes
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{{model="ensemble",reason="OTHER",version="1"}} {fail_other}
nv_inference_request_failure{{model="ensemble",reason="BACKEND",version="1"}} {fail_backend}
# HELP nv_inference_count Number of inferences performed (does not include cached requests)
# TYPE nv_inference_count counter
nv_inference_count{{model="ensemble",version="1"}} {count}
nv_inference_count{{model="gptj",version="1"}} {count}
nv_inference_count{{model="postprocessing",version="1"}} {count}
nv_inference_count{{model="preprocessing",version="1"}} {count}
# HELP nv_inference_exec_count Number of model executions performed
# TYPE nv_inference_exec_count counter
nv_inference_exec_count{{model="ensemble",version="1"}} {count}
nv_inference_exec_count{{model="gptj",version="1"}} {gptj_exec}
nv_inference_exec_count{{model="postprocessing",version="1"}} {post_exec}
nv_inference_exec_count{{model="preprocessing",version="1"}} {pre_exec}
# HELP nv_inference_request_duration_us Cumulative inference request duration in microseconds
# TYPE nv_inference_request_duration_us counter
nv_inference_request_duration_us{{model="ensemble",version="1"}} {ens_request}
nv_inference_request_duration_us{{model="gptj",version="1"}} 1266501
# HELP nv_inference_queue_duration_us Cumulative inference queuing duration in microseconds
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{{model="ensemble",version="1"}} 332
nv_inference_queue_duration_us{{model="gptj",version="1"}} {gptj_queue}
nv_inference_queue_duration_us{{model="postprocessing",version="1"}} {post_queue}
nv_inference_queue_duration_us{{model="preprocessing",version="1"}} {pre_queue}
# HELP nv_inference_compute_infer_duration_us Cumulative compute inference duration in us
# TYPE nv_inference_compute_infer_duration_us counter
nv_inference_compute_infer_duration_us{{model="ensemble",version="1"}} 1189442
nv_inference_compute_infer_duration_us{{model="gptj",version="1"}} {gptj_infer}
nv_inference_compute_infer_duration_us{{model="postprocessing",version="1"}} {post_infer}
nv_inference_compute_infer_duration_us{{model="preprocessing",version="1"}} {pre_infer}
# HELP codegen_engine_requests_total Sequences finished by the generation engine
# TYPE codegen_engine_requests_total counter
codegen_engine_requests_total{{model="engine"}} {engine_requests}
codegen_engine_requests_total{{model="gptj"}} 7
# HELP codegen_engine_queue_duration_us_total Microseconds sequences waited in the engine
# TYPE codegen_engine_queue_duration_us_total counter
codegen_engine_queue_duration_us_total{{model="engine"}} {engine_queue}
# HELP codegen_engine_compute_duration_us_total Microseconds the engine spent computing
# TYPE codegen_engine_compute_duration_us_total counter
codegen_engine_compute_duration_us_total{{model="engine"}} {engine_compute}
codegen_engine_compute_duration_us_total{{model="gptj"}} 999999
# HELP codegen_engine_steps_total Forward passes run by the engine (prefill and decode)
# TYPE codegen_engine_steps_total counter
codegen_engine_steps_total{{model="engine"}} {steps}
# HELP codegen_engine_step_rows_total Sequences processed summed over forward passes
# TYPE codegen_engine_step_rows_total counter
codegen_engine_step_rows_total{{model="engine"}} {rows}
# HELP codegen_engine_generated_tokens_total Tokens generated
# TYPE codegen_engine_generated_tokens_total counter
codegen_engine_generated_tokens_total{{model="engine"}} {tokens}
# HELP nv_inference_pending_request_count Instantaneous number of pending requests per-model.
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{{model="ensemble",version="1"}} {pending}
# HELP codegen_engine_running_sequences Sequences currently running in the engine
# TYPE codegen_engine_running_sequences gauge
codegen_engine_running_sequences{{model="engine"}} {running}
"""

START = dict(
    fail_other=8,
    fail_backend=0,
    count=333,
    gptj_exec=279,
    post_exec=292,
    pre_exec=294,
    ens_request=266162392,
    gptj_queue=779079,
    post_queue=747953,
    pre_queue=361538,
    gptj_infer=429748,
    post_infer=302448,
    pre_infer=577105,
    engine_requests=333,
    engine_queue=23152671.456,
    engine_compute=62991749.754,
    steps=1742,
    rows=7913,
    tokens=7888,
    pending=0,
    running=4,
)
# 10 s later: 200 requests more, in 50 gptj executions and 100 pre/post executions.
END = START | dict(
    fail_other=9,
    fail_backend=1,
    count=533,
    gptj_exec=329,
    post_exec=392,
    pre_exec=394,
    ens_request=266162392 + 200 * 500_000,
    gptj_queue=779079 + 20_000,
    post_queue=747953 + 30_000,
    pre_queue=361538 + 10_000,
    gptj_infer=429748 + 40_000,
    post_infer=302448 + 80_000,
    pre_infer=577105 + 160_000,
    engine_requests=533,
    engine_queue=23152671.456 + 2_000_000,
    engine_compute=62991749.754 + 8_000_000,
    steps=1742 + 1000,
    rows=7913 + 6000,
    tokens=7888 + 6400,
    pending=3,
    running=6,
)


def snapshot(values: dict, at: float):
    return parse_metrics(HEADER.format(**values), taken_at=at)


@pytest.fixture
def window() -> Deltas:
    return snapshot_deltas(snapshot(START, 100.0), snapshot(END, 110.0))


def test_parse_reads_counters_under_their_exposed_names_and_gauges():
    s = snapshot(START, 1.0)
    # Triton's counters have no _total; prometheus_client adds it; lookups take either name.
    assert sample_name("nv_inference_count") == "nv_inference_count_total"
    assert sample_name("codegen_engine_steps_total") == "codegen_engine_steps_total"
    assert sample_name("codegen_engine_running_sequences") == "codegen_engine_running_sequences"
    assert s.value("nv_inference_count", model="gptj") == 333
    assert s.value("nv_inference_exec_count", model="preprocessing") == 294
    assert s.value("codegen_engine_steps_total", model="engine") == 1742
    assert s.value("nv_inference_pending_request_count", model="ensemble") == 0
    assert s.value("codegen_engine_running_sequences") == 4
    # Summed over the labels not asked for (reason, version) and over models when none given.
    assert s.value("nv_inference_request_failure", model="ensemble") == 8
    assert s.value("codegen_engine_requests_total") == 333 + 7
    assert s.value("no_such_metric") == 0


def test_deltas_are_per_model_increases_and_skip_gauges(window):
    assert window.window_s == pytest.approx(10.0)
    assert window.get("nv_inference_count", "ensemble") == 200
    assert window.get("nv_inference_exec_count", "gptj") == 50
    assert window.get("nv_inference_request_failure", "ensemble") == 2  # OTHER +1, BACKEND +1
    assert window.get("codegen_engine_compute_duration_us_total", "engine") == pytest.approx(8e6)
    assert window.get("codegen_engine_compute_duration_us_total", "gptj") == 0
    assert not any(metric.startswith("nv_inference_pending") for metric, _ in window.values)
    assert not any("running_sequences" in metric for metric, _ in window.values)
    assert json.dumps(window.as_dict())  # serialisable for run.json


def test_counter_increase_handles_resets_and_new_series():
    assert counter_increase(10, 25) == 15
    assert counter_increase(None, 7) == 7  # a series born during the window counts from 0
    assert counter_increase(1000, 40) == 40  # reset: only what came after the restart
    assert counter_increase(5, 5) == 0


def test_a_server_restart_inside_the_window_is_a_counter_reset():
    restarted = START | dict(
        count=12,
        gptj_exec=3,
        pre_exec=6,
        post_exec=6,
        engine_compute=400_000,
        steps=30,
        rows=90,
        tokens=96,
        engine_requests=12,
        ens_request=6_000_000,
        fail_other=0,
    )
    d = snapshot_deltas(snapshot(START, 0.0), snapshot(restarted, 10.0))
    assert d.get("nv_inference_count", "ensemble") == 12
    assert d.get("codegen_engine_steps_total", "engine") == 30
    # a counter that did not go down is still an ordinary difference
    assert d.get("nv_inference_request_failure", "ensemble") == 0
    figures = window_figures(d)
    assert figures["triton_rps"] == pytest.approx(1.2)
    assert figures["batch_gptj"] == pytest.approx(4.0)
    assert figures["engine_batch"] == pytest.approx(3.0)


def test_window_figures(window):
    f = window_figures(window)
    assert f["triton_requests"] == 200
    assert f["triton_rps"] == pytest.approx(20.0)
    assert f["triton_failures"] == 2
    assert f["triton_mean_ms"] == pytest.approx(500.0)
    assert f["tokens_per_s"] == pytest.approx(640.0)
    assert f["tokens_per_request"] == pytest.approx(32.0)
    models = ("ensemble", "preprocessing", "gptj", "postprocessing")
    assert {m: f[f"count_{m}"] for m in models} == {m: 200 for m in models}
    # batch size = delta count / delta exec_count; the engine's = rows / steps
    assert {m: f[f"batch_{m}"] for m in models} == {
        "ensemble": 1.0,
        "preprocessing": 2.0,
        "gptj": 4.0,
        "postprocessing": 2.0,
    }
    assert f["engine_batch"] == pytest.approx(6.0)
    # shares of the model stage's time, which is the engine's busy time (8 s), not Triton's
    # gptj compute_infer (40 ms of admission), which is reported beside it
    assert f["compute_model_us"] == pytest.approx(8e6)
    assert f["triton_model_compute_infer_us"] == 40_000
    assert f["share_preprocessing"] == pytest.approx(160_000 / 8e6)
    assert f["share_postprocessing"] == pytest.approx(80_000 / 8e6)
    assert f["share_model"] == pytest.approx(1.0)
    # queue share: the three stages' Triton queues and the engine's wait over request time
    queued = 10_000 + 20_000 + 30_000 + 2_000_000
    assert f["queue_share"] == pytest.approx(queued / (200 * 500_000))
    assert f["engine_busy"] == pytest.approx(0.8)
    assert json.dumps(f)
    # the increases travel in run.json and come back as the same figures
    assert Deltas.from_dict(window.as_dict(), window.window_s) == window


def test_the_original_reports_figures_come_out_of_the_same_arithmetic():
    """The seed's output length 8 listing: 2.73% / 0.83% of the model time, batch ~19."""
    model = "gptj"
    values = {
        ("nv_inference_count_total", m): 391768.0
        for m in ("ensemble", "preprocessing", model, "postprocessing")
    }
    values |= {
        ("nv_inference_exec_count_total", "ensemble"): 391768.0,
        ("nv_inference_exec_count_total", "preprocessing"): 391768.0,
        ("nv_inference_exec_count_total", model): 20439.0,
        ("nv_inference_exec_count_total", "postprocessing"): 391768.0,
        ("nv_inference_compute_infer_duration_us_total", "preprocessing"): 168281250.0,
        ("nv_inference_compute_infer_duration_us_total", "postprocessing"): 51508744.0,
        ("codegen_engine_compute_duration_us_total", "engine"): 6148437063.0,
    }
    f = window_figures(Deltas(values, 228.4))
    assert f["triton_rps"] == pytest.approx(1715, rel=0.01)
    assert f[f"batch_{model}"] == pytest.approx(19.17, abs=0.01)
    assert round(100 * f["share_preprocessing"], 2) == 2.74
    assert round(100 * f["share_postprocessing"], 2) == 0.84


def test_empty_window_gives_none_not_a_division_by_zero():
    f = window_figures(Deltas({}, 5.0))
    assert f["triton_rps"] == 0
    assert f["batch_gptj"] is None
    assert f["engine_batch"] is None
    assert f["share_preprocessing"] is None
    assert f["queue_share"] is None
    assert window_figures(Deltas({}, 0.0))["triton_rps"] is None


class FakeClient:
    """prometheus-api-client's custom_query over recorded scrapes: the raw samples a range
    selector gives, each (exposed metric, model) series valued at time t by its function (None:
    no sample then)."""

    def __init__(self, scrapes: list[float], series: dict[tuple[str, str], Any]) -> None:
        self.scrapes, self.series = scrapes, series
        self.queries: list[tuple[str, dict]] = []

    def custom_query(self, query: str, params: dict):
        self.queries.append((query, params))
        asked = query.split('"')[1].split("|")
        model = re.search(r'model="(\w+)"', query)
        end = float(params["time"])
        start = end - int(query.rsplit("[", 1)[1].removesuffix("ms]")) / 1000
        return [
            {
                "metric": {"__name__": metric, "model": m, "instance": "t"},
                "values": [
                    [at, str(value(at))]
                    for at in self.scrapes
                    if start < at <= end and value(at) is not None
                ],
            }
            for (metric, m), value in self.series.items()
            if metric in asked and (model is None or model.group(1) == m)
        ]


def test_prometheus_window_runs_from_its_first_to_its_last_scrape_inside():
    source = PromSource("http://127.0.0.1:9", instance="127.0.0.1:8002")
    counts = {("nv_inference_count", m): lambda t: 10 * t for m in ("ensemble", "gptj")}
    source.client = FakeClient([100.18 + i for i in range(7)], counts)
    deltas, window = source.window_deltas(100.5, 105.9)
    assert window == AlignedWindow(101.18, 105.18, 5)
    assert deltas.window_s == pytest.approx(4.0) == window.seconds
    assert deltas.get("nv_inference_count", "ensemble") == pytest.approx(40)
    query, params = source.client.queries[-1]
    assert 'instance="127.0.0.1:8002"' in query and params["time"] == "105.900"
    with pytest.raises(RuntimeError, match="scrape"):
        source.window_deltas(100.5, 101.0)


def test_prometheus_gives_the_same_deltas_as_metrics_over_its_own_window():
    """The raw samples at its first and last scrape go through snapshot_deltas: the same
    figures as the /metrics reading over that stretch; a series born inside counts from 0."""
    start, end = snapshot(START, 100.0), snapshot(END, 110.0)
    series = {}
    for (name, labels), value in end.series.items():
        exposed = name.removesuffix("_total") if name.startswith("nv_") else name
        first = start.series[(name, labels)]
        series[(exposed, dict(labels).get("model", ""))] = lambda t, a=first, b=value: (
            a + (b - a) * (t - 100.0) / 10.0
        )
    series[("codegen_engine_prompt_tokens_total", "engine")] = lambda t: None if t < 105 else 70
    source = PromSource("http://127.0.0.1:9", instance="127.0.0.1:8002")
    source.client = FakeClient([101.0 + i for i in range(9)], series)
    deltas, window = source.window_deltas(start.taken_at, end.taken_at)
    assert window.scrapes == 9 and window.seconds == pytest.approx(8.0)
    direct = snapshot_deltas(start, end)
    assert deltas.get("nv_inference_count", "ensemble") == pytest.approx(160)  # 0.8 x 200
    assert window_figures(deltas)["triton_rps"] == pytest.approx(
        window_figures(direct)["triton_rps"]
    )
    assert deltas.get("codegen_engine_prompt_tokens_total", "engine") == 70
    assert not any("pending" in metric for metric, _ in deltas.values)  # gauges: not asked


def test_next_scrape_predicts_the_scrape_phase(monkeypatch):
    source = PromSource("http://127.0.0.1:9", instance="t")
    scrapes = [100.18 + 2 * i for i in range(10)]
    source.client = FakeClient(scrapes, {("nv_inference_count", "ensemble"): lambda t: t})
    monkeypatch.setattr("loadtest.prom.time.time", lambda: 119.0)
    scrape, interval = source.next_scrape(after=121.0)
    assert interval == pytest.approx(2.0)
    assert scrape == pytest.approx(122.18)


def test_prometheus_config_scrapes_the_target():
    text = render_config("127.0.0.1:8002", "2s")
    assert 'targets: ["127.0.0.1:8002"]' in text
    assert "scrape_interval: 2s" in text
    assert "scrape_timeout: 1600ms" in text
    settings = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    assert not any("${" in line for line in settings)


def _stats(name: str, batches: dict[int, tuple[int, int]]) -> dict:
    """One model's entry of Triton's /v2/models/stats: batch size -> (executions, ns)."""
    return {
        "name": name,
        "version": "1",
        "batch_stats": [
            {"batch_size": size, "compute_infer": {"count": count, "ns": ns}}
            for size, (count, ns) in batches.items()
        ],
    }


def test_execution_busy_time_counts_each_execution_once():
    # recorded from the preprocessing stage: 580 requests in 437 executions; the metrics port
    # reported 799262 us, which is sum(batch size x execution time), not the busy time
    recorded = {
        1: (344, 406317715),
        2: (60, 95945391),
        3: (20, 34316743),
        4: (12, 19957968),
        8: (1, 2317359),
    }
    stats = {"model_stats": [_stats("preprocessing", recorded), _stats("postprocessing", {})]}
    busy = execution_busy_us(stats)
    assert busy["preprocessing"] == pytest.approx(558855.176)
    assert busy["postprocessing"] == 0
    charged = sum(size * ns for size, (_, ns) in recorded.items()) / 1000
    assert charged == pytest.approx(799262, rel=1e-3)
    later = {"preprocessing": busy["preprocessing"] + 40_000, "postprocessing": 10_000}
    shares = busy_shares(busy, later, engine_compute_us=1_000_000)
    assert shares == {"preprocessing": pytest.approx(0.04), "postprocessing": pytest.approx(0.01)}
    assert busy_shares({}, {}, 0) == {"preprocessing": None, "postprocessing": None}
