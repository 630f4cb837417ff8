"""The served side: a real Triton on a copy of the model repository, on free ports, so the
benchmark neither touches a server someone runs on 8000-8002 nor depends on what
``model_repository/`` currently holds."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from reporting.triton import Endpoints, ServedTriton, open_triton
from serving import model_config
from serving.paths import MODEL_REPOSITORY, checkpoint_dir
from serving.process import free_ports
from serving.triton import Ports


def served_engine_settings() -> dict[str, str | int]:
    """The served engine's batch size, prefill and KV-cache budgets and dtype, so the bare
    engine matches."""
    params = model_config.parameters(model_config.read(MODEL_REPOSITORY / "engine"))
    return {
        "max_batch_size": int(params.get("engine_max_batch_size", 32)),
        "max_prefill_tokens": int(params.get("engine_max_prefill_tokens", 4096)),
        "kv_cache_tokens": int(params.get("kv_cache_tokens", 0)),
        "dtype": params.get("dtype", "float32"),
    }


@contextmanager
def running_server(checkpoint: Path, workdir: Path, log_file: Path, device: str,
                   backend: str = "torch",
                   parameters: dict[str, str] | None = None) -> Iterator[ServedTriton]:  # fmt: skip
    """Triton serving ``checkpoint`` from a fresh repository copy under ``workdir``; the device
    and backend go to the engine model through CODEGEN_DEVICE and CODEGEN_BACKEND, and
    ``parameters`` replace those of its config (KeyError for one it lacks: never ignored)."""
    repo = workdir / "model_repository"
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(MODEL_REPOSITORY, repo, ignore=shutil.ignore_patterns("checkpoint"))
    shutil.copytree(checkpoint, checkpoint_dir(repo))
    if parameters:
        config = model_config.read(repo / "engine")
        model_config.set_parameters(config, parameters)
        model_config.write(repo / "engine", config)
    previous = {name: os.environ.get(name) for name in ("CODEGEN_DEVICE", "CODEGEN_BACKEND")}
    os.environ.update(CODEGEN_DEVICE=device, CODEGEN_BACKEND=backend)
    try:
        with open_triton(Endpoints.local(Ports(*free_ports(3))), repo, log_file) as server:
            yield server
    finally:
        for name, value in previous.items():
            os.environ.pop(name) if value is None else os.environ.update({name: value})
