"""When no URL is given: the API and its Triton, started as `make api` starts them, on free
ports of 127.0.0.1, and stopped at the end.

One child, ``python -m openai_api --start-triton``: it starts Triton on the model repository
(nothing answers on the free gRPC port it is given), waits for it, serves, and on SIGINT
(``stop_signal`` says why not SIGTERM) stops it before exiting. The child is tied to this
process (serving.process.spawn_tied: its own process group, killed by the kernel should this
process die however it dies), and Triton to the child the same way, so nothing outlives a run,
finished, failed or interrupted.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from serving.process import ManagedServer, free_ports, http_ready, spawn_tied

HOST = "127.0.0.1"


class ServedModel(ManagedServer):
    """``python -m openai_api --start-triton`` on free ports; ready when ``/health`` is 200
    (Triton serves and a one-token completion went through)."""

    name = "openai_api + Triton"
    # SIGINT, not SIGTERM: uvicorn re-raises the signal it shut down on, and a re-raised SIGTERM
    # ends the API before its `finally` stops Triton gracefully (Triton then dies with it, by
    # its death signal); a re-raised SIGINT is a KeyboardInterrupt, and the `finally` runs.
    stop_signal = signal.SIGINT
    ready_timeout = 900.0  # Triton loads the model and its OpenVINO export on a busy machine
    stop_timeout = 120.0  # the API stops Triton (its own grace period) before it exits

    def __init__(self, model_repository: Path, checkpoint: Path, log_file: Path) -> None:
        self.model_repository = Path(model_repository)
        self.checkpoint = Path(checkpoint)
        self.log_file = Path(log_file)
        self.port, self.grpc, self.http, self.metrics = free_ports(4, HOST)

    @property
    def url(self) -> str:
        """The OpenAI base URL."""
        return f"http://{HOST}:{self.port}/v1"

    @property
    def ready_url(self) -> str:
        return f"http://{HOST}:{self.port}/health"

    @property
    def log_hint(self) -> str:
        return f"; see {self.log_file}"

    def ready(self) -> bool:
        return http_ready(self.ready_url, timeout=30)

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "openai_api",
            "--host",
            HOST,
            "--port",
            str(self.port),
            "--triton",
            f"{HOST}:{self.grpc}",
            "--start-triton",
            "--triton-http-port",
            str(self.http),
            "--triton-metrics-port",
            str(self.metrics),
            "--model-repository",
            str(self.model_repository),
            "--checkpoint",
            str(self.checkpoint),
            "--log-level",
            "warning",
        ]

    def start(self) -> ServedModel:
        config = self.model_repository / "gptj" / "1" / "checkpoint" / "config.json"
        if not config.is_file():
            raise SystemExit(f"no model at {config.parent}: run `make model` first")
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            self.process = spawn_tied(self.command(), log)
        return self
