"""llama.cpp's ``llama-server``, the peer the bench and the editor profile measure the project
against, started one way for every tool: on the GGUF the default model was made from, on
127.0.0.1, with the prompt cache, Prometheus metrics and a slot per client. ``make llama-server``
builds it; a tool that finds none says so and stops (a build takes minutes of CPU)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from reporting.triton import ChildServer
from serving.paths import REPO_ROOT

LLAMA_SERVER = REPO_ROOT / "build" / "llama.cpp" / "bin" / "llama-server"
DOWNLOADS = REPO_ROOT / "build" / "downloads"  # where `make model` unpacks a wheel's GGUF

# llama-server's Prometheus names (``--metrics``). It counts a cancelled request's tokens as it
# drops it; prompt tokens are prefilled ones, the cached ones apart.
PREDICTED = "llamacpp:tokens_predicted_total"
PREFILLED = "llamacpp:prompt_tokens_total"
CACHED = "llamacpp:prompt_tokens_cached_total"
PROCESSING = "llamacpp:requests_processing"


def llama_server_binary(path: Path = LLAMA_SERVER) -> Path:
    """The built ``llama-server``; a clear error naming the command that builds it."""
    if not path.is_file() or not os.access(path, os.X_OK):
        raise FileNotFoundError(
            f"no llama-server at {path}: run `make llama-server` first (builds llama.cpp's "
            "server once, about 10 CPU-minutes)"
        )
    return path


def checkpoint_gguf(checkpoint: Path, downloads: Path = DOWNLOADS) -> Path:
    """The GGUF a checkpoint was converted from (its ``pretrained.json``, written by
    ``make model``); a checkpoint trained here has none, and llama.cpp has nothing to serve."""
    record = checkpoint / "pretrained.json"
    if not record.is_file():
        raise FileNotFoundError(
            f"{checkpoint} was not made from a GGUF (no pretrained.json): llama-server needs "
            "one; run `make model` (the default SmolLM2) or pass a .gguf"
        )
    made = json.loads(record.read_text())
    gguf = downloads / f"{made['name']}-{made['version']}" / Path(made["gguf"]).name
    if not gguf.is_file():
        raise FileNotFoundError(f"{gguf} is gone: run `make model FORCE=1` to unpack it again")
    return gguf


class LlamaServer(ChildServer):
    """``llama-server`` as a tool's child. ``parallel`` slots share ``ctx_size`` tokens of KV
    cache; every request may use ``cache_prompt`` (the server's default)."""

    name = "llama-server"
    ready_path = "/health"
    ready_timeout = 180.0

    def __init__(
        self,
        gguf: Path,
        port: int,
        log_file: Path,
        parallel: int = 4,
        ctx_size: int = 8192,
        threads: int | None = None,
        binary: Path = LLAMA_SERVER,
    ) -> None:
        super().__init__(port, log_file)
        self.gguf, self.parallel, self.ctx_size = Path(gguf), parallel, ctx_size
        self.threads = threads or os.cpu_count() or 1
        self.binary = binary

    def command(self) -> list[str]:
        return [
            str(llama_server_binary(self.binary)),
            "--model",
            str(self.gguf),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--parallel",
            str(self.parallel),
            "--ctx-size",
            str(self.ctx_size),
            "--threads",
            str(self.threads),
            "--metrics",
            "--no-webui",
        ]

    def start(self) -> LlamaServer:
        return self.spawn(self.command(), cwd=REPO_ROOT)
