"""The OpenAI-compatible API (``python -m openai_api``) as a child process of a load test, in a
module free of Locust (which patches the process with gevent on import)."""

from __future__ import annotations

import sys
from pathlib import Path

from reporting.triton import ChildServer
from serving.process import free_port


class ApiProcess(ChildServer):
    """``python -m openai_api`` as a child process in front of ``grpc_url``, on a free port."""

    name = "openai_api"
    ready_timeout = 120.0
    ready_path = "/health"

    def __init__(
        self,
        grpc_url: str,
        log_file: Path,
        port: int | None = None,
        checkpoint: Path | None = None,
        context_tokens: int | None = None,
    ) -> None:
        """``checkpoint``: the served one, whose tokenizer and context the API fits repository
        context to (else the API's default, ``make model``'s); ``context_tokens``: that budget
        (the API's ``--context-tokens``; else its default)."""
        super().__init__(port or free_port(), log_file)
        self.grpc_url, self.checkpoint = grpc_url, checkpoint
        self.context_tokens = context_tokens

    def start(self) -> ApiProcess:
        served = ["--checkpoint", str(self.checkpoint)] if self.checkpoint else []
        if self.context_tokens is not None:
            served += ["--context-tokens", str(self.context_tokens)]
        return self.spawn(
            [
                sys.executable,
                "-m",
                "openai_api",
                "--port",
                str(self.port),
                "--triton",
                self.grpc_url,
                "--log-level",
                "warning",
                *served,
            ]
        )
