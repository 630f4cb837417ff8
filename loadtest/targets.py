"""What a load profile loads: one :class:`Target` per ``--protocol`` (the Locust user that
speaks it and the server that answers it, found or started, and stopped on the way out if
started), and the report header's machine and model. Adding a protocol is one more entry in
:data:`TARGETS`: the user class and a server factory (:class:`TritonTarget`, or one that enters it
and starts something in front, as :class:`OpenAITarget` does, its URL as ``users_url``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.tensors import ENGINE_MODEL, MODEL_STAGE
from loadtest.api_process import ApiProcess
from loadtest.results import CheckpointInfo, MachineInfo, ModelInfo
from reporting.machine import machine_lines
from reporting.triton import Endpoints, ServedTriton, get_json, open_triton
from serving.paths import checkpoint_dir
from serving.process import http_ready

log = logging.getLogger(__name__)


# endpoints, model repository, run folder -> a context manager (TritonTarget, OpenAITarget)
ServerFactory = Callable[[Endpoints, Path, Path], Any]


@dataclass(frozen=True)
class Target:
    """One ``--protocol``: who sends the load and what answers it."""

    protocol: str
    user_class: str  # a Locust user class, "module:Class"
    server: ServerFactory
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
        """Triton's version and the model stage's configuration, from the server; the
        checkpoint, from the build.json that ``make model`` writes beside it."""
        info = self.served.info() if self.served else ServedTriton(self.endpoints).info()
        return ModelInfo(**info, checkpoint=_checkpoint_info(self.model_repository))


# the same figure under GPT-J's config.json names, then the Llama family's
_CONFIG_KEYS = {
    "layers": ("n_layer", "num_hidden_layers"),
    "width": ("n_embd", "hidden_size"),
    "heads": ("n_head", "num_attention_heads"),
    "context": ("n_positions", "max_position_embeddings"),
    "vocab": ("vocab_size",),
}


def _read_json(path: Path) -> dict[str, Any]:
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    return {}


def _safetensors_parameters(folder: Path) -> int | None:
    """Parameters counted from the safetensors headers (no weight is read)."""
    total = 0
    for file in sorted(folder.glob("*.safetensors")):
        try:
            with file.open("rb") as handle:
                header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
        except (OSError, ValueError):
            return None
        for name, entry in header.items():
            if name != "__metadata__" and not name.endswith((".attn.bias", ".masked_bias")):
                total += math.prod(entry["shape"])
    return total or None


def _checkpoint_info(model_repository: Path) -> CheckpointInfo | None:
    """The served checkpoint: the build.json that `make model` writes for a trained GPT-J,
    else (a pretrained or imported model of any family) its config.json, pretrained.json and
    safetensors headers."""
    folder = checkpoint_dir(model_repository)
    data = _read_json(folder / "build.json")
    config = _read_json(folder / "config.json")
    if not data and not config:
        return None
    spec = data.get("build", {})

    def figure(name: str) -> int | None:
        for source in (spec, config):
            for key in _CONFIG_KEYS[name]:
                if source.get(key) is not None:
                    return source[key]
        return None

    name = data.get("name") or _read_json(folder / "pretrained.json").get("name")
    return CheckpointInfo(
        path=str(folder),
        name=name or config.get("_model_name_or_path"),
        parameters=data.get("parameters") or _safetensors_parameters(folder),
        **{key: figure(key) for key in _CONFIG_KEYS},
        held_out_loss=data.get("held_out_loss"),
        family=config.get("model_type", "gptj") if config else "gptj",
    )


def served_lines(m: MachineInfo, model: ModelInfo) -> list[str]:
    """The machine and the served model, as a report's bullet list."""
    lines = [
        *machine_lines(dataclasses.asdict(m)),
        f"- Triton Inference Server {model.triton_version or '?'} (CPU only)",
    ]
    c = model.checkpoint
    if c:
        family = {"gptj": "GPT-J", "llama": "Llama"}.get(c.family or "gptj", c.family)
        loss = f" (held-out loss {c.held_out_loss})" if c.held_out_loss is not None else ""
        lines.append(
            f"- Model: `{c.name}` {family}, {c.layers} layers x {c.width} wide, {c.heads} heads, "
            f"context {c.context}, vocabulary {c.vocab}, {(c.parameters or 0) / 1e6:.2f}M "
            f"parameters{loss}"
        )
    if model.stage_parameters:
        parameters = sorted(model.stage_parameters.items())
        lines.append(
            f"- Engine (model `{ENGINE_MODEL}`, behind `{MODEL_STAGE}`): continuous batching, "
            + ", ".join(f"{k}={v}" for k, v in parameters if k != "checkpoint_path")
        )
    return lines


class OpenAITarget(TritonTarget):
    """Triton, found or started as :class:`TritonTarget` does (its metrics and statistics are
    what the sweep reads), with the OpenAI-compatible API started in front of it."""

    def __init__(self, endpoints: Endpoints, model_repository: Path, out: Path) -> None:
        super().__init__(endpoints, model_repository, out)
        self.api = ApiProcess(endpoints.grpc, out / "openai_api.log")

    @property
    def triton(self) -> TritonTarget:
        """The Triton behind the API (this object: the API adds only its process)."""
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


USERS = "loadtest.sweep.locustfile:"
TARGETS: dict[str, Target] = {
    target.protocol: target
    for target in (
        Target("http", USERS + "HttpEnsembleUser", TritonTarget,
               "KServe v2 over HTTP (Locust's FastHttpUser)"),
        Target("grpc", USERS + "GrpcEnsembleUser", TritonTarget,
               "tritonclient.grpc in a Locust user"),
        Target("openai", USERS + "OpenAIUser", OpenAITarget,
               "POST /v1/completions through the OpenAI-compatible API (its overhead over gRPC)"),
    )
}  # fmt: skip
