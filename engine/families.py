"""Which model families the engine serves, told apart by config.json's ``model_type``.

One list for the import (modelbuild/importer.py), the OpenVINO backend's :class:`ModelShape`
and the torch engine's loader (engine/models.py), so that a family is accepted or refused
with the same words everywhere. Standard library only: the export's environment imports it.
"""

from __future__ import annotations

from collections.abc import Mapping

GPTJ = "gptj"
LLAMA_FAMILY = ("llama", "qwen2", "mistral", "starcoder2")
GEMMA3 = "gemma3_text"  # Gemma 3's text model (engine/gemma3.py)
# installed in transformers' own layout, unchanged (modelbuild/llama_import.py)
HF_LAYOUT = (*LLAMA_FAMILY, GEMMA3)
MODEL_TYPES = (GPTJ, *HF_LAYOUT)  # what an installed checkpoint may be
IMPORTED_TYPES = (*MODEL_TYPES, "codegen")  # what `make model` accepts (CodeGen -> GPT-J)


class UnsupportedModelError(ValueError):
    """A checkpoint of a family that is not served; the message names the supported ones."""


def model_type(config: Mapping, source: object, accepted: tuple[str, ...] = MODEL_TYPES) -> str:
    """config.json's ``model_type`` (GPT-J when absent, as the project's own checkpoints were
    once written), or UnsupportedModelError naming it and the ``accepted`` list."""
    kind = config.get("model_type", GPTJ)
    if kind not in accepted:
        hint = (
            "; a CodeGen checkpoint is converted to gptj by `make model MODEL=<folder>`"
            if kind == "codegen"
            else ""
        )
        raise UnsupportedModelError(
            f"{source} is a {kind!r} model; the supported model types are "
            f"{', '.join(accepted)}{hint}"
        )
    return kind


def first_id(value: object) -> int | None:
    """A token id from a config: Llama 3 and Qwen2 list several end ids; the first is taken."""
    if isinstance(value, list):
        return value[0] if value else None
    return value if isinstance(value, int) else None


def sliding_window(config: Mapping) -> int | None:
    """The attention window of a Llama-family config, or None when every layer sees the whole
    context. Qwen2 keeps ``sliding_window`` even when ``use_sliding_window`` is false."""
    kind = config.get("model_type")
    if kind == "qwen2" and not config.get("use_sliding_window", False):
        return None
    if kind in ("mistral", "qwen2", "starcoder2"):
        return config.get("sliding_window") or None
    return None
