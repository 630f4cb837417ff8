"""The machine and the served model as a load report's header has them
(:func:`loadtest.targets.served_lines`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from reporting.machine import describe


@dataclass(frozen=True)
class MachineInfo:
    cpu: str
    cores: int | None
    memory_gib: float | None
    gpu: str
    os: str
    python: str
    torch: str | None
    locust: str | None
    tritonclient: str | None
    cpu_flags: list[str] = field(default_factory=list)

    @classmethod
    def here(cls) -> MachineInfo:
        """This machine now (:func:`reporting.machine.describe`)."""
        info = describe()
        return cls(**{f.name: info[f.name] for f in dataclasses.fields(cls)})


@dataclass(frozen=True)
class CheckpointInfo:
    """From the served checkpoint's build.json, or its config.json (loadtest/targets.py)."""

    path: str
    name: str | None = None
    parameters: int | None = None
    layers: int | None = None
    width: int | None = None
    heads: int | None = None
    context: int | None = None
    vocab: int | None = None
    held_out_loss: float | None = None
    family: str | None = None  # config.json's model_type: gptj, llama, ...


@dataclass(frozen=True)
class ModelInfo:
    """What the server says it serves; ``error`` when it could not be asked."""

    triton_version: str | None = None
    stage_parameters: dict[str, str | None] | None = None
    dynamic_batching: dict[str, Any] | None = None
    instances: list[Any] | None = None
    error: str | None = None
    checkpoint: CheckpointInfo | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelInfo:
        """Back from ``dataclasses.asdict`` (a run folder's JSON)."""
        checkpoint = data.get("checkpoint")
        return cls(**{**data, "checkpoint": checkpoint and CheckpointInfo(**checkpoint)})
