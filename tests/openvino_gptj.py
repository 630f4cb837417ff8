"""A tiny random GPT-J exported to OpenVINO, built once per test session, and what the
openvino backend's test modules share (its backend, prompts, transformers' greedy answer)."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import torch
from engine_runs import VOCAB
from transformers import GPTJConfig as HFConfig
from transformers import GPTJForCausalLM

from engine.openvino_backend import OpenVINOBackend
from engine.openvino_model import ModelShape, require_export
from modelbuild.openvino_export import ensure_export


@functools.cache
def exported_gptj() -> tuple[GPTJForCausalLM, Path]:
    """The random GPT-J of test_gptj_engine.py (same seed and shape), exported to OpenVINO."""
    torch.manual_seed(0)
    config = HFConfig(
        vocab_size=VOCAB,
        n_positions=256,
        n_embd=64,
        n_layer=2,
        n_head=4,
        rotary_dim=8,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPTJForCausalLM(config).eval()
    path = Path(tempfile.mkdtemp(prefix="openvino-gptj-"))
    atexit.register(shutil.rmtree, path, True)
    model.save_pretrained(path)
    ensure_export(path)
    return model, path


def backend(path, **kwargs) -> OpenVINOBackend:
    kwargs.setdefault("max_batch_size", 8)
    return OpenVINOBackend(require_export(path), ModelShape.read(path), **kwargs).start()
