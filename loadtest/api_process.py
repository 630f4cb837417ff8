"""The OpenAI-compatible API (``python -m openai_api``) as a child process of a load test.

Its own module, free of Locust (which patches the process with gevent on import), so that the
sweep's OpenAI target and the editor profile's threads both start it the same way.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from serving.process import ManagedServer, free_port


class ApiProcess(ManagedServer):
    """``python -m openai_api`` as a child process in front of ``grpc_url``, on a free port."""

    name = "openai_api"
    ready_timeout = 120.0

    def __init__(self, grpc_url: str, log_file: Path, port: int | None = None) -> None:
        self.grpc_url = grpc_url
        self.log_file = log_file
        self.port = port or free_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ready_url(self) -> str:
        return f"{self.url}/health"

    @property
    def log_hint(self) -> str:
        return f"; see {self.log_file}"

    def start(self) -> ApiProcess:
        command = [sys.executable, "-m", "openai_api", "--port", str(self.port)]
        command += ["--triton", self.grpc_url, "--log-level", "warning"]
        with open(self.log_file, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        return self
