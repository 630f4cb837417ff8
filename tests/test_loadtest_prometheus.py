"""The sweep's own Prometheus: with none running, ``--prometheus auto`` starts one that scrapes
the Triton under test, reads the window's increases from it, and stops it on the way out."""

from __future__ import annotations

import shutil
import time

from loadtest.prom import prometheus_for
from reporting.triton import Endpoints
from serving.process import http_ready


def test_auto_starts_a_prometheus_for_the_run_and_stops_it(server, tmp_path, monkeypatch):
    assert shutil.which("prometheus"), "make setup installs Prometheus (make prometheus-install)"
    monkeypatch.setenv("PROMETHEUS_URL", "http://127.0.0.1:1")  # none runs there
    endpoints = Endpoints.from_host(server.http_url, server.grpc_url, server.metrics_url)
    with prometheus_for("auto", endpoints, tmp_path) as chosen:
        assert chosen.source is not None, chosen.note
        assert chosen.note.startswith("Prometheus started for this run")
        url = chosen.source.url
        assert http_ready(f"{url}/-/ready")
        # it has scraped three times before it is handed over: a window holds two of them
        deltas, window = chosen.source.window_deltas(time.time() - 30, time.time())
        assert window.scrapes >= 2 and deltas.window_s == window.seconds > 0
        assert ("nv_inference_count_total", "ensemble") in deltas.values
    assert not http_ready(f"{url}/-/ready")  # stopped with the run
    assert (tmp_path / "prometheus" / "prometheus.yml").exists()
