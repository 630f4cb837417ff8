"""GPT-J and Llama-family generation behind one interface: the torch engine and OpenVINO GenAI's
continuous-batching pipeline, both :class:`GenerationBackend`s.

The torch side, from the top down:

- ``torch_engine``: :class:`TorchEngine`, the backend; its worker thread runs the three
  pieces below;
- ``worker`` and ``scheduler``, shared with the OpenVINO backend: the request queue and owner
  thread (submit, stop, ``wait_for_room``, answering); :class:`EngineConfig` and the torch
  engine's admission under the batch, prefill and KV-cache budgets;
- ``batch``: the running rows, the one owner of their cache, sampler, token and position rows;
- ``step``: the forward step and what its tokens mean (stop words, end, length, beams);
- ``gptj`` and ``llama`` (the models, chosen by ``models``; their batched cache in ``cache``),
  ``sampling``, ``beams``: what a step computes.

``openvino_backend`` (:class:`OpenVINOBackend`) wraps the pipeline, and ``fallback``
(:class:`FallbackBackend`) runs what it cannot honour on a torch engine; ``interface`` holds the
types both share; ``tensors`` converts the ``engine`` Triton model's tensors; ``threads`` loads
weights off the engine's thread.

The names below are the package's public API (the benchmarks import only these). They load on
first use, so that importing ``engine.interface`` (as the Triton models that only call the
engine do) does not import torch or OpenVINO. Imports only torch, OpenVINO and
:mod:`contract`.
"""

from __future__ import annotations

from importlib import import_module

_WHERE = {
    "Beam": "engine.interface",
    "GenerationBackend": "engine.interface",
    "GenerationRequest": "engine.interface",
    "GenerationResult": "engine.interface",
    "Handle": "engine.interface",
    "Listener": "engine.interface",
    "ModelLimits": "engine.interface",
    "NullListener": "engine.interface",
    "StepObserver": "engine.interface",
    "EngineConfig": "engine.scheduler",
    "TorchEngine": "engine.torch_engine",
    "GPTJ": "engine.gptj",
    "GPTJConfig": "engine.gptj",
    "KVCache": "engine.cache",
    "Segment": "engine.cache",
    "Llama": "engine.llama",
    "LlamaConfig": "engine.llama",
    "CausalLM": "engine.models",
    "load_model": "engine.models",
    "read_config": "engine.models",
    "in_passing_thread": "engine.threads",
    "OpenVINOBackend": "engine.openvino_backend",
    "FallbackBackend": "engine.fallback",
    "torch_fallback": "engine.fallback",
    "ModelShape": "engine.openvino_model",
    "require_export": "engine.openvino_model",
    "compile_properties": "engine.openvino_model",
    "PRECISIONS": "engine.openvino_model",
    "BLOCK_SIZE": "engine.openvino_model",
    "export_weights": "engine.openvino_model",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> object:
    """Import a public name's module the first time the name is asked for."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
