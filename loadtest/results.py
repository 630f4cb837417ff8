"""The machine and the served model as a load report's header has them
(:func:`loadtest.targets.served_lines`); the checkpoint is a dict (:func:`checkpoint_info`)."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reporting.machine import describe
from serving.paths import checkpoint_dir


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
        info = describe()
        return cls(**{f.name: info[f.name] for f in dataclasses.fields(cls)})


@dataclass(frozen=True)
class ModelInfo:
    """What the server says it serves; ``error`` when it could not be asked."""

    triton_version: str | None = None
    stage_parameters: dict[str, str | None] | None = None
    dynamic_batching: dict[str, Any] | None = None
    instances: list[Any] | None = None
    error: str | None = None
    checkpoint: dict[str, Any] | None = None  # checkpoint_info's


# the same figure under GPT-J's config.json names, then the Llama family's
CONFIG_KEYS = {
    "layers": ("n_layer", "num_hidden_layers"),
    "width": ("n_embd", "hidden_size"),
    "heads": ("n_head", "num_attention_heads"),
    "context": ("n_positions", "max_position_embeddings"),
    "vocab": ("vocab_size",),
}


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _safetensors_parameters(folder: Path) -> int | None:
    """Parameters counted from the safetensors headers (no weight is read)."""
    total = 0
    for file in sorted(folder.glob("*.safetensors")):
        try:
            with file.open("rb") as handle:
                header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
        except (OSError, ValueError):
            return None
        buffers = ("__metadata__", ".attn.bias", ".masked_bias")  # not parameters
        total += sum(math.prod(e["shape"]) for n, e in header.items() if not n.endswith(buffers))
    return total or None


def checkpoint_info(model_repository: Path) -> dict[str, Any] | None:
    """The served checkpoint: the build.json that `make model` writes for a trained GPT-J, else
    (a pretrained model of any family) its config.json, pretrained.json and safetensors headers."""
    folder = checkpoint_dir(model_repository)
    data, config = _read_json(folder / "build.json"), _read_json(folder / "config.json")
    if not data and not config:
        return None
    sources = (data.get("build", {}), config)
    figures = {
        name: next((s[k] for s in sources for k in keys if s.get(k) is not None), None)
        for name, keys in CONFIG_KEYS.items()
    }
    name = data.get("name") or _read_json(folder / "pretrained.json").get("name")
    return {
        "path": str(folder),
        "name": name or config.get("_model_name_or_path"),
        "parameters": data.get("parameters") or _safetensors_parameters(folder),
        **figures,
        "held_out_loss": data.get("held_out_loss"),
        "family": config.get("model_type", "gptj") if config else "gptj",
    }
