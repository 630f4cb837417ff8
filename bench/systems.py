"""The generators compared on static batches, behind one interface, and the openvino pieces.

Each runner generates exactly ``new`` tokens for every prompt of a batch and returns what each
produced, so no system is credited for stopping early: the end token is a bad word for the
torch engine, ``min_new_tokens`` for transformers; the openvino backend refuses bad words, so
it is sent an ``end_id`` that stands in for the end token (the vocabulary's last id), and a
request that meets the stand-in ends short where the bench sees it.
"""

from __future__ import annotations

import gc
import time
import warnings
from pathlib import Path
from typing import Any, Protocol

import torch

import engine
from bench.load import Pending
from bench.settings import SAMPLED
from contract.model_tokens import end_ids
from contract.options import SamplingParams
from engine import GenerationRequest, ModelShape, TorchEngine, in_passing_thread, load_model
from reporting.machine import bf16_native

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.float32}
OPENVINO_DTYPES = tuple(engine.PRECISIONS)  # float32, bfloat16: what compile_properties takes


def served_dtype(flags: list[str] | None = None) -> str:
    """The openvino backend's dtype in this run: bfloat16 where native, else float32."""
    return "bfloat16" if bf16_native(flags) else "float32"


def stand_in_end_id(vocab_size: int, eos_token_id: int) -> int:
    """The last id of the vocabulary (the one before it when that is the end token)."""
    if vocab_size < 2:
        raise ValueError(f"a vocabulary of {vocab_size} has no stand-in for the end token")
    last = vocab_size - 1
    return last - 1 if last == eos_token_id else last


def start_backend(
    checkpoint: Path,
    dtype: str,
    max_batch_size: int,
    max_prefill_tokens: int,
    prefix_caching: bool = True,
    max_cache_tokens: int = 0,
) -> Any:
    """The project's OpenVINOBackend on ``checkpoint``'s export, started (0 cache tokens: a
    full context per row, as the served config's 0 means)."""
    return engine.OpenVINOBackend(
        engine.require_export(checkpoint),
        ModelShape.read(checkpoint),
        dtype=dtype,
        max_batch_size=max_batch_size,
        max_prefill_tokens=max(max_prefill_tokens, max_batch_size),
        prefix_caching=prefix_caching,
        max_cache_tokens=max_cache_tokens or None,
    ).start()


class PipelineGenerate:
    """OpenVINO GenAI's own ``ContinuousBatchingPipeline.generate`` on a batch, scheduled as
    the backend schedules it (``batch`` sequences, a full context each, 4,096-token prefill
    steps), without this project's backend or server around it."""

    def __init__(self, checkpoint: Path, dtype: str, max_batch_size: int) -> None:
        import openvino_genai

        shape = ModelShape.read(checkpoint)
        scheduler = openvino_genai.SchedulerConfig()
        scheduler.num_kv_blocks = -(-max_batch_size * shape.context // engine.BLOCK_SIZE)
        scheduler.max_num_seqs = max_batch_size
        scheduler.max_num_batched_tokens = max(4096, max_batch_size)
        scheduler.dynamic_split_fuse = True
        scheduler.enable_prefix_caching = False
        export, properties = engine.require_export(checkpoint), engine.compile_properties(dtype)
        pipeline = openvino_genai.ContinuousBatchingPipeline
        self.pipe = pipeline(str(export), scheduler, "CPU", properties)
        self.eos = shape.eos_token_id

    def generate_ids(
        self, prompts: list[list[int]], new: int, sampled: bool, seed: int
    ) -> list[list[int]]:
        """``min_new_tokens`` keeps every row to the length asked for."""
        import numpy as np
        import openvino
        import openvino_genai

        options = {"max_new_tokens": new, "min_new_tokens": new, "eos_token_id": self.eos}
        configs = [
            openvino_genai.GenerationConfig(
                **options,
                **({"do_sample": True, "rng_seed": seed + i, **SAMPLED} if sampled else {}),
            )
            for i in range(len(prompts))
        ]
        tensors = [openvino.Tensor(np.array([p], dtype=np.int64)) for p in prompts]
        return [list(r.m_generation_ids[0]) for r in self.pipe.generate(tensors, configs)]

    def close(self) -> None:
        """Free the pipeline (its KV cache) now rather than when the object is collected."""
        self.pipe = None

    def rate_over(
        self, prompts: list[list[int]], new: int, sampled: bool, seed: int, seconds: float
    ) -> float:
        """Tokens/s over batches run back to back until ``seconds`` have passed (one batch of
        16 x 128 takes a quarter of a second: alone, it swung by half between runs)."""
        self.generate_ids(prompts[:2], 2, sampled, seed)
        made, started = 0, time.perf_counter()
        while True:
            made += sum(len(ids) for ids in self.generate_ids(prompts, new, sampled, seed))
            if (elapsed := time.perf_counter() - started) >= seconds:
                return made / elapsed


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
        self.engine = TorchEngine(model, max_batch_size=max_batch_size, max_prefill_tokens=prefill)
        self.engine.start()
        quantized = ", quantize=int8" if kwargs else ""
        self.detail = f"load_model(dtype={dtype}{quantized}): {type(model).__name__}"

    def generate_ids(
        self, prompts: list[list[int]], new: int, sampled: bool, seed: int
    ) -> list[list[int]]:
        pending = [Pending() for _ in prompts]
        for i, (prompt, listener) in enumerate(zip(prompts, pending, strict=True)):
            sampling = SamplingParams(**SAMPLED, seed=seed + i) if sampled else SamplingParams()
            self.engine.submit(self.request(prompt, new, sampling), listener)
        return [list(listener.wait().output_ids) for listener in pending]

    def request(self, prompt: list[int], new: int, sampling: SamplingParams) -> GenerationRequest:
        return GenerationRequest(list(prompt), new, sampling=sampling, bad_words=self.bad)

    def close(self) -> None:
        self.engine.stop()
        del self.engine
        gc.collect()


class OpenVINORunner(EngineRunner):
    """The project's openvino backend, the whole batch at once like the engine; the end token
    kept out by a stand-in end id (bench/systems.py)."""

    system = "openvino"

    def __init__(
        self, checkpoint: Path, dtype: str, device: str, max_batch_size: int, prompt_tokens: int
    ) -> None:
        # no super().__init__(): it loads the torch model
        shape = ModelShape.read(checkpoint)
        self.end_id = stand_in_end_id(shape.vocab_size, shape.eos_token_id)
        self.engine = start_backend(
            checkpoint,
            dtype,
            max_batch_size,
            max(4096, max_batch_size * prompt_tokens),
            prefix_caching=False,  # static batches of random prompts share no prefix
        )
        self.detail = f"OpenVINOBackend(dtype={dtype}), end_id={self.end_id} stands in"

    def request(self, prompt: list[int], new: int, sampling: SamplingParams) -> GenerationRequest:
        return GenerationRequest(
            list(prompt), new, sampling=sampling, end_id=self.end_id, return_log_probs=False
        )


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
