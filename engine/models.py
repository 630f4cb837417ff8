"""Which torch module serves a checkpoint: GPT-J (engine/gptj.py), the Llama family
(engine/llama.py) or Gemma 3 (engine/gemma3.py), chosen by config.json's ``model_type``; and
what the engine needs of any.

The engine's pieces (:mod:`engine.batch`, :mod:`engine.step`, :mod:`engine.torch_engine`) see a
model only through :class:`CausalLM`, so they run any module that has its ``config`` and
``step``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import torch

from engine.cache import KVCache, Segment
from engine.families import GEMMA3 as GEMMA3_TYPE
from engine.families import GPTJ as GPTJ_TYPE
from engine.families import model_type
from engine.gemma3 import Gemma3, Gemma3Config
from engine.gptj import GPTJ, GPTJConfig
from engine.llama import Llama, LlamaConfig


class ModelConfig(Protocol):
    """What the engine reads of a model's architecture (GPTJConfig and LlamaConfig have it)."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def n_positions(self) -> int: ...

    @property
    def eos_token_id(self) -> int | None: ...

    @property
    def n_layer(self) -> int: ...

    @property
    def n_embd(self) -> int: ...

    @property
    def n_kv_head(self) -> int: ...

    @property
    def head_dim(self) -> int: ...


class CausalLM(Protocol):
    """A model the torch engine runs: one forward pass over segments on the batched cache."""

    @property
    def config(self) -> ModelConfig: ...

    def step(self, segments: list[Segment], cache: KVCache) -> torch.Tensor: ...

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]: ...


def read_config(path: str | Path) -> GPTJConfig | LlamaConfig | Gemma3Config:
    """The checkpoint's architecture, or ValueError naming what the torch engine cannot run
    (an unsupported model_type, rope type, activation...), before any weight is read."""
    raw = json.loads((Path(path) / "config.json").read_text())
    kind = model_type(raw, path)
    if kind == GPTJ_TYPE:
        return GPTJConfig.from_dict(raw)
    if kind == GEMMA3_TYPE:
        return Gemma3Config.from_dict(raw, path)
    return LlamaConfig.from_dict(raw, path)


def load_model(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    quantize: str | None = None,
) -> CausalLM:
    """Load the checkpoint folder ``path`` with the module its model_type names."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no checkpoint at {path}: run `make model` first")
    modules = {GPTJConfig: GPTJ, LlamaConfig: Llama, Gemma3Config: Gemma3}
    module = modules[type(read_config(path))]
    return module.from_checkpoint(path, dtype=dtype, device=device, quantize=quantize)
