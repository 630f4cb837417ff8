"""`make api` (``python -m openai_api --start-triton``) stopped by SIGTERM, as Docker and
Kubernetes stop it: the Triton it started is stopped by it, cleanly, and nothing is left."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys

import psutil
from test_launcher import wait_ready

from serving.process import free_ports


def test_sigterm_stops_the_api_and_the_triton_it_started(model_repository, tmp_path):
    api, http, grpc, metrics = free_ports(4)
    log = tmp_path / "api.log"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "openai_api",
            "--start-triton",
            "--port",
            str(api),
            "--model-repository",
            str(model_repository),
            "--triton",
            f"localhost:{grpc}",
            "--triton-http-port",
            str(http),
            "--triton-metrics-port",
            str(metrics),
            "--checkpoint",
            str(model_repository / "gptj" / "1" / "checkpoint"),
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    family: list[psutil.Process] = []
    try:
        wait_ready(f"http://127.0.0.1:{api}/health", process)
        family = psutil.Process(process.pid).children(recursive=True)
        assert any(p.name() == "tritonserver" for p in family)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 0
        text = log.read_text()
        assert "stopping the Triton server started here" in text
        assert "Non-graceful termination" not in text
        _gone, alive = psutil.wait_procs(family, timeout=60)
        assert not alive, alive
    finally:
        for child in [process, *family]:
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                child.kill()
