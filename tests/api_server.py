"""The OpenAI-compatible API under uvicorn in a thread of the test process, for the tests that
talk to it, and the official ``openai`` client pointed at it."""

from __future__ import annotations

import socket
import threading
import time

import openai
import uvicorn

from openai_api import Settings, create_app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ApiServer:
    """The API under uvicorn in a thread of the test process, on a free port."""

    def __init__(self, settings: Settings) -> None:
        self.port = free_port()
        config = uvicorn.Config(
            create_app(settings), host="127.0.0.1", port=self.port, log_level="warning"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ApiServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the API server did not start"
            assert self.thread.is_alive(), "the API server thread died"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def openai_client(api: ApiServer, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api.url}/v1", api_key=key, max_retries=0, timeout=120)
