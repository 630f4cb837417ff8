"""What a load profile loads: one :class:`Target` per ``--protocol`` (the Locust user that speaks
it and the server that answers it, found or started, and stopped on the way out if started), and
the report header's machine and model. A new protocol is one more entry in :data:`TARGETS`."""

from __future__ import annotations

import dataclasses
import importlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from contract.tensors import ENGINE_MODEL, MODEL_STAGE
from loadtest.api_process import ApiProcess
from loadtest.results import MachineInfo, ModelInfo, checkpoint_info
from reporting.machine import machine_lines
from reporting.triton import Endpoints, ServedTriton, get_json, open_triton
from serving.process import http_ready

log = logging.getLogger(__name__)


class Target(NamedTuple):
    """One ``--protocol``: who sends the load and what answers it."""

    protocol: str
    user_class: str  # a Locust user class, "module:Class"
    server: Callable[[Endpoints, Path, Path], Any]  # endpoints, repository, run folder
    description: str  # for --help

    def load_user_class(self) -> type:
        module, _, name = self.user_class.partition(":")
        return getattr(importlib.import_module(module), name)


class TritonTarget:
    """The Triton at ``endpoints``, found or started (:func:`reporting.triton.open_triton`)."""

    def __init__(self, endpoints: Endpoints, model_repository: Path, out: Path) -> None:
        self.endpoints, self.model_repository = endpoints, Path(model_repository)
        self.log_file = out / "tritonserver.log"
        self.served: ServedTriton | None = None

    @property
    def users_url(self) -> str:
        return self.endpoints.http_url

    @property
    def started(self) -> bool:
        return self.served is not None and self.served.started

    def __enter__(self) -> TritonTarget:
        self.served = open_triton(self.endpoints, self.model_repository, self.log_file)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.served is not None:
            self.served.close()

    def model_ready(self, model: str) -> bool:
        return http_ready(f"{self.endpoints.http_url}/v2/models/{model}/ready")

    def statistics(self) -> dict[str, Any]:
        return get_json(f"{self.endpoints.http_url}/v2/models/stats")

    def describe(self) -> ModelInfo:
        """Triton's version and the engine's configuration, from the server; the checkpoint,
        from the files ``make model`` writes beside it."""
        info = (self.served or ServedTriton(self.endpoints)).info()
        return ModelInfo(**info, checkpoint=checkpoint_info(self.model_repository))


class OpenAITarget(TritonTarget):
    """Triton as :class:`TritonTarget` (its metrics are what the sweep reads), with the
    OpenAI-compatible API started in front of it."""

    def __init__(self, endpoints: Endpoints, model_repository: Path, out: Path) -> None:
        super().__init__(endpoints, model_repository, out)
        self.api = ApiProcess(endpoints.grpc, out / "openai_api.log")

    @property
    def triton(self) -> TritonTarget:
        return self

    @property
    def users_url(self) -> str:
        return self.api.url

    def __enter__(self) -> OpenAITarget:
        super().__enter__()
        try:
            self.api.start().wait_ready()
        except BaseException:
            self.api.stop()
            super().__exit__()
            raise
        log.info(f"OpenAI-compatible API at {self.api.url} in front of {self.endpoints.grpc}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.api.stop()
        super().__exit__(*exc)


def served_lines(m: MachineInfo, model: ModelInfo) -> list[str]:
    """The machine and the served model, as a report's bullet list."""
    lines = [
        *machine_lines(dataclasses.asdict(m)),
        f"- Triton Inference Server {model.triton_version or '?'} (CPU only)",
    ]
    if c := model.checkpoint:
        family = {"gptj": "GPT-J", "llama": "Llama"}.get(c.get("family") or "gptj", c.get("family"))
        loss = (
            f" (held-out loss {c['held_out_loss']})" if c.get("held_out_loss") is not None else ""
        )
        lines.append(
            f"- Model: `{c['name']}` {family}, {c['layers']} layers x {c['width']} wide, "
            f"{c['heads']} heads, context {c['context']}, vocabulary {c['vocab']}, "
            f"{(c['parameters'] or 0) / 1e6:.2f}M parameters{loss}"
        )
    if model.stage_parameters:
        parameters = ", ".join(
            f"{k}={v}" for k, v in sorted(model.stage_parameters.items()) if k != "checkpoint_path"
        )
        lines.append(
            f"- Engine (model `{ENGINE_MODEL}`, behind `{MODEL_STAGE}`): continuous "
            f"batching, {parameters}"
        )
    return lines


USERS = "loadtest.sweep.locustfile:"
TARGETS: dict[str, Target] = {
    target.protocol: target
    for target in (
        Target(
            "http",
            USERS + "HttpEnsembleUser",
            TritonTarget,
            "KServe v2 over HTTP (Locust's FastHttpUser)",
        ),
        Target(
            "grpc", USERS + "GrpcEnsembleUser", TritonTarget, "tritonclient.grpc in a Locust user"
        ),
        Target(
            "openai",
            USERS + "OpenAIUser",
            OpenAITarget,
            "POST /v1/completions through the OpenAI-compatible API (its overhead over gRPC)",
        ),
    )
}
