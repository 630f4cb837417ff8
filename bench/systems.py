"""The generators compared on static batches, behind one small interface.

Each runner takes a batch of equal-length prompts (token ids), generates exactly ``new`` tokens
for every one (the end token is banned: a bad word for the torch engine, a stand-in end id for
the openvino backend (bench/ov.py), ``min_new_tokens`` for transformers, ``min_length`` for
CTranslate2) and returns how many each produced, so a comparison never credits a system for
stopping early.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import warnings
from pathlib import Path
from typing import Protocol

import torch

from bench.load import Pending
from bench.ov import OPENVINO_DTYPES, stand_in_end_id, start_backend
from bench.settings import SAMPLED
from contract.model_tokens import end_ids
from contract.options import SamplingParams
from engine import GenerationRequest, TorchEngine, in_passing_thread, load_model

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.float32}


class Runner(Protocol):
    system: str
    detail: str  # how this system runs the dtype, for the tables

    def generate_ids(
        self, prompts: list[list[int]], new: int, sampled: bool, seed: int
    ) -> list[list[int]]:
        """Generate ``new`` tokens per prompt; the tokens each really produced, in order."""
        ...

    def close(self) -> None: ...


def generate(
    runner: Runner, prompts: list[list[int]], new: int, sampled: bool, seed: int
) -> list[int]:
    """How many tokens each prompt got (what the timing loop checks)."""
    return [len(ids) for ids in runner.generate_ids(prompts, new, sampled, seed)]


def checkpoint_end_ids(checkpoint: Path, fallback: int | None) -> list[int]:
    """Every id that ends the checkpoint's generation (a model may have several, and the
    server stops at each), else ``fallback``: the ids a runner bans."""
    return end_ids(checkpoint) or ([fallback] if fallback is not None else [])


def ct2_compute_types(device: str) -> set[str]:
    """What CTranslate2 computes in on this device (empty when it is not installed)."""
    try:
        import ctranslate2
    except ImportError:
        return set()
    try:
        return set(ctranslate2.get_supported_compute_types("cuda" if "cuda" in device else "cpu"))
    except (RuntimeError, ValueError):
        return set()


def unsupported(system: str, dtype: str, device: str) -> str | None:
    """Why ``system`` cannot run ``dtype`` on ``device`` here, or None when it can."""
    if system == "openvino":
        if not device.startswith("cpu"):
            return "not supported (the openvino backend runs on the CPU only here)"
        if dtype not in OPENVINO_DTYPES:
            return f"not supported (the openvino backend computes in {', '.join(OPENVINO_DTYPES)})"
    if system == "transformers" and dtype == "int8":
        if device != "cpu":
            return "not supported (torch dynamic int8 quantization is CPU-only)"
        if not hasattr(torch.ao.quantization, "quantize_dynamic"):
            return "not supported (this torch has no quantize_dynamic)"
    if system == "ct2" and importlib.util.find_spec("ctranslate2") is None:
        return (
            "not run: CTranslate2 is not installed (pip install ctranslate2, or "
            "`make setup-dev`, which installs the project's dev extras)"
        )
    if system == "ct2" and dtype not in ct2_compute_types(device):
        return f"not supported (CTranslate2 has no {dtype} on this {device.split(':')[0]})"
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
        self.banned = checkpoint_end_ids(checkpoint, model.config.eos_token_id)
        self.engine = TorchEngine(
            model,
            max_batch_size=max_batch_size,
            max_prefill_tokens=max(4096, max_batch_size * prompt_tokens),
        ).start()
        self.detail = (
            f"load_model(dtype={dtype}{', quantize=int8' if kwargs else ''}): "
            f"{type(model).__name__}"
        )

    def generate_ids(
        self, prompts: list[list[int]], new: int, sampled: bool, seed: int
    ) -> list[list[int]]:
        pending = [Pending() for _ in prompts]
        for i, (prompt, listener) in enumerate(zip(prompts, pending, strict=True)):
            self.engine.submit(self.request(prompt, new, sampled, seed + i), listener)
        return [list(listener.wait().output_ids) for listener in pending]

    def request(self, prompt: list[int], new: int, sampled: bool, seed: int) -> GenerationRequest:
        bad = [[end] for end in self.banned]
        return GenerationRequest(
            list(prompt), new, sampling=engine_sampling(sampled, seed), bad_words=bad
        )

    def close(self) -> None:
        self.engine.stop()
        del self.engine
        gc.collect()


class OpenVINORunner(EngineRunner):
    """The project's openvino backend (engine/openvino_backend.py), the whole batch submitted
    at once, like the engine; the end token kept out by a stand-in end id (bench/ov.py)."""

    system = "openvino"

    def __init__(  # no super().__init__(): that would load the torch model
        self, checkpoint: Path, dtype: str, device: str, max_batch_size: int, prompt_tokens: int
    ) -> None:
        from engine import ModelShape

        shape = ModelShape.read(checkpoint)
        self.end_id = stand_in_end_id(shape.vocab_size, shape.eos_token_id)
        self.banned = []  # no bad words: the backend refuses them
        self.engine = start_backend(
            checkpoint, dtype, max_batch_size, max(4096, max_batch_size * prompt_tokens),
            prefix_caching=False,  # static batches of random prompts share no prefix
        )  # fmt: skip
        self.detail = f"OpenVINOBackend(dtype={dtype}), end_id={self.end_id} stands in"

    def request(self, prompt: list[int], new: int, sampled: bool, seed: int) -> GenerationRequest:
        return GenerationRequest(
            list(prompt), new, sampling=engine_sampling(sampled, seed), end_id=self.end_id,
            return_log_probs=False,
        )  # fmt: skip


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
        model = model.to(device).eval()
        name = type(model).__name__
        self.detail = f"{name}.generate, {dtype}"
        if dtype == "int8":
            with warnings.catch_warnings():  # torch's own deprecation notice for qint8 tensors
                warnings.simplefilter("ignore", UserWarning)
                model = torch.ao.quantization.quantize_dynamic(
                    model, {torch.nn.Linear}, dtype=torch.qint8
                )
            self.detail = f"{name}.generate, torch dynamic int8 (nn.Linear)"
        self.model = model
        self.device = device
        # min_new_tokens keeps every end id of the generation config out; the first pads
        self.pad_id = (checkpoint_end_ids(checkpoint, None) or [0])[0]

    def generate_ids(
        self, prompts: list[list[int]], new: int, sampled: bool, seed: int
    ) -> list[list[int]]:
        ids = torch.tensor(prompts, device=self.device)
        options = (
            {"do_sample": True, **SAMPLED}
            if sampled
            else {"do_sample": False, "top_k": None, "top_p": None, "temperature": None}
        )
        torch.manual_seed(seed)
        with torch.inference_mode():
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new,
                min_new_tokens=new,
                pad_token_id=self.pad_id,
                **options,
            )
        return out[:, ids.shape[1] :].tolist()

    def close(self) -> None:
        del self.model
        gc.collect()


class CT2Runner:
    """CTranslate2's ``Generator.generate_batch`` on a conversion of the same checkpoint."""

    system = "ct2"

    def __init__(self, converted: Path, dtype: str, device: str) -> None:
        import ctranslate2

        threads = torch.get_num_threads()
        self.generator = ctranslate2.Generator(
            str(converted),
            device="cuda" if "cuda" in device else "cpu",
            compute_type=dtype,
            inter_threads=1,
            intra_threads=threads if device == "cpu" else 0,
        )
        self.vocabulary = json.loads((converted / "vocabulary.json").read_text())
        self.detail = f"Generator.generate_batch, compute_type={dtype}"

    def generate_ids(
        self, prompts: list[list[int]], new: int, sampled: bool, seed: int
    ) -> list[list[int]]:
        import ctranslate2

        ctranslate2.set_random_seed(seed)
        tokens = [[self.vocabulary[t] for t in prompt] for prompt in prompts]
        options = (
            {
                "sampling_topk": SAMPLED["top_k"],
                "sampling_topp": SAMPLED["top_p"],
                "sampling_temperature": SAMPLED["temperature"],
            }
            if sampled
            else {"sampling_topk": 1}
        )
        results = self.generator.generate_batch(
            tokens,
            max_length=new,
            min_length=new,
            include_prompt_in_result=False,
            **options,
        )
        return [list(r.sequences_ids[0]) for r in results]

    def close(self) -> None:
        del self.generator
        gc.collect()
