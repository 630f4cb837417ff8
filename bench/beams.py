"""Section ``beams``: beam search at widths 1, 4 and 8 in the engine (all prompts at once) and
in transformers' ``generate(num_beams=width)`` (one static batch of equal-length prompts), every
end token banned: tokens/s of the best beams and of every beam, the engine's peak KV cache, and
whether both systems' best beams agree.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from bench.load import Pending
from bench.models import ModelInfo, random_prompts
from bench.settings import Plan, Progress
from contract.options import BeamParams
from engine import GenerationRequest, GenerationResult, TorchEngine, in_passing_thread, load_model

Beams = tuple[list[list[int]], float]  # every prompt's best beam, seconds for them all


class _PeakCache:
    """An engine observer that remembers the most KV-cache memory a step held."""

    def __init__(self) -> None:
        self.engine: TorchEngine | None = None
        self.peak = 0

    def on_step(self, rows: int, new_tokens: int, prompt_tokens: int, seconds: float) -> None:
        self.peak = max(self.peak, self.engine.cache_bytes if self.engine else 0)

    def on_finish(self, result: GenerationResult) -> None:
        pass


def _engine_beams(
    engine: TorchEngine, prompts: list[list[int]], new: int, width: int, ends: tuple[int, ...]
) -> Beams:
    started, pending = time.perf_counter(), [Pending() for _ in prompts]
    for prompt, listener in zip(prompts, pending, strict=True):
        engine.submit(
            GenerationRequest(
                list(prompt), new, bad_words=[[end] for end in ends], beam=BeamParams(width)
            ),
            listener,
        )
    best = [listener.wait().output_ids for listener in pending]  # wait() raises a failure
    return best, time.perf_counter() - started


def _transformers_beams(
    model: Any, prompts: list[list[int]], new: int, width: int, ends: tuple[int, ...], device: str
) -> Beams:
    batch, started = torch.tensor(prompts, device=device), time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            batch,
            attention_mask=torch.ones_like(batch),
            max_new_tokens=new,
            min_new_tokens=new,
            num_beams=width,
            do_sample=False,
            length_penalty=0.0,
            suppress_tokens=list(ends),
            renormalize_logits=True,  # bans before normalising, as the engine
            pad_token_id=ends[0],
        )
    return [row[len(prompts[0]) :].tolist() for row in out], time.perf_counter() - started


def _transformers_widths(
    model: ModelInfo, plan: Plan, prompts: list[list[int]], progress: Progress
) -> dict[int, Beams]:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(model.path), dtype=torch.float32)
    hf, found = hf.to(plan.device).eval(), {}
    for width in plan.beam_widths:
        progress(f"beams: transformers, width {width}")
        _transformers_beams(hf, prompts[:1], 2, width, model.banned, plan.device)  # warm-up
        found[width] = _transformers_beams(
            hf, prompts, plan.beam_tokens, width, model.banned, plan.device
        )
    return found


def run_beams(plan: Plan, model: ModelInfo, progress: Progress) -> list[dict[str, Any]]:
    """One row per width: tokens/s of both systems, their ratio, peak KV cache, agreement."""
    prompts = random_prompts(
        plan.beam_prompts, plan.beam_prompt_tokens, model.vocab_size, model.banned, plan.seed
    )
    ends, new, observer = model.banned, plan.beam_tokens, _PeakCache()
    weights = in_passing_thread(lambda: load_model(model.path, device=plan.device))
    batch = max(plan.beam_widths) * len(prompts)
    engine = TorchEngine(weights, max_batch_size=batch, observer=observer)
    observer.engine = engine.start()
    ours: dict[int, tuple[Beams, float]] = {}  # width: (best beams, seconds), peak bytes
    try:  # the engine alone first, then transformers alone: never two OpenMP pools at once
        for width in plan.beam_widths:
            progress(f"beams: engine, width {width}, {len(prompts)} prompts x {new} tokens")
            _engine_beams(engine, prompts[:1], 2, width, ends)  # warm-up
            observer.peak = 0
            ours[width] = (_engine_beams(engine, prompts, new, width, ends), observer.peak)
    finally:
        engine.stop()
    theirs = in_passing_thread(lambda: _transformers_widths(model, plan, prompts, progress))
    best = len(prompts) * new
    return [
        {
            "width": width,
            "prompts": len(prompts),
            "new_tokens": new,
            "engine_tokens_per_s": best / ours_s,
            "engine_beam_tokens_per_s": width * best / ours_s,
            "transformers_tokens_per_s": best / theirs[width][1],
            "engine_over_transformers": theirs[width][1] / ours_s,
            "kv_cache_peak_mib": peak / 2**20,
            "best_beams_agree": sum(
                a == b for a, b in zip(ours_ids, theirs[width][0], strict=True)
            ),
        }
        for width, ((ours_ids, ours_s), peak) in ours.items()
    ]
