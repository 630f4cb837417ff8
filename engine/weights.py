"""Loading a checkpoint's weights into one of the engine's modules (engine/gptj.py,
engine/llama.py, engine/gemma3.py): the same steps for every family, written once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import torch
from safetensors.torch import load_file
from torch import nn


def read_safetensors(path: Path, leave_out: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint folder's *.safetensors (shards too), less those whose
    names end with one of ``leave_out`` (buffers transformers saved that are no weights)."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {path}; run `make model`")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(file))
    return {k: v for k, v in state.items() if not (leave_out and k.endswith(leave_out))}


def check_quantize(quantize: str | None, dtype: torch.dtype, device: str) -> None:
    if quantize not in (None, "none", "int8"):
        raise ValueError(f"quantize must be 'none' or 'int8', got {quantize!r}")
    if quantize == "int8" and (dtype != torch.float32 or str(device) != "cpu"):
        raise ValueError("quantize='int8' runs on the CPU with dtype float32")


def choose_attention(device: torch.device) -> None:
    """On a GPU, turn cuDNN's attention off for the process. It is torch's first choice for
    bfloat16 on Hopper, and it builds a plan for each new shape, while a decode step's keys grow
    by one position every step: on an H100 it made bfloat16 decode 3-4x slower than float32
    (docs/performance.md, "The torch engine on a GPU"). Flash, memory-efficient and math
    attention take any shape at no set-up cost."""
    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)


def placed(
    model: nn.Module,
    state: dict[str, torch.Tensor],
    dtype: torch.dtype,
    device: str,
    quantize: str | None,
) -> nn.Module:
    """``model`` with ``state`` loaded (every key), in ``dtype`` on ``device`` for inference,
    its rotary angles kept in float32 (on a GPU, without cuDNN's attention); ``quantize="int8"``:
    every linear layer replaced by torch's dynamically quantized one (weights int8, activations
    quantized per call)."""
    model.load_state_dict(state, strict=True)
    model = model.to(dtype)
    model.cos, model.sin = model.cos.float(), model.sin.float()  # angles stay float32
    model = model.to(device).eval()
    choose_attention(torch.device(device))
    if quantize == "int8":
        model = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    return model


class FromCheckpoint:
    """``from_checkpoint`` for a module class, written once: the folder's config.json read by
    the class's ``config_class``, its weights by ``read_state`` (the family's own tensors to
    leave out), and both handed to the class's ``from_state_dict``."""

    config_class: ClassVar[Any]
    read_state: ClassVar[Callable[[Path], dict[str, torch.Tensor]]]
    from_state_dict: ClassVar[Callable[..., Any]]

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
        quantize: str | None = None,
    ) -> Any:
        """Load a Hugging Face folder (config.json + *.safetensors) onto ``device``.

        ``dtype`` bfloat16 halves memory; ``quantize="int8"`` replaces every linear layer by
        torch's dynamically quantized int8 one (weights int8, activations quantized per call;
        float32 and CPU only).
        """
        path = Path(path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"no checkpoint at {path}: run `make model` first")
        config = cls.config_class.from_checkpoint(path)
        return cls.from_state_dict(config, cls.read_state(path), dtype, device, quantize)
