"""The OpenVINO model the ``openvino`` backend serves: where its export lives, whether it is
current, what shape the model has, and how it is compiled.

The export (modelbuild/openvino_export.py, run by ``make model``) lives in
``<checkpoint>/openvino/``, so it travels with the checkpoint and the checkpoint's .gitignore rule
covers it, with ``source.json``: a fingerprint of the checkpoint files it came from. An export
whose fingerprint differs from the checkpoint's is stale. Standard library only: the export's
environment (.venv-export) imports this module too.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

EXPORT_DIR = "openvino"
STAMP = "source.json"
MODEL_FILE = "openvino_model.xml"
# the files of a Hugging Face checkpoint that decide what the export computes
_SOURCES = ("config.json", "generation_config.json", "*.safetensors", "*.bin")


class ExportError(RuntimeError):
    """No usable export, with what to run."""


def export_dir(checkpoint: Path) -> Path:
    return Path(checkpoint) / EXPORT_DIR


def fingerprint(checkpoint: Path) -> str:
    """SHA-256 over the names and contents of the checkpoint files the export depends on."""
    digest = hashlib.sha256()
    files = sorted({p for pattern in _SOURCES for p in Path(checkpoint).glob(pattern)})
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def export_problem(checkpoint: Path) -> str | None:
    """Why the checkpoint's export cannot be served as it is (None: it is current)."""
    out = export_dir(checkpoint)
    if not (Path(checkpoint) / "config.json").is_file():
        return f"no checkpoint at {checkpoint}"
    if not (out / MODEL_FILE).is_file() or not (out / STAMP).is_file():
        return f"no OpenVINO export in {out}"
    recorded = json.loads((out / STAMP).read_text()).get("fingerprint")
    if recorded != fingerprint(checkpoint):
        return f"the OpenVINO export in {out} is stale (the checkpoint changed since)"
    return None


def require_export(checkpoint: Path) -> Path:
    """The current export's folder, or ExportError saying what to run."""
    why = export_problem(checkpoint)
    if why is not None:
        raise ExportError(
            f"{why}: run `make model` (it exports the served checkpoint), or "
            f"`python -m modelbuild.openvino_export {checkpoint}`"
        )
    return export_dir(checkpoint)


BLOCK_SIZE = 32  # positions per KV block of the CPU plugin's paged attention
PRECISIONS = {"float32": "f32", "bfloat16": "bf16"}


def compile_properties(dtype: str, threads: int = 0) -> dict[str, object]:
    """CPU plugin properties: ``dtype`` for the math and the KV cache alike (the plugin's own
    defaults, bfloat16 and a u8 cache on CPUs with AVX512-BF16, would not match transformers)."""
    if dtype not in PRECISIONS:
        raise ValueError(f"dtype {dtype!r} is not one of {sorted(PRECISIONS)} for openvino")
    precision = PRECISIONS[dtype]
    properties: dict[str, object] = {
        "INFERENCE_PRECISION_HINT": precision,
        "KV_CACHE_PRECISION": precision,
        "KEY_CACHE_PRECISION": precision,
        "VALUE_CACHE_PRECISION": precision,
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0,  # no int8 activations
    }
    if threads > 0:
        properties["INFERENCE_NUM_THREADS"] = threads
    return properties


@dataclass(frozen=True)
class ModelShape:
    """What validation and the cache budget need to know of the model (its config.json)."""

    vocab_size: int
    context: int
    eos_token_id: int
    n_layer: int
    n_embd: int

    @classmethod
    def read(cls, folder: Path) -> ModelShape:
        cfg = json.loads((Path(folder) / "config.json").read_text())
        eos = cfg.get("eos_token_id")
        return cls(
            vocab_size=cfg["vocab_size"],
            context=cfg.get("n_positions") or cfg["max_position_embeddings"],
            eos_token_id=(eos[0] if isinstance(eos, list) else eos) or 0,
            n_layer=cfg["n_layer"],
            n_embd=cfg["n_embd"],
        )
