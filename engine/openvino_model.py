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

from engine.families import GPTJ, HF_LAYOUT, first_id, model_type, sliding_window

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


# How the export stores the weights: as the checkpoint has them, or compressed by NNCF (int8
# per output channel; int4 symmetric in groups of 64, the embeddings and head in int8).
WEIGHT_FORMATS = ("float32", "int8", "int4")


def export_weights(checkpoint: Path) -> str:
    """The weight format the checkpoint's export was written with (float32 before formats)."""
    stamp = export_dir(checkpoint) / STAMP
    return json.loads(stamp.read_text()).get("weights", "float32") if stamp.is_file() else "none"


def export_problem(checkpoint: Path, weights: str | None = None) -> str | None:
    """Why the checkpoint's export cannot be served as it is (None: it is current); with
    ``weights``, an export in another weight format is not current either."""
    out = export_dir(checkpoint)
    if not (Path(checkpoint) / "config.json").is_file():
        return f"no checkpoint at {checkpoint}"
    if not (out / MODEL_FILE).is_file() or not (out / STAMP).is_file():
        return f"no OpenVINO export in {out}"
    stamp = json.loads((out / STAMP).read_text())
    if stamp.get("fingerprint") != fingerprint(checkpoint):
        return f"the OpenVINO export in {out} is stale (the checkpoint changed since)"
    if "tokenizer" not in stamp and (Path(checkpoint) / "tokenizer.json").is_file():
        return (
            f"the OpenVINO export in {out} is stale (written before exports carried the "
            "tokenizer that token healing needs)"
        )
    if weights is not None and export_weights(checkpoint) != weights:
        return (
            f"the OpenVINO export in {out} has {export_weights(checkpoint)} weights, not {weights}"
        )
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


# What a precision needs of the CPU, as OpenVINO's OPTIMIZATION_CAPABILITIES names it, and the
# CPU flags that give it (for the message).
NEEDS = {"bfloat16": ("BF16", "avx512_bf16 or amx_bf16")}


class PrecisionError(ValueError):
    """A dtype this CPU cannot run, with what to set instead."""


def cpu_capabilities() -> list[str]:
    """What OpenVINO's CPU plugin says this CPU supports (``BF16`` only with native bfloat16)."""
    import openvino  # imported where used: importing the module must not need it

    return list(openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


def compile_properties(
    dtype: str, threads: int = 0, capabilities: list[str] | None = None
) -> dict[str, object]:
    """CPU plugin properties: ``dtype`` for the math and the KV cache alike (the plugin's own
    defaults, bfloat16 and a u8 cache on CPUs with AVX512-BF16, would not match transformers).

    A dtype the CPU has no instructions for is refused here, at load (``capabilities``: what
    the CPU supports, asked of OpenVINO when not given): on an AVX2 CPU the plugin emulates
    bfloat16 math, slower than float32, and its paged attention takes only an f32 cache, so a
    bfloat16 engine would compile and then fail inside the first request.
    """
    if dtype not in PRECISIONS:
        raise ValueError(f"dtype {dtype!r} is not one of {sorted(PRECISIONS)} for openvino")
    if dtype in NEEDS:
        capability, flags = NEEDS[dtype]
        found = cpu_capabilities() if capabilities is None else capabilities
        if capability not in found:
            raise PrecisionError(
                f"dtype {dtype} needs a CPU with native {dtype} ({flags} in lscpu's flags); "
                f"this one has none (OpenVINO's CPU capabilities: {', '.join(found)}): set "
                'dtype "float32" in engine/config.pbtxt'
            )
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


# config.json keys per family: (layers, width, context)
_SHAPE_KEYS = {
    GPTJ: ("n_layer", "n_embd", "n_positions"),
    **dict.fromkeys(HF_LAYOUT, ("num_hidden_layers", "hidden_size", "max_position_embeddings")),
}
# Families whose export gave other tokens than transformers once a sequence passed the sliding
# window (mistral, in tests/test_llama_family.py; qwen2's and starcoder2's were exact): their
# context stops at the window, so no request reaches it.
_WINDOW_LIMITS_CONTEXT = ("mistral",)


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
        """Read any served family's config.json, or refuse another family by name
        (UnsupportedModelError, where a missing GPT-J key once made a bare KeyError)."""
        folder = Path(folder)
        cfg = json.loads((folder / "config.json").read_text())
        kind = model_type(cfg, folder)
        layers, width, context = _SHAPE_KEYS[kind]
        window = sliding_window(cfg) if kind in _WINDOW_LIMITS_CONTEXT else None
        eos = first_id(cfg.get("eos_token_id"))
        generation = folder / "generation_config.json"
        if eos is None and generation.is_file():  # where some checkpoints keep it instead
            eos = first_id(json.loads(generation.read_text()).get("eos_token_id"))
        return cls(
            vocab_size=cfg["vocab_size"],
            context=min(cfg[context], window or cfg[context]),
            eos_token_id=eos or 0,  # none at all: token 0, as before
            n_layer=cfg[layers],
            n_embd=cfg[width],
        )
