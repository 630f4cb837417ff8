"""A tiny random GPT-J exported to OpenVINO, built once per test session, and what the
openvino backend's test modules share (its backend, prompts, transformers' greedy answer)."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

from engine_runs import random_gptj
from transformers import GPTJForCausalLM

from engine.openvino_backend import OpenVINOBackend
from engine.openvino_model import ModelShape, require_export
from modelbuild.openvino_export import ensure_export


@functools.cache
def exported_gptj() -> tuple[GPTJForCausalLM, Path]:
    """The random GPT-J of test_gptj_engine.py (same seed and shape), exported to OpenVINO."""
    model = random_gptj()
    path = Path(tempfile.mkdtemp(prefix="openvino-gptj-"))
    atexit.register(shutil.rmtree, path, True)
    model.save_pretrained(path)
    ensure_export(path)
    return model, path


def backend(path, **kwargs) -> OpenVINOBackend:
    kwargs.setdefault("max_batch_size", 8)
    return OpenVINOBackend(require_export(path), ModelShape.read(path), **kwargs).start()
