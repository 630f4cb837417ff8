"""A tiny random GPT-J exported to OpenVINO, built once per test session, and what the
openvino backend's test modules share (its backend, prompts, transformers' greedy answer)."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
import threading
from pathlib import Path

import torch
from transformers import GPTJConfig as HFConfig
from transformers import GPTJForCausalLM

from engine.interface import GenerationResult, NullListener
from engine.openvino_backend import OpenVINOBackend
from engine.openvino_model import ModelShape, require_export
from modelbuild.openvino_export import ensure_export

VOCAB = 300


@functools.cache
def exported_gptj() -> tuple[GPTJForCausalLM, Path]:
    """The random GPT-J of test_gptj_engine.py (same seed and shape), exported to OpenVINO."""
    torch.manual_seed(0)
    config = HFConfig(
        vocab_size=VOCAB, n_positions=256, n_embd=64, n_layer=2, n_head=4, rotary_dim=8,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    model = GPTJForCausalLM(config).eval()
    path = Path(tempfile.mkdtemp(prefix="openvino-gptj-"))
    atexit.register(shutil.rmtree, path, True)
    model.save_pretrained(path)
    ensure_export(path)
    return model, path


def backend(path, **kwargs) -> OpenVINOBackend:
    kwargs.setdefault("max_batch_size", 8)
    return OpenVINOBackend(require_export(path), ModelShape.read(path), **kwargs).start()


def prompts(count: int, seed: int = 1) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 40, (count,), generator=gen).tolist()
    return [torch.randint(1, VOCAB, (n,), generator=gen).tolist() for n in lengths]


def hf_greedy(model, prompt: list[int], new: int, **kwargs) -> list[int]:
    out = model.generate(
        torch.tensor([prompt]), max_new_tokens=new, do_sample=False, eos_token_id=None,
        pad_token_id=0, **kwargs,
    )  # fmt: skip
    return out[0, len(prompt) :].tolist()


class Collect(NullListener):
    def __init__(self) -> None:
        self.done = threading.Event()
        self.tokens: list[int] = []
        self.result: GenerationResult | None = None

    def on_token(self, token_id: int, log_prob: float) -> None:
        self.tokens.append(token_id)

    def on_finish(self, result: GenerationResult) -> None:
        self.result = result
        self.done.set()

    def wait(self) -> GenerationResult:
        assert self.done.wait(60), "no answer within 60 s"
        return self.result
