"""The generators compared on static batches, behind one small interface.

Each runner takes a batch of equal-length prompts (token ids), generates exactly ``new`` tokens
for every one (the end token is banned: a bad word for the torch engine, a stand-in end id for
the openvino backend (bench/ov.py), ``min_new_tokens`` for transformers) and returns the tokens
each produced, so a comparison never credits a system for stopping early.
"""

from __future__ import annotations

import gc
import warnings
from pathlib import Path
from typing import Protocol

import torch

from bench.load import Pending
from bench.ov import OPENVINO_DTYPES, stand_in_end_id, start_backend
from bench.settings import SAMPLED
from contract.model_tokens import end_ids
from contract.options import SamplingParams
from engine import GenerationRequest, ModelShape, TorchEngine, in_passing_thread, load_model

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.float32}


class Runner(Protocol):
    system: str
    detail: str  # how this system runs the dtype, for the tables

    def generate_ids(
        self, prompts: list[list[int]], new: int, sampled: bool, seed: int
    ) -> list[list[int]]: ...

    def close(self) -> None: ...


def generate(
    runner: Runner, prompts: list[list[int]], new: int, sampled: bool, seed: int
) -> list[int]:
    """How many tokens each prompt got (what the timing loop checks)."""
    return [len(ids) for ids in runner.generate_ids(prompts, new, sampled, seed)]


def unsupported(system: str, dtype: str, device: str) -> str | None:
    """Why ``system`` cannot run ``dtype`` on ``device`` here, or None when it can."""
    if system == "openvino" and not device.startswith("cpu"):
        return "not supported (the openvino backend runs on the CPU only here)"
    if system == "openvino" and dtype not in OPENVINO_DTYPES:
        return f"not supported (the openvino backend computes in {', '.join(OPENVINO_DTYPES)})"
    if system == "transformers" and dtype == "int8" and device != "cpu":
        return "not supported (torch dynamic int8 quantization is CPU-only)"
    return None


def engine_sampling(sampled: bool, seed: int) -> SamplingParams:
    return SamplingParams(**SAMPLED, seed=seed) if sampled else SamplingParams()


class EngineRunner:
    """This project's continuous-batching engine, the whole batch submitted at once."""

    system = "engine"

    def __init__(
        self, checkpoint: Path, dtype: str, device: str, max_batch_size: int, prompt_tokens: int
    ) -> None:
        kwargs = {"quantize": "int8"} if dtype == "int8" else {}
        model = in_passing_thread(  # so the engine's thread holds the only OpenMP pool
            lambda: load_model(checkpoint, dtype=TORCH_DTYPES[dtype], device=device, **kwargs)
        )
        self.bad = [[end] for end in end_ids(checkpoint) or [model.config.eos_token_id]]
        prefill = max(4096, max_batch_size * prompt_tokens)
        self.engine = TorchEngine(model, max_batch_size=max_batch_size,
                                  max_prefill_tokens=prefill).start()  # fmt: skip
        quantized = ", quantize=int8" if kwargs else ""
        self.detail = f"load_model(dtype={dtype}{quantized}): {type(model).__name__}"

    def generate_ids(
        self, prompts: list[list[int]], new: int, sampled: bool, seed: int
    ) -> list[list[int]]:
        pending = [Pending() for _ in prompts]
        for i, (prompt, listener) in enumerate(zip(prompts, pending, strict=True)):
            self.engine.submit(self.request(prompt, new, engine_sampling(sampled, seed + i)),
                               listener)  # fmt: skip
        return [list(listener.wait().output_ids) for listener in pending]

    def request(self, prompt: list[int], new: int, sampling: SamplingParams) -> GenerationRequest:
        return GenerationRequest(list(prompt), new, sampling=sampling, bad_words=self.bad)

    def close(self) -> None:
        self.engine.stop()
        del self.engine
        gc.collect()


class OpenVINORunner(EngineRunner):
    """The project's openvino backend, the whole batch at once like the engine; the end token
    kept out by a stand-in end id (bench/ov.py)."""

    system = "openvino"

    def __init__(  # no super().__init__(): that would load the torch model
        self, checkpoint: Path, dtype: str, device: str, max_batch_size: int, prompt_tokens: int
    ) -> None:
        shape = ModelShape.read(checkpoint)
        self.end_id = stand_in_end_id(shape.vocab_size, shape.eos_token_id)
        self.engine = start_backend(
            checkpoint, dtype, max_batch_size, max(4096, max_batch_size * prompt_tokens),
            prefix_caching=False,  # static batches of random prompts share no prefix
        )  # fmt: skip
        self.detail = f"OpenVINOBackend(dtype={dtype}), end_id={self.end_id} stands in"

    def request(self, prompt: list[int], new: int, sampling: SamplingParams) -> GenerationRequest:
        return GenerationRequest(list(prompt), new, sampling=sampling, end_id=self.end_id,
                                 return_log_probs=False)  # fmt: skip


class TransformersRunner:
    """transformers' ``generate`` on the same checkpoint (a static batch), through
    ``AutoModelForCausalLM``: ``GPTJForCausalLM`` for a GPT-J, ``LlamaForCausalLM`` ..."""

    system = "transformers"

    def __init__(self, checkpoint: Path, dtype: str, device: str) -> None:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # no per-call notes about unused generation flags
        hf_logging.disable_progress_bar()
        model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=TORCH_DTYPES[dtype])
        model, name = model.to(device).eval(), type(model).__name__
        self.detail = f"{name}.generate, {dtype}"
        if dtype == "int8":
            with warnings.catch_warnings():  # torch's own deprecation notice for qint8 tensors
                warnings.simplefilter("ignore", UserWarning)
                model = torch.ao.quantization.quantize_dynamic(
                    model, {torch.nn.Linear}, dtype=torch.qint8
                )
            self.detail = f"{name}.generate, torch dynamic int8 (nn.Linear)"
        self.model, self.device = model, device
        # min_new_tokens keeps every end id of the generation config out; the first pads
        self.pad_id = (end_ids(checkpoint) or [0])[0]

    def generate_ids(
        self, prompts: list[list[int]], new: int, sampled: bool, seed: int
    ) -> list[list[int]]:
        ids = torch.tensor(prompts, device=self.device)
        none = {"top_k": None, "top_p": None, "temperature": None}
        options = {"do_sample": True, **SAMPLED} if sampled else {"do_sample": False, **none}
        options.update(max_new_tokens=new, min_new_tokens=new, pad_token_id=self.pad_id)
        torch.manual_seed(seed)
        with torch.inference_mode():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), **options)
        return out[:, ids.shape[1] :].tolist()

    def close(self) -> None:
        del self.model
        gc.collect()
