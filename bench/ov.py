"""The openvino backend as a benchmarked system: its dtype, its end token, its own pipeline.

The backend refuses ``bad_words_list`` (OpenVINO GenAI has no banned-token list), which is how
the bench makes the torch engine generate every token asked for. The openvino backend is sent
instead an ``end_id`` that stands in for the end token: an id inside the vocabulary (the last
one, the rarest merge of a byte-level BPE) other than the model's, so the real end token is an
ordinary token and generation stops only at the length asked for. Should the model produce the
stand-in, the request ends early and the bench sees it (kernels fail the cell, traffic reports
the short requests). It changes no cost per token.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.settings import SAMPLED
from engine import PRECISIONS, ModelShape
from reporting.machine import bf16_native

OPENVINO_DTYPES = tuple(PRECISIONS)  # float32, bfloat16: what compile_properties takes


def served_dtype(flags: list[str] | None = None) -> str:
    """The openvino backend's dtype in this run: bfloat16 where native, else float32."""
    return "bfloat16" if bf16_native(flags) else "float32"


def stand_in_end_id(vocab_size: int, eos_token_id: int) -> int:
    """The last id of the vocabulary (the one before it when that is the end token)."""
    if vocab_size < 2:
        raise ValueError(f"a vocabulary of {vocab_size} has no stand-in for the end token")
    last = vocab_size - 1
    return last - 1 if last == eos_token_id else last


def start_backend(checkpoint: Path, dtype: str, max_batch_size: int,
                  max_prefill_tokens: int = 4096, prefix_caching: bool = True,
                  max_cache_tokens: int | None = None) -> Any:  # fmt: skip
    """The project's OpenVINOBackend on ``checkpoint``'s export, started (0 or None cache
    tokens: a full context per row, as the served config's 0 means)."""
    from engine import OpenVINOBackend, require_export

    return OpenVINOBackend(
        require_export(checkpoint), ModelShape.read(checkpoint), dtype=dtype,
        max_batch_size=max_batch_size, max_prefill_tokens=max(max_prefill_tokens, max_batch_size),
        prefix_caching=prefix_caching, max_cache_tokens=max_cache_tokens or None,
    ).start()  # fmt: skip


class PipelineGenerate:
    """OpenVINO GenAI's own ``ContinuousBatchingPipeline.generate`` on a batch, scheduled as
    the backend schedules it (``batch`` sequences, a full context each, 4,096-token prefill
    steps), without this project's backend or server around it."""

    def __init__(self, checkpoint: Path, dtype: str, max_batch_size: int) -> None:
        import openvino_genai

        from engine import BLOCK_SIZE, compile_properties, require_export

        shape = ModelShape.read(checkpoint)
        scheduler = openvino_genai.SchedulerConfig()
        scheduler.num_kv_blocks = -(-max_batch_size * shape.context // BLOCK_SIZE)
        scheduler.max_num_seqs = max_batch_size
        scheduler.max_num_batched_tokens = max(4096, max_batch_size)
        scheduler.dynamic_split_fuse = True
        scheduler.enable_prefix_caching = False
        self.pipe = openvino_genai.ContinuousBatchingPipeline(
            str(require_export(checkpoint)), scheduler, "CPU", compile_properties(dtype)
        )
        self.eos = shape.eos_token_id

    def generate_ids(
        self, prompts: list[list[int]], new: int, sampled: bool, seed: int
    ) -> list[list[int]]:
        """``min_new_tokens`` keeps every row to the length asked for."""
        import numpy as np
        import openvino
        import openvino_genai

        configs = []
        for i in range(len(prompts)):
            config = openvino_genai.GenerationConfig()
            config.max_new_tokens = config.min_new_tokens = new
            config.set_eos_token_id(self.eos)
            if sampled:
                config.do_sample, config.rng_seed = True, seed + i
                config.top_k, config.top_p = SAMPLED["top_k"], SAMPLED["top_p"]
                config.temperature = SAMPLED["temperature"]
            configs.append(config)
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
